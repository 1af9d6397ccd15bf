"""The run's plan: its last update (--train_steps or the cooldown's end) and the switch to the
sampled segmentations, on a stand-in learner (counters only; no model)."""

import pytest
import tensorflow as tf

from conftest import tiny_hparams
from t2t_lite.training.options import Stopping
from t2t_lite.core.errors import UsageError
from t2t_lite.training.milestones import NEVER, UNDECIDED, Milestones, training_splits
from t2t_lite.training.steps import AccumulateSchedule, run_steps
from t2t_lite.training.options import RunOptions

COOLDOWN = "constant*linear_warmup*rsqrt_decay*rsqrt_hidden_size*linear_cooldown"


class Counters:
  """What the plan reads of a learner: its schedule, counters and cooldown end."""

  def __init__(self, hparams, micro_step=0):
    self.cooldown = "linear_cooldown" in hparams.learning_rate_schedule
    self.cooldown_end = tf.Variable(0, dtype=tf.int64)
    self.schedule = AccumulateSchedule.constant(hparams.optimizer_multistep_accumulate_steps)
    self.host = self  # (the host's counters: micro_step() and position())
    self._micro_step = micro_step

  def micro_step(self):
    return self._micro_step

  def fix_cooldown_end(self, end):
    self.cooldown_end.assign(end)

  def position(self):
    return 0


def _plan(train_steps=1000, minutes=0.0, splits=("train", "train_sampled"), replicas=1,
          **overrides):
  hparams = tiny_hparams(learning_rate_schedule=COOLDOWN, **overrides)
  options = RunOptions(output_dir="run", data_dir="data", log_every=10,
                       stopping=Stopping(train_minutes=minutes))
  learner = Counters(hparams)
  return Milestones(hparams, run_steps(hparams, replicas, train_steps), options, learner,
                    list(splits), tf.distribute.get_strategy()), learner


def test_without_a_budget_the_end_is_train_steps_from_the_start():
  milestones, learner = _plan(train_steps=300)
  assert milestones.schedule().train_steps == 300
  milestones.start(0)
  assert int(learner.cooldown_end.numpy()) == 300 and milestones.run_end.end == 300
  assert milestones.schedule().train_steps == 300 and milestones.schedule().cooldown_every == 0
  assert milestones.stop_reason() is None


def test_a_budget_is_checked_every_log_interval_until_the_projection_fixes_the_end():
  milestones, learner = _plan(train_steps=10 ** 5, minutes=1.0)
  milestones.start(0)
  assert milestones.schedule().cooldown_every == 10 and milestones.run_end.end == 0
  agree = lambda value: value  # noqa: E731  (one process)
  assert milestones.check_budget(10, 100.0, 160.0, agree).projected == 0  # the pace starts
  # 10 updates in 10 s; 50 s left: 20 + 0.98 x 50 = 69 updates
  check = milestones.check_budget(20, 110.0, 160.0, agree)
  assert check.projected == 69 and check.rate_per_minute == pytest.approx(60.0)
  assert milestones.run_end.end == 0  # the cooldown of a run ending at 69 starts at update 50
  milestones.check_budget(40, 130.0, 160.0, agree)
  assert milestones.run_end.end == 69 and int(learner.cooldown_end.numpy()) == 69
  assert milestones.schedule().train_steps == 69 and milestones.schedule().cooldown_every == 0
  assert milestones.stop_reason() == "the learning-rate cooldown's last update (69) reached"


def test_the_switch_is_decided_at_the_start_without_a_minimum_length():
  milestones, learner = _plan(replicas=2, subword_sampling_start=5,
                            optimizer_multistep_accumulate_steps=2)
  assert set(milestones.trackables()) == {"sampled_from_batch"}
  milestones.start(0)
  # updates 1-5 read the one best: 5 x 2 micro-steps x 2 replicas = batch 20 of the stream
  assert milestones.switch == int(milestones.sampled_from.numpy()) == 20
  assert not milestones.switches_at(9) and milestones.switches_at(10)


def test_a_budget_too_short_for_the_minimum_keeps_the_one_best_and_a_long_one_switches():
  for deadline, expected in ((150.0, NEVER), (400.0, 100)):
    milestones, learner = _plan(train_steps=10 ** 5, minutes=1.0, subword_sampling_start=100,
                              subword_sampling_min_updates=200)
    milestones.start(0)
    assert milestones.switch == UNDECIDED
    agree = lambda value: value  # noqa: E731
    milestones.check_budget(80, 100.0, deadline, agree)
    learner._micro_step = 95
    milestones.check_budget(95, 115.0, deadline, agree)  # the last check before update 100
    assert milestones.switch == expected, deadline


def test_a_recorded_decision_and_end_are_kept():
  milestones, learner = _plan(subword_sampling_start=5)
  learner.cooldown_end.assign(400)
  milestones.sampled_from.assign(NEVER)
  milestones.start(7)
  assert milestones.switch == NEVER and milestones.run_end.end == 400
  assert milestones.schedule().train_steps == 400


def test_the_splits_read_and_the_combinations_refused():
  hparams = tiny_hparams(learning_rate_schedule=COOLDOWN, subword_sampling_min_updates=50)
  both = ("train", "train_sampled")
  assert training_splits(hparams, 0, 0.0, "d", ("train", "dev")) == ["train"]
  assert training_splits(hparams, 10, 0.0, "d", both) == list(both)
  with pytest.raises(UsageError, match="subword_sampling_start, which is 0"):
    training_splits(hparams, 0, 1.0, "d", both)
  with pytest.raises(UsageError, match="holds only sampled segmentations"):
    training_splits(hparams, 10, 0.0, "d", ("train_sampled",))
  hparams.subword_sampling_min_updates = 0
  assert training_splits(hparams, 0, 0.0, "d", both) == ["train_sampled"]
