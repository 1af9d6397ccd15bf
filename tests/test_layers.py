"""Written-out gradients against automatic differentiation of the textbook formulas."""

import numpy as np
import pytest
import tensorflow as tf

from t2t_lite.models.transformer import projected_cross_entropy


def textbook_loss(x, table, targets, weights, smoothing, vocab_major):
  """Dense one-hot label smoothing over full log-softmax, minus its minimum."""
  logits = tf.matmul(x, table, transpose_b=vocab_major)
  vocab = logits.shape[-1]
  low = smoothing / (vocab - 1)
  q = tf.one_hot(targets, vocab, on_value=1.0 - smoothing, off_value=low)
  per_token = -tf.reduce_sum(q * tf.nn.log_softmax(logits), axis=-1)
  minimum = -tf.reduce_sum(q * tf.math.log(q + 1e-20), axis=-1)
  return tf.reduce_sum((per_token - minimum) * weights)


def _case(vocab_major, seed=0, rows=24, hidden=16, vocab=50):
  rng = np.random.RandomState(seed)
  x = tf.constant(rng.randn(rows, hidden).astype(np.float32))
  shape = [vocab, hidden] if vocab_major else [hidden, vocab]
  table = tf.constant(rng.randn(*shape).astype(np.float32) * 0.5)
  targets = tf.constant(rng.randint(0, vocab, size=rows).astype(np.int32))
  weights = tf.constant((rng.rand(rows) > 0.25).astype(np.float32))  # some padding
  return x, table, targets, weights


def _loss_and_grads(fn, x, table, *args):
  with tf.GradientTape() as tape:
    tape.watch([x, table])
    loss = 3.0 * fn(x, table, *args)  # dy = 3 reaches the written-out gradient
  return [loss, *tape.gradient(loss, [x, table])]


@pytest.mark.parametrize("vocab_major", [True, False])
@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_projected_cross_entropy_equals_the_textbook_loss_and_gradients(vocab_major, smoothing):
  x, table, targets, weights = _case(vocab_major)
  ours = _loss_and_grads(projected_cross_entropy, x, table, targets, weights, smoothing,
                         vocab_major)
  reference = _loss_and_grads(textbook_loss, x, table, targets, weights, smoothing,
                              vocab_major)
  for name, a, b in zip(("loss", "d/dx", "d/dtable"), ours, reference):
    error = np.max(np.abs(a.numpy() - b.numpy())) / np.max(np.abs(b.numpy()))
    assert error < 2e-6, (name, error)
  # The padded rows get no gradient.
  padded = weights.numpy() == 0
  assert padded.any() and np.all(ours[1].numpy()[padded] == 0.0)


@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_projected_cross_entropy_of_an_unlikely_target_is_exact(smoothing):
  """A target whose probability underflows -log(p) (a loss above 69): log-sum-exp instead,
  for that row only, inside the compiled step."""
  x, table, targets, weights = _case(True, seed=2)
  x = x * 40.0  # logits in the hundreds: most targets' p is far below 1e-30
  compiled = tf.function(lambda *args: _loss_and_grads(projected_cross_entropy, *args))
  ours = compiled(x, table, targets, weights, smoothing, True)
  reference = _loss_and_grads(textbook_loss, x, table, targets, weights, smoothing, True)
  nll = -tf.gather(tf.nn.log_softmax(tf.matmul(x, table, transpose_b=True)), targets,
                   batch_dims=1).numpy()
  assert (nll > 69).sum() >= 5 and (nll < 69).sum() >= 2  # both kinds of rows
  assert np.isfinite(ours[0].numpy())
  for name, a, b in zip(("loss", "d/dx", "d/dtable"), ours, reference):
    error = np.max(np.abs(a.numpy() - b.numpy())) / np.max(np.abs(b.numpy()))
    assert error < 2e-6, (name, error)


@pytest.mark.parametrize("dtype, tolerance", [(tf.bfloat16, 3e-2), (tf.float16, 4e-3)])
def test_projected_cross_entropy_in_low_precision_follows_float32(dtype, tolerance):
  """float16 folds dy (the loss scale) into softmax - onehot before its cast; bfloat16 and
  float32 apply it to the [N, H] side."""
  x, table, targets, weights = _case(True, seed=1)
  reference = _loss_and_grads(textbook_loss, x, table, targets, weights, 0.1, True)
  low = _loss_and_grads(projected_cross_entropy, tf.cast(x, dtype), table, targets,
                        weights, 0.1, True)
  assert low[1].dtype == dtype and low[2].dtype == tf.float32
  for name, a, b in zip(("loss", "d/dx", "d/dtable"), low, reference):
    a = tf.cast(a, tf.float32).numpy()
    error = np.max(np.abs(a - b.numpy())) / np.max(np.abs(b.numpy()))
    assert error < tolerance, (name, error)


def _seeds():
  from t2t_lite.models.layers import SeedStream
  return SeedStream(tf.constant([7, 3], tf.int64))


def test_dropout_zeroes_the_rate_and_keeps_the_mean():
  from t2t_lite.models.layers import dropout, keep_scale
  x = tf.ones([1000, 300])
  y = dropout(x, 0.1, _seeds()).numpy()
  assert abs(np.mean(y == 0.0) - 0.1) < 0.003
  assert np.all((y == 0.0) | np.isclose(y, keep_scale(0.1, _seeds())))
  assert abs(y.mean() - 1.0) < 0.005
  assert keep_scale(0.1, None) == 1.0 and keep_scale(0.0, _seeds()) == 1.0
  assert keep_scale(0.1, _seeds()) == float(np.float32(65536.0) / np.float32(65536 - 6554))
  # a tensor rate: the same threshold and the same float32 scale
  assert float(keep_scale(tf.constant(0.1), _seeds())) == keep_scale(0.1, _seeds())


def test_dropout_scale_folded_into_the_next_layer_is_the_same_dropout():
  """dropout(dropout(relu(x W1 + b1)) W2 + b2) with the inner dropout's keep scale applied to
  W2 and the outer one's to W2 and b2, instead of to the activations: values and gradients
  unchanged."""
  from t2t_lite.models.layers import FeedForward, Initializer, dropout, keep_scale
  ffn = FeedForward(Initializer(1), 16, 32, "ffn")
  x = tf.constant(np.random.RandomState(0).randn(40, 16).astype(np.float32))
  unfolded, folded = [], []
  for out in (unfolded, folded):
    with tf.GradientTape() as tape:
      if out is unfolded:
        h = dropout(tf.nn.relu(ffn.inner(x)), 0.2, _seeds())
        y = dropout(ffn.outer(h), 0.3, _seeds())
      else:
        y = dropout(ffn(x, 0.2, _seeds(), keep_scale(0.3, _seeds())), 0.3, _seeds(),
                    scaled=False)
      loss = tf.reduce_sum(y * tf.range(16, dtype=tf.float32))
    out.extend([y, *tape.gradient(loss, ffn.trainable_variables)])
  assert np.mean(unfolded[0].numpy() == 0.0) > 0.25  # dropout was on
  for a, b in zip(unfolded, folded):
    np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=2e-5, atol=2e-6)


def test_relu_dropout_is_dropout_of_relu():
  """One mask for both (relu=True) against relu then dropout: values and gradients, with
  dropout on and off."""
  from t2t_lite.models.layers import dropout
  x = tf.constant(np.random.RandomState(3).randn(30, 70).astype(np.float32))
  for rate, seeds in ((0.2, _seeds), (0.2, lambda: None), (0.0, _seeds)):
    outs = []
    for fused in (True, False):
      with tf.GradientTape() as tape:
        tape.watch(x)
        y = dropout(x, rate, seeds(), relu=True) if fused else dropout(tf.nn.relu(x), rate,
                                                                      seeds())
        loss = tf.reduce_sum(y * tf.range(70, dtype=tf.float32))
      outs.append([y.numpy(), tape.gradient(loss, x).numpy()])
    np.testing.assert_array_equal(outs[0][0], outs[1][0])
    np.testing.assert_array_equal(outs[0][1], outs[1][1])
    zeros = np.mean(outs[0][0] == 0.0)
    on = rate > 0 and seeds() is not None
    assert (zeros > 0.55) if on else (0.4 < zeros < 0.6)  # relu's half, + 20% of the rest


def test_dense_and_layer_norm_gradients_equal_autodiff():
  """The written-out bias and layer-norm gradients (row sums as products with ones, over
  every leading axis) against automatic differentiation of the textbook formulas."""
  from t2t_lite.models.layers import Dense, Initializer, LayerNorm
  rng = np.random.RandomState(4)
  x = tf.constant(rng.randn(3, 7, 16).astype(np.float32))
  dense, norm = Dense(Initializer(2), 16, 24, True, "dense"), LayerNorm(16, 1e-6, "norm")
  dense.bias.assign(rng.randn(24).astype(np.float32))
  norm.scale.assign(rng.rand(16).astype(np.float32) + 0.5)
  norm.bias.assign(rng.randn(16).astype(np.float32))
  probe = tf.constant(rng.randn(3, 7, 24).astype(np.float32))

  def textbook(x):
    mean, variance = tf.nn.moments(x, axes=[-1], keepdims=True)
    y = (x - mean) * tf.math.rsqrt(variance + 1e-6) * norm.scale + norm.bias
    return tf.einsum("btd,de->bte", y, dense.kernel) + dense.bias

  results = []
  for fn in (lambda x: dense(norm(x)), textbook):
    with tf.GradientTape() as tape:
      tape.watch(x)
      loss = tf.reduce_sum(fn(x) * probe)
    variables = [dense.kernel, dense.bias, norm.scale, norm.bias]
    results.append([loss, *tape.gradient(loss, [x, *variables])])
  for a, b in zip(*results):
    np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-5, atol=1e-5)


def test_split_parts_and_heads_is_a_split_then_split_heads():
  from t2t_lite.models.layers import split_heads, split_parts_and_heads
  x = tf.constant(np.random.RandomState(5).randn(2, 5, 3 * 12).astype(np.float32))
  ours = split_parts_and_heads(x, 3, 4)
  for a, b in zip(ours, tf.split(x, 3, axis=-1)):
    assert a.shape == (2, 4, 5, 3)
    np.testing.assert_array_equal(a.numpy(), split_heads(b, 4).numpy())


def test_a_ramped_dropout_rate_of_0_draws_no_masks(monkeypatch):
  """The dropout ramp's rate is a tensor, 0 in its first updates: then no random words are
  drawn (the masks would keep everything), the output is the input, and the sites' seeds
  advance as at any rate, so the masks that follow are the same."""
  from t2t_lite.models import layers
  drawn = []
  real = tf.random.stateless_uniform
  monkeypatch.setattr(tf.random, "stateless_uniform",
                      lambda *a, **k: drawn.append(1) or real(*a, **k))
  x = tf.random.stateless_normal([4, 8], seed=[1, 2])
  for rate, draws in ((0.0, 0), (0.25, 1)):
    seeds = layers.SeedStream(tf.constant([3, 4]))
    out = layers.dropout(x, tf.constant(rate), seeds)
    assert len(drawn) == draws and seeds._site == 1, rate
    if not rate:
      np.testing.assert_array_equal(out.numpy(), x.numpy())
  relu = layers.dropout(x, tf.constant(0.0), layers.SeedStream(tf.constant([3, 4])), relu=True)
  np.testing.assert_array_equal(relu.numpy(), tf.nn.relu(x).numpy())
  assert len(drawn) == 1
