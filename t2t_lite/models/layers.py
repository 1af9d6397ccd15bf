"""Building blocks: dense, layer norm, embeddings, attention, dropout from explicit seeds.

Weights are float32 tf.Variables; `compute_dtype` (bfloat16/float16 under mixed precision)
is applied at use. Dropout draws from stateless RNG seeded by (run seed, micro-step, site),
so a resumed run draws exactly the masks an uninterrupted run would.
"""

from __future__ import annotations

import math

import numpy as np
import tensorflow as tf


class SeedStream:
  """Distinct stateless seeds for each dropout site of one forward pass, and the pass's
  residual dropout rate when it changes during training (`residual_rate`, a scalar tensor;
  None: the hparams' layer_prepostprocess_dropout, see t2t_lite.optimize.residual_dropout)."""

  def __init__(self, seed, residual_rate=None):
    self._seed = None if seed is None else tf.cast(seed, tf.int64)
    self._site = 0
    self.residual_rate = residual_rate

  @property
  def seeded(self) -> bool:
    return self._seed is not None

  def next(self):
    # Folding the site into the (seed, micro-step) pair keeps every (micro-step, site)
    # distinct however long the run.
    self._site += 1
    return tf.random.experimental.stateless_fold_in(self._seed, self._site)


def residual_rate(default: float, seeds: SeedStream | None):
  """The residual (and embedding) dropout rate of a pass: its SeedStream's, else `default`."""
  if seeds is None or seeds.residual_rate is None:
    return default
  return seeds.residual_rate


def is_tensor(value) -> bool:
  """A rate or scale that is a tensor (it varies by update) rather than a Python number."""
  return isinstance(value, (tf.Tensor, tf.Variable))


def is_one(scale) -> bool:
  return not is_tensor(scale) and scale == 1.0


def _active(rate, seeds: SeedStream | None) -> bool:
  # A tensor rate may be 0 (the dropout ramp's first updates): dropout decides as it runs.
  return seeds is not None and seeds.seeded and (is_tensor(rate) or rate > 0.0)


def _threshold(rate):
  """The 16-bit threshold below which an element is dropped: a Python int, or an int32
  tensor for a tensor rate (the same value for the same rate)."""
  if is_tensor(rate):
    return tf.cast(tf.minimum(tf.round(tf.cast(rate, tf.float32) * 65536.0), 65535.0), tf.int32)
  return min(int(round(rate * 65536)), 65535)


def keep_scale(rate, seeds: SeedStream | None):
  """1 / keep probability of dropout at `rate` (1.0 when dropout is off); a float32 tensor
  for a tensor rate."""
  if not _active(rate, seeds):
    return 1.0
  if is_tensor(rate):
    return 65536.0 / (65536.0 - tf.cast(_threshold(rate), tf.float32))
  # In float32, as for a tensor rate: the product of two scales (see Dense) is then the
  # same number whether the rates are Python numbers or tensors.
  return float(np.float32(65536.0) / np.float32(65536 - _threshold(rate)))


def dropout(x, rate, seeds: SeedStream | None, scaled: bool = True,
            relu: bool = False):
  """Inverted dropout: zeroes each element with probability `rate` (to 1 / 65536), scales the
  rest by 1 / keep probability. With `scaled=False` the rest is left as it is and the caller
  applies keep_scale(rate, seeds) where it is cheaper: to the weights of the linear layer
  the result meets (one pass over each activation and its gradient fewer). `relu=True`
  gives dropout(relu(x)), the two masks applied as one (one pass fewer each way).

  Each random 64-bit word gives the masks of four elements (its 16-bit quarters). The
  backward pass keeps only the boolean mask (1 byte per element) and applies it the same way.
  """
  if not _active(rate, seeds):
    return tf.nn.relu(x) if relu else x
  with tf.name_scope("dropout"):
    scale, seed = keep_scale(rate, seeds) if scaled else 1.0, seeds.next()
    if not is_tensor(rate):
      return _dropout(x, rate, seed, scale, relu)
    # A rate of 0 draws no masks (they would keep everything: the same result, exactly).
    return tf.cond(_threshold(rate) > 0, lambda: _dropout(x, rate, seed, scale, relu),
                   lambda: tf.nn.relu(x) if relu else tf.identity(x))


def _dropout(x, rate, seed, scale, relu):
  size = tf.size(x)
  # Philox named, not left to auto-selection: XLA would pick another generator, and a run
  # with --xla_compile would draw other masks than the same run without it.
  words = tf.random.stateless_uniform([(size + 3) // 4], seed, minval=None,
                                      maxval=None, dtype=tf.int64, alg="philox")
  quarters = tf.reshape(tf.bitcast(words, tf.uint16), [-1])[:size]
  threshold = _threshold(rate)
  threshold = (tf.cast(threshold, tf.uint16) if is_tensor(threshold)
               else tf.constant(threshold, tf.uint16))
  keep = tf.reshape(quarters >= threshold, tf.shape(x))
  if relu:
    keep = tf.logical_and(keep, x > tf.zeros([], x.dtype))

  def apply(t):
    t = tf.where(keep, t, tf.zeros([], t.dtype))
    return t if is_one(scale) else t * tf.cast(scale, t.dtype)

  @tf.custom_gradient
  def masked(x):
    return apply(x), apply

  return masked(x)


class Initializer:
  """Deterministic Glorot-uniform initial values from one integer seed."""

  def __init__(self, seed: int):
    self._seed = seed
    self._count = 0

  def glorot(self, shape):
    self._count += 1
    limit = math.sqrt(6.0 / (shape[0] + shape[-1]))
    return tf.random.stateless_uniform(shape, [self._seed, self._count], -limit, limit)

  def normal(self, shape, stddev):
    self._count += 1
    return tf.random.stateless_normal(shape, [self._seed, self._count], stddev=stddev)


def row_sum(t):
  """The sum of t [..., D] over all but its last axis, [D]: as a product with a vector of
  ones, which a CPU computes several times faster than a reduction across rows."""
  flat = tf.reshape(t, [-1, tf.shape(t)[-1]])
  return tf.linalg.matvec(flat, tf.ones(tf.shape(flat)[:1], t.dtype), transpose_a=True)


@tf.custom_gradient
def add_bias(y, bias):
  """y [M, N] + bias [N], the bias's gradient summed by row_sum."""
  return y + bias, lambda dy: (dy, row_sum(dy))


class Dense(tf.Module):
  def __init__(self, init: Initializer, in_dim: int, out_dim: int, use_bias: bool, name: str):
    super().__init__(name=name)
    self.kernel = tf.Variable(init.glorot([in_dim, out_dim]), name="kernel")
    self.bias = tf.Variable(tf.zeros([out_dim]), name="bias") if use_bias else None

  def __call__(self, x, scale=1.0, input_scale=1.0):
    """scale * ((input_scale * x) W + b), with both factors applied to W and b (dropouts'
    keep scales: of this layer's output and of its input), not to x or x W. Either factor
    may be a float32 tensor."""
    shape = tf.shape(x)
    kernel = tf.cast(self.kernel, x.dtype)
    if not (is_one(scale) and is_one(input_scale)):
      kernel = kernel * tf.cast(scale * input_scale, x.dtype)
    y = tf.matmul(tf.reshape(x, [-1, shape[-1]]), kernel)
    if self.bias is not None:
      bias = tf.cast(self.bias, x.dtype)
      y = add_bias(y, bias if is_one(scale) else bias * tf.cast(scale, x.dtype))
    return tf.reshape(y, tf.concat([shape[:-1], [self.kernel.shape[1]]], 0))


class LayerNorm(tf.Module):
  """Layer normalization computed in float32, with its gradient written out: the backward
  pass keeps only the normalized input and 1 / standard deviation, and needs no reduction
  over the batch beyond the two for the scale and bias."""

  def __init__(self, dim: int, epsilon: float, name: str):
    super().__init__(name=name)
    self.scale = tf.Variable(tf.ones([dim]), name="scale")
    self.bias = tf.Variable(tf.zeros([dim]), name="bias")
    self.epsilon = epsilon

  def __call__(self, x):
    with tf.name_scope("layer_norm"):
      return self._normalize(x, self.scale, self.bias)

  @tf.custom_gradient
  def _normalize(self, x, scale, bias):
    x32 = tf.cast(x, tf.float32)
    mean, variance = tf.nn.moments(x32, axes=[-1], keepdims=True)
    inverse = tf.math.rsqrt(variance + self.epsilon)
    normalized = (x32 - mean) * inverse
    y = tf.cast(normalized * scale + bias, x.dtype)

    def grad(dy):
      dy = tf.cast(dy, tf.float32)
      d_normalized = dy * scale
      dx = inverse * (d_normalized - tf.reduce_mean(d_normalized, -1, keepdims=True) -
                      normalized * tf.reduce_mean(d_normalized * normalized, -1, keepdims=True))
      return tf.cast(dx, x.dtype), row_sum(dy * normalized), row_sum(dy)

    return y, grad


def timing_signal(positions, channels: int, min_timescale=1.0, max_timescale=1.0e4):
  """tensor2tensor's sinusoids: [sin, cos] over geometric timescales; positions: int [T]."""
  num_timescales = channels // 2
  log_increment = math.log(max_timescale / min_timescale) / max(num_timescales - 1, 1)
  inv_timescales = min_timescale * tf.exp(
      tf.range(num_timescales, dtype=tf.float32) * -log_increment)
  scaled = tf.cast(positions, tf.float32)[:, None] * inv_timescales[None, :]
  signal = tf.concat([tf.sin(scaled), tf.cos(scaled)], axis=1)
  return tf.pad(signal, [[0, 0], [0, channels % 2]])


def split_heads(x, num_heads: int):
  """[B, T, D] -> [B, H, T, D/H]."""
  shape = tf.shape(x)
  x = tf.reshape(x, [shape[0], shape[1], num_heads, x.shape[-1] // num_heads])
  return tf.transpose(x, [0, 2, 1, 3])


def split_parts_and_heads(x, parts: int, num_heads: int):
  """[B, T, parts * D] -> `parts` tensors [B, H, T, D/H] (e.g. the queries, keys and values
  of one fused projection): one transpose, then slices along its first axis (which
  TensorFlow hands out without copying when their size is aligned), in place of a split
  and a transpose per part."""
  shape = tf.shape(x)
  depth = x.shape[-1] // (parts * num_heads)
  x = tf.reshape(x, [shape[0], shape[1], parts, num_heads, depth])
  return tf.unstack(tf.transpose(x, [2, 0, 3, 1, 4]), parts)


def merge_heads(x, hidden: int):
  """[B, H, T, d] -> [B, T, hidden = H*d]."""
  x = tf.transpose(x, [0, 2, 1, 3])
  shape = tf.shape(x)
  return tf.reshape(x, [shape[0], shape[1], hidden])


class Attention(tf.Module):
  """Multi-head dot-product attention without biases, as tensor2tensor's."""

  def __init__(self, init: Initializer, hidden: int, num_heads: int, self_attention: bool,
               name: str):
    super().__init__(name=name)
    self.num_heads = num_heads
    self.hidden = hidden
    self.self_attention = self_attention
    if self_attention:
      self.qkv = Dense(init, hidden, 3 * hidden, False, "qkv")
    else:
      self.q = Dense(init, hidden, hidden, False, "q")
      self.kv = Dense(init, hidden, 2 * hidden, False, "kv")
    self.output = Dense(init, hidden, hidden, False, "output")

  def memory_kv(self, memory):
    """Keys and values of the encoder output, [B, H, S, d] each (computed once per decode)."""
    return split_parts_and_heads(self.kv(memory), 2, self.num_heads)

  def __call__(self, x, bias, rate: float = 0.0, seeds=None, memory=None, cache=None,
               scale=1.0):
    """x: [B, T, D]; bias: broadcastable to [B, H, T, S] (float32, -1e9 where masked);
    the output is multiplied by `scale` (see Dense).

    cache, self-attention (incremental decoding, T = 1): {"k", "v"}: buffers [max_length, B,
    H, d] of every step's keys and values, "position": this step, written in place there,
    "index": [B, H, steps] rows of the buffers (seen as [max_length * B * H, d]) to attend to;
    the updated {"k", "v"} are returned. Encoder-decoder attention: cache may hold the
    {"k", "v"} [B', H, S, d] of `memory`; with B = beams * B', each row's beams are folded
    into the query dimension, so the memory is read once per sentence, not once per beam.
    """
    new_cache = None
    shape = tf.shape(x)
    if self.self_attention and cache is None:
      q, k, v = split_parts_and_heads(self.qkv(x), 3, self.num_heads)
    elif self.self_attention:  # one decoding step: k, v go into the cache's buffers
      q, k, v = tf.split(self.qkv(x), 3, axis=-1)
      q = split_heads(q, self.num_heads)
      k, v, new_cache = self._cached_keys(k, v, cache)
    elif cache is not None:
      k, v = cache["k"], cache["v"]
      x = tf.reshape(x, [tf.shape(k)[0], -1, self.hidden])  # [B', beams * T, D]
      q = split_heads(self.q(x), self.num_heads)
    else:
      q = split_heads(self.q(x), self.num_heads)
      k, v = self.memory_kv(memory)
    depth = self.hidden // self.num_heads
    logits = tf.matmul(q * tf.cast(depth ** -0.5, q.dtype), k, transpose_b=True)
    with tf.name_scope("softmax"):
      weights = tf.nn.softmax(tf.cast(logits, tf.float32) + bias)
    weights = dropout(tf.cast(weights, x.dtype), rate, seeds, scaled=False)
    y = self.output(merge_heads(tf.matmul(weights, v), self.hidden), scale,
                    keep_scale(rate, seeds))
    return tf.reshape(y, shape), new_cache

  def _cached_keys(self, k, v, cache):
    """Writes this step's k, v [B, 1, D] into the buffers; gathers the attended ones."""
    depth = self.hidden // self.num_heads
    rows = tf.shape(k)[0]
    buffers = {}
    for name, new in (("k", k), ("v", v)):
      # InplaceUpdate reuses the buffer when nothing else holds it (every step but the first).
      buffers[name] = tf.raw_ops.InplaceUpdate(
          x=cache[name], i=cache["position"][None],
          v=tf.reshape(new, [1, rows, self.num_heads, depth]))
    flat = lambda t: tf.reshape(t, [-1, depth])  # noqa: E731
    return (tf.gather(flat(buffers["k"]), cache["index"]),
            tf.gather(flat(buffers["v"]), cache["index"]), buffers)


class FeedForward(tf.Module):
  def __init__(self, init: Initializer, hidden: int, filter_size: int, name: str):
    super().__init__(name=name)
    self.inner = Dense(init, hidden, filter_size, True, "inner")
    self.outer = Dense(init, filter_size, hidden, True, "outer")

  def __call__(self, x, rate: float = 0.0, seeds=None, scale=1.0):
    """The output is multiplied by `scale` (see Dense)."""
    return self.outer(dropout(self.inner(x), rate, seeds, scaled=False, relu=True), scale,
                      keep_scale(rate, seeds))
