"""The dropout ramp: the residual and embedding dropout rises with the update number. A
tensor rate draws the same masks as the same constant rate, an update trains at the rate of
its number (not of its micro-steps), and a resumed learner continues the ramp exactly."""

import numpy as np
import pytest
import tensorflow as tf

from conftest import tiny_hparams
from t2t_lite.core import hparams_check, registry
from t2t_lite.training import optimize
from t2t_lite.training.equivalence import ragged_batches, relative_difference
from t2t_lite.core.errors import UsageError
from t2t_lite.training.learner import Learner

VOCAB = 60


def ramp(initial=0.1, start=2, end=6, final=0.3):
  return tiny_hparams(dropout_ramp_initial=initial, dropout_ramp_start=start,
                      dropout_ramp_end=end, layer_prepostprocess_dropout=final)


def test_the_rate_rises_linearly_from_the_start_to_the_end_update():
  rates = [float(optimize.residual_dropout(ramp(), u)) for u in range(1, 9)]
  assert rates == pytest.approx([0.1, 0.1, 0.15, 0.2, 0.25, 0.3, 0.3, 0.3])
  assert optimize.residual_dropout(tiny_hparams(), 5) is None  # no ramp: the constant rate
  demo = registry.hparams("transformer_multi30k_cpu")
  assert [float(optimize.residual_dropout(demo, u)) for u in (1, 400, 800, 1200, 3000)] == \
      pytest.approx([0.0, 0.0, 0.15, 0.3, 0.3])


@pytest.mark.parametrize("overrides, message", [
    (dict(dropout_ramp_start=400), "dropout_ramp_start=400 is read only by a dropout ramp, "
     "which dropout_ramp_end=0 turns off; set dropout_ramp_end"),
    (dict(dropout_ramp_initial=0.1), "dropout_ramp_initial=0.1 is read only by a dropout ramp"),
    (dict(dropout_ramp_start=6, dropout_ramp_end=6),
     r"dropout_ramp_start=6: must be at least 0 and below dropout_ramp_end=6 \(updates\)"),
    (dict(dropout_ramp_end=6, dropout_ramp_initial=1.0),
     r"dropout_ramp_initial=1.0: must be in \[0, 1\)"),
])
def test_values_the_ramp_does_not_read_or_cannot_use_are_refused(overrides, message):
  with pytest.raises(UsageError, match=message):
    hparams_check.check(tiny_hparams(**overrides))


def test_a_tensor_rate_draws_the_masks_of_the_same_constant_rate():
  """(Under XLA too: test_multistep's XLA test trains at a ramp's tensor rate.)"""
  hparams = tiny_hparams(layer_prepostprocess_dropout=0.3)
  model = registry.model("transformer")(hparams, VOCAB, seed=5)
  batch = ragged_batches(1, seed=2)[0]
  seed = tf.constant([5, 1], tf.int64)

  def loss_and_gradients(rate):
    with tf.GradientTape() as tape:
      loss = model.loss(batch["inputs"], batch["targets"], seed, residual_rate=rate)[0]
    return loss, tape.gradient(loss, model.trainable_variables)

  run = loss_and_gradients
  constant, constant_grads = loss_and_gradients(None)  # 0.3 from the hparams
  tensor, tensor_grads = run(tf.constant(0.3))
  other, _ = run(tf.constant(0.1))
  assert float(tensor) == pytest.approx(float(constant), rel=1e-6)
  for mine, theirs in zip(tensor_grads, constant_grads):
    np.testing.assert_allclose(tf.convert_to_tensor(mine).numpy(),
                               tf.convert_to_tensor(theirs).numpy(), rtol=1e-4, atol=1e-6)
  assert abs(float(other) - float(constant)) > 1e-3 * float(constant)


def _train(hparams, batches, accumulate_steps=2):
  # a constant learning rate large enough that two updates at other rates differ clearly
  hparams.learning_rate_schedule, hparams.learning_rate_constant = "constant", 0.01
  learner = Learner(hparams, VOCAB, accumulate_steps=accumulate_steps, seed=5)
  for batch in batches:
    learner.step(batch)
  return learner


def test_each_update_trains_at_the_rate_of_its_number():
  """With 2 micro-steps per update, updates 1-2 are micro-steps 1-4: a ramp from update 2
  leaves them at its initial rate (a ramp read by micro-step would not), bit for bit as that
  constant rate trains them; update 3 is past the ramp and no longer does."""
  batches = ragged_batches(6, seed=4)
  ramped = _train(ramp(initial=0.3, start=2, end=3, final=0.1), batches[:4])
  constant = _train(tiny_hparams(layer_prepostprocess_dropout=0.3), batches[:4])
  assert relative_difference(ramped, constant) == 0.0
  for learner in (ramped, constant):
    learner.step(batches[4]), learner.step(batches[5])
  assert relative_difference(ramped, constant) > 1e-2


def test_a_resumed_learner_continues_the_ramp_exactly(tmp_path):
  hparams = ramp(start=1, end=4)
  batches = ragged_batches(8, seed=6)
  whole = _train(hparams, batches[:4])  # saved after update 2, then on to update 4
  path = tf.train.Checkpoint(**whole.trackables()).save(str(tmp_path / "ckpt"))
  for batch in batches[4:]:
    whole.step(batch)
  resumed = Learner(hparams, VOCAB, accumulate_steps=2, seed=5)
  tf.train.Checkpoint(**resumed.trackables()).restore(path).assert_existing_objects_matched()
  for batch in batches[4:]:
    resumed.step(batch)
  assert int(resumed.update_step.numpy()) == 4
  for mine, theirs in zip(resumed.model.trainable_variables, whole.model.trainable_variables):
    np.testing.assert_array_equal(mine.numpy(), theirs.numpy())
