"""The contract: n micro-batches equal one n-times-bigger batch, token-weighted, exactly."""

import numpy as np
import pytest
import tensorflow as tf

from conftest import tiny_hparams
from t2t_lite.training import optimize
from t2t_lite.core import registry
from t2t_lite.training.equivalence import (concat, ragged_batches, relative_difference,
                                           tensors_relative_difference)
from t2t_lite.training.learner import Learner
from t2t_lite.training.steps import run_steps
from t2t_lite.core.errors import UsageError

VOCAB = 60


def no_dropout(**overrides):
  return tiny_hparams(layer_prepostprocess_dropout=0.0, attention_dropout=0.0,
                      relu_dropout=0.0, **overrides)


class PerMicroBatchMean(Learner):
  """What per-step averaging wrappers do: the plain mean of micro-batch mean gradients."""

  def _gradients(self, batch):
    grads, loss, tokens = super()._gradients(batch)
    return [g / tokens for g in grads], loss / tokens, tf.constant(1.0)


def test_accumulation_equals_one_big_batch_and_the_mean_variant_does_not():
  # Adam divides by sqrt(v) + 1e-9, so float32 round-off in near-zero gradient entries
  # moves a parameter by a fraction of the learning rate; the error scales with it. 1e-4 is a
  # learning rate of the warmup phase; the test compares 3 updates.
  hparams = no_dropout(learning_rate_schedule="constant", learning_rate_constant=1e-4)
  micro = ragged_batches(12)
  token_counts = [int(tf.reduce_sum(tf.cast(b["targets"] > 0, tf.int32))) for b in micro]
  assert len(set(token_counts)) > 3, "the micro-batches must be ragged"
  accumulated = Learner(hparams, VOCAB, accumulate_steps=4, seed=3)
  big = Learner(hparams, VOCAB, accumulate_steps=1, seed=3)
  mean = PerMicroBatchMean(hparams, VOCAB, accumulate_steps=4, seed=3)
  for batch in micro:
    accumulated.step(batch)
    mean.step(batch)
  for update in range(3):
    big.step(concat(micro[4 * update:4 * update + 4]))
  assert int(accumulated.update_step.numpy()) == int(big.update_step.numpy()) == 3
  exact = relative_difference(accumulated, big)
  biased = relative_difference(mean, big)
  assert exact < 1e-5, exact
  assert biased > 1e-5 * 10, biased


def test_gradient_is_token_weighted_sum_over_micro_batches():
  hparams = no_dropout()
  micro = ragged_batches(3, seed=4)
  accumulated = Learner(hparams, VOCAB, accumulate_steps=3, seed=5)
  for batch in micro:
    accumulated.micro_step_fn(batch)
  tokens = float(accumulated.accumulator.tokens.numpy())
  grads = [g.numpy() / tokens for g in accumulated.accumulator.gradients]
  big_grads, _, big_tokens = Learner(hparams, VOCAB, 1, seed=5)._gradients(concat(micro))
  assert tokens == float(big_tokens)
  for mine, theirs in zip(grads, big_grads):
    np.testing.assert_allclose(mine, theirs.numpy() / tokens, atol=2e-7)


@pytest.mark.parametrize("accumulate_steps", [1, 8])
def test_counters_and_schedule_count_updates(accumulate_steps):
  hparams = no_dropout(learning_rate_warmup_steps=4)
  learner = Learner(hparams, VOCAB, accumulate_steps, seed=1)
  rates = []
  for batch in ragged_batches(5 * accumulate_steps, seed=2):
    stats = learner.step(batch)
    if stats is not None:
      rates.append(float(stats["learning_rate"]))
  assert int(learner.update_step.numpy()) == 5
  assert int(learner.adam.iterations.numpy()) == 5
  assert int(learner.micro_step.numpy()) == 5 * accumulate_steps
  expected = [float(optimize.learning_rate(hparams, u)) for u in range(1, 6)]
  np.testing.assert_allclose(rates, expected, rtol=1e-6)
  # warmup counts updates: linear up to update 4, then rsqrt decay
  assert rates[3] == pytest.approx(2.0 * 4 ** -0.5 * 128 ** -0.5, rel=1e-6)
  assert rates[0] == pytest.approx(rates[3] / 4, rel=1e-6)


def test_single_step_has_no_accumulators_and_multistep_has_one_copy():
  hparams = no_dropout()
  single = Learner(hparams, VOCAB, 1)
  multi = Learner(hparams, VOCAB, 16)
  assert single.accumulator is None
  assert single.state_bytes()["accumulators"] == 0
  params = single.state_bytes()["parameters"]
  assert multi.state_bytes()["accumulators"] == params
  assert len(multi.accumulator.gradients) == len(multi.variables)


def test_embedding_gradients_are_dense_on_every_path():
  hparams = no_dropout()
  learner = Learner(hparams, VOCAB, 1)
  grads, _, _ = learner._gradients(ragged_batches(1)[0])
  assert all(isinstance(g, tf.Tensor) and not isinstance(g, tf.IndexedSlices) for g in grads)


def test_clipping_applies_to_the_accumulated_gradient():
  hparams = no_dropout(clip_grad_norm=1e-3, learning_rate_schedule="constant",
                       learning_rate_constant=1e-4)
  micro = ragged_batches(8, seed=9)
  accumulated = Learner(hparams, VOCAB, 4, seed=3)
  big = Learner(hparams, VOCAB, 1, seed=3)
  for batch in micro:
    accumulated.step(batch)
  for update in range(2):
    stats = big.step(concat(micro[4 * update:4 * update + 4]))
  assert float(stats["grad_norm"]) > 1e-3  # clipping was active
  assert relative_difference(accumulated, big) < 1e-5


def test_plan_arithmetic():
  hparams = registry.hparams("transformer_base_fake_gpu8")
  p = run_steps(hparams, replicas=1, train_steps=100)
  assert (p.tokens_per_update, p.micro_steps) == (32768, 800)
  base_on_8 = run_steps(registry.hparams("transformer_base"), replicas=8, train_steps=100)
  assert base_on_8.tokens_per_update == p.tokens_per_update
  with pytest.raises(UsageError, match="--train_steps=0"):
    run_steps(hparams, 1, 0)


def test_xla_compiled_passes_give_the_same_loss_gradients_and_dropout_masks():
  """Dropout on, its residual rate a tensor (a ramp: 0.1 at update 1, rising to 0.3 at 4):
  the masks must be the same bits under XLA. (test_dropout_ramp shows that a tensor rate
  draws the masks of the same constant rate, so XLA's tensor rate does too.)"""
  hparams = tiny_hparams(dropout_ramp_initial=0.1, dropout_ramp_start=0, dropout_ramp_end=4)
  assert hparams.layer_prepostprocess_dropout > 0 and hparams.relu_dropout > 0
  # Two micro-batches (two dropout seeds) of one shape: XLA compiles a shape once, and the
  # ragged case is the accumulation's, tested above.
  batches = [{name: tf.pad(tf.concat([ids, ids[:4 - ids.shape[0]]], 0),
                           [[0, 0], [0, 12 - ids.shape[1]]])  # 4 rows (repeated), 12 long
              for name, ids in batch.items()} for batch in ragged_batches(2, seed=4)]
  assert batches[0]["targets"].shape == batches[1]["targets"].shape
  plain = Learner(hparams, VOCAB, accumulate_steps=2, seed=5)
  xla = Learner(hparams, VOCAB, accumulate_steps=2, seed=5, xla_compile=True)
  assert xla._loss_gradients._jit_compile and not hasattr(plain._loss_gradients, "_jit_compile")
  for learner in (plain, xla):
    for batch in batches:
      learner.micro_step_fn(batch)
  assert float(xla.accumulator.tokens.numpy()) == float(plain.accumulator.tokens.numpy())
  loss, xla_loss = float(plain.accumulator.loss.numpy()), float(xla.accumulator.loss.numpy())
  assert abs(xla_loss - loss) < 1e-5 * loss, (xla_loss, loss)
  worst = tensors_relative_difference(xla.accumulator.gradients, plain.accumulator.gradients)
  assert worst < 1e-5, worst
