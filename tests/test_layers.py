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


def test_projected_cross_entropy_in_bfloat16_follows_float32():
  x, table, targets, weights = _case(True, seed=1)
  reference = _loss_and_grads(textbook_loss, x, table, targets, weights, 0.1, True)
  low = _loss_and_grads(projected_cross_entropy, tf.cast(x, tf.bfloat16), table, targets,
                        weights, 0.1, True)
  assert low[1].dtype == tf.bfloat16 and low[2].dtype == tf.float32
  for name, a, b in zip(("loss", "d/dx", "d/dtable"), low, reference):
    a = tf.cast(a, tf.float32).numpy()
    error = np.max(np.abs(a - b.numpy())) / np.max(np.abs(b.numpy()))
    assert error < 3e-2, (name, error)
