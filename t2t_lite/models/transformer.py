"""The Transformer encoder-decoder of tensor2tensor (Vaswani et al., 2017).

Pre-norm (tensor2tensor's default, preprocess "n", postprocess "da"): each sublayer is
x + dropout(sublayer(layer_norm(x))), and each stack ends in a layer norm. Post-norm (the
paper's, preprocess "none", postprocess "dan"): layer_norm(x + dropout(sublayer(x))), no
norm at the end of the stacks. Embeddings are scaled by
sqrt(hidden) and, with a joint vocabulary, shared by source, target and softmax.
Target id 0 (padding) doubles as the decoder's start symbol, as in tensor2tensor.
"""

from __future__ import annotations

import os

import tensorflow as tf

from t2t_lite.core.hparams_check import frozen_parts, norm_placement
from t2t_lite.models.layers import (Attention, Dense, FeedForward, Initializer, LayerNorm,
                                    SeedStream, dropout, keep_scale, residual_rate, timing_signal)

NEG_INF = -1e9


# oneDNN's instruction-set ceilings (ONEDNN_MAX_CPU_ISA) below AVX512_CORE_BF16: under them
# its kernels have no bfloat16 dot products (and some bfloat16 matmuls none at all).
_ISA_CEILINGS_WITHOUT_BFLOAT16 = frozenset(
    ("SSE41", "AVX", "AVX2", "AVX2_VNNI", "AVX2_VNNI_2", "AVX512_CORE", "AVX512_CORE_VNNI"))


def cpu_has_fast_bfloat16(cpuinfo: str = "/proc/cpuinfo") -> bool:
  """True when the CPU multiplies bfloat16 natively (AMX or AVX512-BF16) and oneDNN may use
  it (no ONEDNN_MAX_CPU_ISA ceiling below AVX512_CORE_BF16).

  Elsewhere (e.g. AVX2-only CPUs) bfloat16 matmuls run no faster than float32 and the casts
  make a training step slower, so mixed precision falls back to float32 there.
  """
  ceiling = os.environ.get("ONEDNN_MAX_CPU_ISA") or os.environ.get("DNNL_MAX_CPU_ISA") or ""
  if ceiling.strip().upper() in _ISA_CEILINGS_WITHOUT_BFLOAT16:
    return False
  try:
    with open(cpuinfo) as f:
      flags = f.read()
  except OSError:
    return False
  return "amx_bf16" in flags or "avx512_bf16" in flags


def compute_dtype(hparams) -> tf.DType:
  """Under mixed precision: float16 on GPU, bfloat16 on a CPU that has it; else float32."""
  if not hparams.mixed_precision:
    return tf.float32
  if tf.config.list_logical_devices("GPU"):
    return tf.float16
  return tf.bfloat16 if cpu_has_fast_bfloat16() else tf.float32


def padding_bias(ids):
  """[B, S] ids -> [B, 1, 1, S] float32 bias, NEG_INF at padding."""
  return tf.cast(tf.equal(ids, 0), tf.float32)[:, None, None, :] * NEG_INF


def causal_bias(length):
  """[1, 1, T, T]: position i may attend to positions <= i."""
  allowed = tf.linalg.band_part(tf.ones([length, length]), -1, 0)
  return ((1.0 - allowed) * NEG_INF)[None, None]


def projected_cross_entropy(x, table, targets, weights, smoothing: float,
                            vocab_major: bool = True):
  """sum(weights * label-smoothed cross-entropy) of the logits x table^T, in float32.

  x [..., H] (compute dtype), table the softmax weights (float32 variable value): [V, H]
  when `vocab_major` (the shared embedding), else [H, V] (a Dense kernel); targets and
  weights [...]. The per-token loss is minus its minimum (tensor2tensor's): with q the
  smoothed target distribution (confidence c on the target, l = smoothing / (V-1) on every
  other class), -sum(q log p) = (c - l) nll - l sum(log p), and sum(log p) = sum(z) - V log Z
  with sum(z) = x . (column sum of the table), so no [N, V] one-hot or sum is built.

  The projection is inside the gradient, which is written out. The logits' gradient is
  w (p - l - (c - l) onehot), with p the softmax and w the token weights times dy. Only p
  meets the two [N, V] matmuls; the weights are applied to their [N, H] operands and
  results, and the one-hot and smoothing terms are [N, H] and [V, H] tensors (the table's
  rows at the targets, a segment sum of the weighted states, and the table's column sum).
  The backward pass keeps p, in the compute dtype (float32 under float16, see below), and
  nothing else of size [N, V].

  p is the plain softmax kernel (a fused log-softmax with its gradient costs several times
  as much on a CPU), and nll = -log p[target]; a row whose p[target] is too small for that
  to be accurate (below 1e-30: a loss above 69) takes log-sum-exp(z) - z[target] instead,
  computed only when some row needs it.
  """
  hidden = x.shape[-1]
  x = tf.reshape(x, [-1, hidden])
  rows = tf.reshape(targets, [-1])
  w = tf.reshape(tf.cast(weights, tf.float32), [-1])
  vocab_axis = 0 if vocab_major else 1
  vocab = tf.shape(table)[vocab_axis]
  v = tf.cast(vocab, tf.float32)
  confidence = 1.0 - smoothing
  low = smoothing / (v - 1.0)
  hit = confidence - low  # minus the one-hot's coefficient in the logits' gradient

  @tf.custom_gradient
  def loss(x, table):
    t = tf.cast(table, x.dtype)
    z = tf.cast(tf.matmul(x, t, transpose_b=vocab_major), tf.float32)  # [N, V]
    p = tf.nn.softmax(z)
    index = tf.stack([tf.range(tf.size(rows)), rows], axis=1)
    p_target = tf.gather_nd(p, index)
    z_target = tf.gather_nd(z, index)
    tiny = p_target < 1e-30
    nll = tf.cond(tf.reduce_any(tiny),
                  lambda: tf.where(tiny, tf.reduce_logsumexp(z, axis=-1) - z_target,
                                   -tf.math.log(p_target)),
                  lambda: -tf.math.log(p_target))
    per_token = nll
    if smoothing > 0.0:
      log_z = nll + z_target
      column_sum = tf.reduce_sum(tf.cast(t, tf.float32), axis=vocab_axis)  # [H]
      sum_z = tf.linalg.matvec(tf.cast(x, tf.float32), column_sum)
      normalizing = -(confidence * tf.math.log(confidence) +
                      (v - 1.0) * low * tf.math.log(low + 1e-20))
      per_token = (confidence - low) * nll - low * (sum_z - v * log_z) - normalizing
    # float16 keeps p in float32 until dy (which carries the loss scale) is folded in, so that
    # small probabilities keep the loss scale's headroom; elsewhere p is cast now and dy is
    # applied to the [N, H] side.
    fold_dy = x.dtype == tf.float16
    kept = p if fold_dy else tf.cast(p, x.dtype)

    def grad(dy):
      wd = w * dy  # [N]: the one-hot and smoothing terms take dy directly
      wp = w if fold_dy else wd  # ... and the softmax's, unless dy is folded into p
      p_dy = tf.cast(kept * dy, x.dtype) if fold_dy else kept
      x32 = tf.cast(x, tf.float32)
      x_wd = x32 * wd[:, None]
      x_wp = tf.cast(x32 * wp[:, None] if fold_dy else x_wd, x.dtype)
      grad_x = tf.cast(tf.matmul(p_dy, t, transpose_b=not vocab_major),
                       tf.float32) * wp[:, None]
      if vocab_major:
        grad_table = tf.cast(tf.matmul(p_dy, x_wp, transpose_a=True), tf.float32)  # [V, H]
      else:
        grad_table = tf.cast(tf.matmul(x_wp, p_dy, transpose_a=True), tf.float32)  # [H, V]
      target_rows = tf.cast(tf.gather(t, rows, axis=vocab_axis), tf.float32)
      if not vocab_major:
        target_rows = tf.transpose(target_rows)
      on_rows = -hit * target_rows  # [N, H]
      on_table = -hit * tf.math.unsorted_segment_sum(x_wd, rows, vocab)  # [V, H]
      if smoothing > 0.0:
        on_rows -= low * column_sum
        on_table -= low * tf.linalg.matvec(x32, wd, transpose_a=True)
      grad_x += on_rows * wd[:, None]
      grad_table += on_table if vocab_major else tf.transpose(on_table)
      return tf.cast(grad_x, x.dtype), grad_table

    return tf.reduce_sum(per_token * w), grad

  with tf.name_scope("cross_entropy"):
    return loss(x, table)


class Block(tf.Module):
  def __init__(self, init, hparams, decoder: bool, name: str):
    super().__init__(name=name)
    hidden, eps = hparams.hidden_size, hparams.norm_epsilon
    self.self_norm = LayerNorm(hidden, eps, "self_norm")
    self.self_attention = Attention(init, hidden, hparams.num_heads, True, "self_attention")
    if decoder:
      self.cross_norm = LayerNorm(hidden, eps, "cross_norm")
      self.cross_attention = Attention(init, hidden, hparams.num_heads, False,
                                       "cross_attention")
    self.ffn_norm = LayerNorm(hidden, eps, "ffn_norm")
    self.ffn = FeedForward(init, hidden, hparams.filter_size, "ffn")
    self.decoder = decoder
    self.pre_norm = norm_placement(hparams) == "pre_norm"
    self.rates = (hparams.layer_prepostprocess_dropout, hparams.attention_dropout,
                  hparams.relu_dropout)

  def _residual(self, norm, sublayer, x, rate, seeds):
    """Pre-norm x + dropout(f(norm(x))) or post-norm norm(x + dropout(f(x))). The dropout's
    keep scale is applied inside f, to the weights of its last linear layer."""
    scale = keep_scale(rate, seeds)
    if self.pre_norm:
      return x + dropout(sublayer(norm(x), scale), rate, seeds, scaled=False)
    return norm(x + dropout(sublayer(x, scale), rate, seeds, scaled=False))

  def __call__(self, x, self_bias, seeds=None, memory=None, memory_bias=None, cache=None):
    post, attn, relu = self.rates if seeds is not None else (0.0, 0.0, 0.0)
    post = residual_rate(post, seeds)
    new_self = []

    def self_attention(y, scale):
      y, updated = self.self_attention(y, self_bias, attn, seeds,
                                       cache=None if cache is None else cache["self"],
                                       scale=scale)
      new_self.append(updated)
      return y

    x = self._residual(self.self_norm, self_attention, x, post, seeds)
    if self.decoder:
      x = self._residual(
          self.cross_norm,
          lambda y, scale: self.cross_attention(
              y, memory_bias, attn, seeds, memory=memory,
              cache=None if cache is None else cache["cross"], scale=scale)[0],
          x, post, seeds)
    x = self._residual(self.ffn_norm, lambda y, scale: self.ffn(y, relu, seeds, scale), x, post,
                       seeds)
    new_cache = None if cache is None else {"self": new_self[0], "cross": cache["cross"]}
    return x, new_cache


def variable_names(module: tf.Module) -> dict:
  """{variable.ref(): the "/"-joined attribute path} of `module`'s trainable variables."""
  paths = module._flatten(  # noqa: SLF001  (tf.Module's own walk, in trainable_variables' order)
      predicate=lambda x: isinstance(x, tf.Variable) and x.trainable, with_path=True)
  return {variable.ref(): "/".join(str(part) for part in path) for path, variable in paths}


class Transformer(tf.Module):
  """Encoder-decoder Transformer over one joint vocabulary."""

  def __init__(self, hparams, vocab_size: int, seed: int = 1):
    super().__init__(name="transformer")
    if hparams.hidden_size % hparams.num_heads:
      from t2t_lite.core.errors import UsageError
      raise UsageError(f"hidden_size={hparams.hidden_size} is not a multiple of "
                       f"num_heads={hparams.num_heads}")
    init = Initializer(seed)
    self.hidden = hparams.hidden_size
    self.vocab_size = vocab_size
    self.dtype = compute_dtype(hparams)
    self.rate = hparams.layer_prepostprocess_dropout
    self.smoothing = hparams.label_smoothing
    self.shared = hparams.shared_embedding_and_softmax_weights
    self.embedding = tf.Variable(init.normal([vocab_size, self.hidden], self.hidden ** -0.5),
                                 name="embedding")
    if not self.shared:
      self.target_embedding = tf.Variable(
          init.normal([vocab_size, self.hidden], self.hidden ** -0.5), name="target_embedding")
      self.softmax = Dense(init, self.hidden, vocab_size, False, "softmax")
    self.encoder = [Block(init, hparams, False, f"encoder_{i}")
                    for i in range(hparams.num_encoder_layers)]
    self.decoder = [Block(init, hparams, True, f"decoder_{i}")
                    for i in range(hparams.num_decoder_layers)]
    # Pre-norm stacks end in a layer norm; post-norm blocks already end in one.
    self.pre_norm = norm_placement(hparams) == "pre_norm"
    if self.pre_norm:
      self.encoder_norm = LayerNorm(self.hidden, hparams.norm_epsilon, "encoder_norm")
      self.decoder_norm = LayerNorm(self.hidden, hparams.norm_epsilon, "decoder_norm")
    # (a string: a dict attribute would become a checkpoint dependency of the module)
    self.frozen_spec = hparams.frozen_parts

  def compute_in(self, dtype: tf.DType) -> None:
    """The activations' dtype from the next trace on (a float16 run's fallback to float32;
    the weights stay float32)."""
    self.dtype = dtype

  def frozen_variables(self, spec: str | None = None) -> list:
    """The variables `frozen_parts` names (`spec`: another value of it), in the order of
    trainable_variables."""
    from types import SimpleNamespace
    parts, modules = frozen_parts(SimpleNamespace(
        frozen_parts=self.frozen_spec if spec is None else spec,
        num_encoder_layers=len(self.encoder), num_decoder_layers=len(self.decoder))), []
    if parts["embeddings"]:
      modules.append(self.embedding)
      if not self.shared:
        modules += [self.target_embedding, self.softmax]
    for stack in ("encoder", "decoder"):
      modules += [block for i, block in enumerate(getattr(self, stack)) if i in parts[stack]]
      if parts[f"{stack}_norm"] and self.pre_norm:
        modules.append(getattr(self, f"{stack}_norm"))
    frozen = set()
    for module in modules:
      variables = [module] if isinstance(module, tf.Variable) else module.trainable_variables
      frozen |= {v.ref() for v in variables}
    return [v for v in self.trainable_variables if v.ref() in frozen]

  def vocab_variables(self) -> list[tuple[tf.Variable, int]]:
    """The variables with a row (or column) per vocabulary piece, and that axis."""
    if self.shared:
      return [(self.embedding, 0)]
    return [(self.embedding, 0), (self.target_embedding, 0), (self.softmax.kernel, 1)]

  def trained_variables(self, spec: str | None = None) -> list:
    """The trainable variables that train: all but the frozen ones (`spec`: under another
    value of frozen_parts), in the order of trainable_variables."""
    frozen = {v.ref() for v in self.frozen_variables(spec)}
    return [v for v in self.trainable_variables if v.ref() not in frozen]

  def variable_names(self) -> dict:
    """{variable.ref(): name} of the trainable variables: the path of attributes that holds
    each ("decoder/0/ffn/dense1/kernel"), the same as under `model/` in a checkpoint. Adam's
    moments, the accumulators and the moving average are kept under these names."""
    return variable_names(self)

  def trained_names(self, frozen_spec: str) -> list[str]:
    """The names of the variables that train under frozen_parts=`frozen_spec` (as recorded
    by a run: what an older checkpoint's lists of state were ordered by), in order."""
    names = self.variable_names()
    return [names[v.ref()] for v in self.trained_variables(frozen_spec)]

  # --- pieces ------------------------------------------------------------------------
  def _embed(self, ids, table, positions):
    x = tf.gather(table, ids) * (self.hidden ** 0.5)
    return tf.cast(x + timing_signal(positions, self.hidden)[None], self.dtype)

  def _logits(self, x):
    """Final decoder states (after the stack's norm) -> logits, float32."""
    if self.shared:
      shape = tf.shape(x)
      flat = tf.matmul(tf.reshape(x, [-1, self.hidden]), tf.cast(self.embedding, x.dtype),
                       transpose_b=True)
      logits = tf.reshape(flat, tf.concat([shape[:-1], [self.vocab_size]], 0))
    else:
      logits = self.softmax(x)
    return tf.cast(logits, tf.float32)

  def _target_table(self):
    return self.embedding if self.shared else self.target_embedding

  def encode(self, inputs, seeds=None):
    """inputs [B, S] -> (encoder output [B, S, D], attention bias [B, 1, 1, S])."""
    bias = padding_bias(inputs)
    x = self._embed(inputs, self.embedding, tf.range(tf.shape(inputs)[1]))
    x = dropout(x, residual_rate(self.rate, seeds), seeds)
    for block in self.encoder:
      x, _ = block(x, bias, seeds)
    return (self.encoder_norm(x) if self.pre_norm else x), bias

  def decode(self, targets_in, memory, memory_bias, seeds=None):
    """Teacher-forced decoder: shifted targets [B, T] -> logits [B, T, V] (float32)."""
    return self._logits(self._decoder_states(targets_in, memory, memory_bias, seeds))

  def _decoder_states(self, targets_in, memory, memory_bias, seeds=None):
    """The decoder's last hidden states [B, T, D] (compute dtype), before the softmax."""
    length = tf.shape(targets_in)[1]
    x = dropout(self._embed(targets_in, self._target_table(), tf.range(length)),
                residual_rate(self.rate, seeds), seeds)
    bias = causal_bias(length)
    for block in self.decoder:
      x, _ = block(x, bias, seeds, memory, memory_bias)
    return self.decoder_norm(x) if self.pre_norm else x

  def _teacher_forced(self, inputs, targets, seed=None, residual_rate=None):
    """The decoder's last states [B, T, D] for `targets` given `inputs` (the decoder reads
    the targets shifted right); dropout on when `seed` is given, the residual and embedding
    dropout at `residual_rate` (a scalar tensor) if given, else layer_prepostprocess_dropout."""
    seeds = None if seed is None else SeedStream(seed, residual_rate)
    memory, memory_bias = self.encode(inputs, seeds)
    targets_in = tf.pad(targets, [[0, 0], [1, 0]])[:, :-1]
    return self._decoder_states(targets_in, memory, memory_bias, seeds)

  def __call__(self, inputs, targets, seed=None):
    """Logits [B, T, V] (float32) for `targets` given `inputs`; dropout on when `seed` is
    given."""
    return self._logits(self._teacher_forced(inputs, targets, seed))

  def loss(self, inputs, targets, seed=None, smoothing: float | None = None,
           residual_rate=None):
    """(summed label-smoothed loss over non-padding tokens, their count), both float32.

    `smoothing` defaults to the hparams' label_smoothing; 0 gives the plain negative
    log-likelihood (what dev loss and perplexity report). `residual_rate`: see
    _teacher_forced.
    """
    states = self._teacher_forced(inputs, targets, seed, residual_rate)
    weights = tf.cast(tf.not_equal(targets, 0), tf.float32)
    table = self.embedding if self.shared else self.softmax.kernel
    total = projected_cross_entropy(states, tf.convert_to_tensor(table), targets, weights,
                                    self.smoothing if smoothing is None else smoothing,
                                    vocab_major=self.shared)
    return total, tf.reduce_sum(weights)

  # --- incremental decoding ----------------------------------------------------------
  # The self-attention keys and values of every step live in one preallocated buffer per
  # layer, [max_length, batch * beam, heads, depth], written in place at each step and never
  # copied or reordered: beam search records each beam's parent instead ("parents"), and a
  # step gathers the keys and values along each beam's ancestry. The encoder-decoder keys and
  # values are computed once per sentence (not per beam), [batch, heads, source, depth].
  def init_cache(self, memory, beam_size: int, max_length):
    """Decoding state for `beam_size` hypotheses per row of memory [B, S, D], for at most
    `max_length` steps."""
    heads = self.decoder[0].self_attention.num_heads
    rows = tf.shape(memory)[0] * beam_size
    # Uninitialised: a step reads only the positions written before it.
    shape = tf.stack([max_length, rows, heads, self.hidden // heads])
    layers = []
    for block in self.decoder:
      k, v = block.cross_attention.memory_kv(memory)
      layers.append({"self": {"k": tf.raw_ops.Empty(shape=shape, dtype=self.dtype),
                              "v": tf.raw_ops.Empty(shape=shape, dtype=self.dtype)},
                     "cross": {"k": k, "v": v}})
    return {"layers": layers,
            "parents": tf.zeros([tf.shape(memory)[0], beam_size, 0], tf.int32)}

  def reorder_cache(self, cache, origin):
    """The cache for the beams that continue beams `origin` [B, K] (indices within a row)."""
    return {"layers": cache["layers"],
            "parents": tf.gather(cache["parents"], origin, batch_dims=1)}

  def select_rows(self, cache, keep):
    """The cache of the inputs `keep` [B'] only (indices into B), all their beams."""
    beam = tf.shape(cache["parents"])[1]
    beams = tf.reshape(keep[:, None] * beam + tf.range(beam), [-1])
    layers = [{"self": {name: tf.gather(t, beams, axis=1) for name, t in layer["self"].items()},
               "cross": {name: tf.gather(t, keep) for name, t in layer["cross"].items()}}
              for layer in cache["layers"]]
    return {"layers": layers, "parents": tf.gather(cache["parents"], keep)}

  def decode_step(self, ids, position, cache, memory_bias):
    """One decoder step: ids [B * K] at `position` -> (logits [B * K, V], the new cache).

    memory_bias is the encoder's [B, 1, 1, S] (one per sentence, shared by its beams).
    """
    heads = self.decoder[0].self_attention.num_heads
    batch, beam = tf.unstack(tf.shape(cache["parents"])[:2])
    rows = batch * beam
    # Each beam's own slot at this step, then the slot of its ancestor at each earlier one.
    parents = tf.concat([cache["parents"],
                         tf.broadcast_to(tf.range(beam)[None, :, None], [batch, beam, 1])], 2)
    steps = tf.shape(parents)[2]
    slots = (tf.range(steps)[None, None, :] * rows + (tf.range(batch) * beam)[:, None, None] +
             parents)
    # Rows of the buffer seen as [max_length * rows * heads, depth]: [B * K, H, steps].
    index = tf.reshape(slots, [rows, 1, steps]) * heads + tf.range(heads)[None, :, None]
    x = self._embed(ids[:, None], self._target_table(), position[None])
    layers = []
    for block, layer in zip(self.decoder, cache["layers"]):
      own = {**layer["self"], "position": position, "index": index}
      x, updated = block(x, tf.zeros([1, 1, 1, 1]), None, None, memory_bias,
                         {"self": own, "cross": layer["cross"]})
      layers.append({"self": {"k": updated["self"]["k"], "v": updated["self"]["v"]},
                     "cross": layer["cross"]})
    if self.pre_norm:
      x = self.decoder_norm(x)
    return self._logits(x)[:, 0], {"layers": layers, "parents": parents}
