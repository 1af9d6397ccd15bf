"""The moving average of the weights: counted in target tokens, bias-corrected, swapped in
for evaluation and read by default by whoever reads a checkpoint."""

import math

import numpy as np
import pytest
import tensorflow as tf

from conftest import tiny_hparams
from t2t_lite.runs import ema
from t2t_lite.inference import translator
from t2t_lite.core import registry
from t2t_lite.training.equivalence import concat, ragged_batches, tensors_relative_difference
from t2t_lite.core.errors import UsageError
from t2t_lite.training.learner import Learner

VOCAB = 60


def _average(decay=0.9, reference=100.0):
  theta = tf.Variable([1.0, -2.0, 3.0])
  return theta, ema.WeightAverage([theta], ["theta"], decay, reference)


def test_an_update_of_4t_tokens_moves_the_average_as_4_updates_of_t():
  theta_a, one = _average()
  theta_b, four = _average()
  for theta, average in ((theta_a, one), (theta_b, four)):  # a common first update
    average.update([theta], 30.0)
    theta.assign([4.0, 0.0, -1.0])
  one.update([theta_a], 4 * 25.0)
  for _ in range(4):
    four.update([theta_b], 25.0)
  assert float(one.weight.numpy()) == pytest.approx(float(four.weight.numpy()), abs=1e-12)
  np.testing.assert_allclose(one.averages[0].numpy(), four.averages[0].numpy(), rtol=1e-5,
                             atol=1e-6)
  # and an update per batch regardless of its tokens (a decay per update) would differ
  per_update = 1 - 0.9 ** 4 * (1 - 0.9 ** 0.3)
  assert abs(float(four.weight.numpy()) - per_update) > 1e-3


def test_the_first_update_sets_the_average_and_later_ones_weigh_by_tokens():
  """Adam's bias correction: the initial weights have no part in the average; after k
  updates it is the mean of their weights, update i weighted (1 - d_i) x the later decays."""
  theta, average = _average(decay=0.5, reference=10.0)
  assert not float(average.weight.numpy())
  values, tokens = [[1.0, -2.0, 3.0], [3.0, 2.0, 1.0], [-1.0, 0.5, 2.0]], [5.0, 20.0, 10.0]
  for step, (value, count) in enumerate(zip(values, tokens)):
    theta.assign(value)
    average.update([theta], count)
    if step == 0:
      assert average.averages[0].numpy().tolist() == value  # exactly, not approximately
  decays = [0.5 ** (count / 10.0) for count in tokens]
  weights = [(1 - d) * math.prod(decays[i + 1:]) for i, d in enumerate(decays)]
  expected = np.sum([w * np.array(v) for w, v in zip(weights, values)], 0) / sum(weights)
  np.testing.assert_allclose(average.averages[0].numpy(), expected, rtol=1e-6)
  assert float(average.weight.numpy()) == pytest.approx(1 - math.prod(decays), abs=1e-12)


def _learner(accumulate_steps, **overrides):
  hparams = tiny_hparams(layer_prepostprocess_dropout=0.0, attention_dropout=0.0,
                         relu_dropout=0.0, learning_rate_schedule="constant",
                         learning_rate_constant=1e-4, ema_decay=0.5, ema_reference_tokens=40,
                         **overrides)
  return Learner(hparams, VOCAB, accumulate_steps, seed=3)


def test_the_average_of_n_micro_batches_is_the_average_of_one_big_batch():
  """1 replica x n=4 against 1 replica x n=1 on the batch of the same sentences (2 replicas x
  n=2 against both: tests/mirrored_check.py)."""
  micro = ragged_batches(12)
  accumulated, big = _learner(4), _learner(1)
  for batch in micro:
    accumulated.step(batch)
  for update in range(3):
    big.step(concat(micro[4 * update:4 * update + 4]))
  assert accumulated.average is not None and big.accumulator is None
  assert float(accumulated.average.weight.numpy()) == pytest.approx(
      float(big.average.weight.numpy()), abs=1e-12)
  exact = tensors_relative_difference(accumulated.average.averages, big.average.averages)
  assert exact < 1e-5, exact
  # not trivially: the average is not the weights
  apart = tensors_relative_difference(big.average.averages, big.variables)
  assert apart > 10 * exact + 1e-5, apart


def test_swapping_twice_restores_the_weights_bit_for_bit_and_off_costs_nothing():
  learner = _learner(1)
  for batch in ragged_batches(2):
    learner.step(batch)
  raw = [v.numpy().copy() for v in learner.variables]
  averages = [a.numpy().copy() for a in learner.average.averages]
  learner.average.swap_with(learner.variables)
  assert all(np.array_equal(v.numpy(), a) for v, a in zip(learner.variables, averages))
  learner.average.swap_with(learner.variables)
  assert all(np.array_equal(v.numpy(), r) for v, r in zip(learner.variables, raw))
  assert learner.state_bytes()["moving_average"] == learner.state_bytes()["parameters"]
  off = Learner(tiny_hparams(), VOCAB, 1, seed=3)
  assert off.average is None and "ema" not in off.trackables()
  assert off.state_bytes()["moving_average"] == 0


def test_readers_take_the_average_by_default_and_the_raw_weights_when_asked(tmp_path):
  learner = _learner(2)
  for batch in ragged_batches(4):
    learner.step(batch)
  path = tf.train.CheckpointManager(tf.train.Checkpoint(**learner.trackables()), str(tmp_path),
                                    1).save(4)
  model = registry.model("transformer")(learner.hparams, VOCAB)
  assert translator.restore(model, path) == "ema"
  assert tensors_relative_difference(model.trainable_variables, learner.average.averages) == 0
  assert translator.restore(model, path, "raw") == "raw"
  assert tensors_relative_difference(model.trainable_variables, learner.variables) == 0
  plain = Learner(tiny_hparams(), VOCAB, 1, seed=3)
  other = tf.train.CheckpointManager(tf.train.Checkpoint(**plain.trackables()),
                                     str(tmp_path / "plain"), 1).save(1)
  assert translator.restore(model, other) == "raw"
  with pytest.raises(UsageError, match=r"--weights=ema: checkpoint .*plain/ckpt-1 has no moving "
                     r"average of the weights: it holds none .*; use --weights=raw"):
    translator.restore(model, other, "ema")


def test_ema_hparams_are_checked():
  from t2t_lite.core import hparams_check
  for values, message in (({"ema_decay": 1.0}, r"ema_decay=1.0: must be in \[0, 1\)"),
                          ({"ema_decay": 0.9, "ema_reference_tokens": 0},
                           "ema_reference_tokens=0: must be above 0"),
                          ({"ema_reference_tokens": 4096}, "ema_reference_tokens=4096 is read "
                           "only by a moving average of the weights, which ema_decay=0 turns "
                           "off")):
    with pytest.raises(UsageError, match=message):
      hparams_check.check(tiny_hparams(**values))
