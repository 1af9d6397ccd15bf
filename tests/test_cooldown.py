"""The learning-rate cooldown: its factor, the last update a time budget fixes for it, and
that a resumed run keeps that update."""

import pytest

from conftest import tiny_hparams
from t2t_lite.training import budget, optimize
from t2t_lite.core import hparams_check, registry
from t2t_lite.training.decide import Agreed, Progress, Schedule, decide
from t2t_lite.training.options import Checkpointing, Evaluation, Stopping
from t2t_lite.core.errors import UsageError
from t2t_lite.training.steps import AccumulateSchedule, run_steps
from t2t_lite.training.options import RunOptions
from t2t_lite.training.loop import Trainer
from test_train import _scalars

SCHEDULE = "constant*linear_warmup*rsqrt_decay*rsqrt_hidden_size*linear_cooldown"


def _rate(hparams, update, end=0):
  return float(optimize.learning_rate(hparams, update, end))


def test_the_cooldown_falls_linearly_to_zero_over_the_last_updates_of_the_run():
  hparams = tiny_hparams(learning_rate_schedule=SCHEDULE, learning_rate_warmup_steps=2,
                         learning_rate_cooldown=0.3)
  plain = tiny_hparams(learning_rate_warmup_steps=2)
  # E = 10: L = ceil(0.3 x 10) = 3 updates; factors 1, 1, 2/3, 1/3 at updates 7-10, then 0
  factors = [_rate(hparams, u, 10) / _rate(plain, u) for u in range(1, 12)]
  assert factors == pytest.approx([1] * 8 + [2 / 3, 1 / 3, 0], abs=1e-6)
  assert budget.cooldown_length(10, 0.3) == 3 and budget.cooldown_start(10, 0.3) == 9
  # not fixed yet (E = 0): the schedule without the factor
  assert [_rate(hparams, u) for u in (1, 5, 50)] == [_rate(plain, u) for u in (1, 5, 50)]
  bad = tiny_hparams(learning_rate_schedule=SCHEDULE, learning_rate_cooldown=0.0)
  with pytest.raises(UsageError, match=r"learning_rate_cooldown=0.0: must be in \(0, 1\]"):
    hparams_check.check(bad)
  unread = tiny_hparams(learning_rate_cooldown=0.5)
  with pytest.raises(UsageError, match="learning_rate_cooldown=0.5 is read only by the "
                     "linear_cooldown factor, which learning_rate_schedule="):
    hparams_check.check(unread)


def test_the_budget_is_projected_at_the_measured_pace_and_fixed_before_the_cooldown():
  pace = budget.Pace(update=25, time=100.0, schedule=AccumulateSchedule.constant(1))
  assert pace.project(25, 100.0, 1000.0, 10 ** 5) is None  # nothing timed yet
  # 75 updates in 30 s = 2.5 a second; 600 s left -> 1500 x 0.98 = 1470 more
  assert pace.project(100, 130.0, 730.0, 10 ** 5) == 100 + 1470
  assert pace.project(100, 130.0, 730.0, 1000) == 1000  # --train_steps comes first
  assert pace.project(100, 130.0, 120.0, 10 ** 5) == 101  # past the deadline: the next one
  # E = 1570, c = 0.3: L = 471, the cooldown starts at update 1101; checks every 25
  assert not budget.fix_now(1075, 1570, 0.3, 25)
  assert budget.fix_now(1076, 1570, 0.3, 25)


def test_the_projection_counts_the_longer_updates_of_a_later_accumulation_phase():
  """A batch-size ramp: updates after 1000 take 2 micro-steps, so the deadline comes at half
  the pace of updates measured before them."""
  schedule = AccumulateSchedule.parse("1@0;2@1000")
  pace = budget.Pace(update=25, time=100.0, schedule=schedule)
  # 2.5 micro-steps a second; 600 s left -> 1470 more: 900 updates to 1000, then 570 / 2
  assert pace.project(100, 130.0, 730.0, 10 ** 5) == 1000 + 285
  assert pace.project(100, 130.0, 730.0, 1200) == 1200
  assert pace.project(100, 130.0, 120.0, 10 ** 5) == 101
  # measured across the boundary: updates 1001-1100 took 200 micro-steps in 80 s (from 900
  # at 100 s: 300 micro-steps in 80 s); 300 s left -> 1102 more micro-steps, 551 updates
  later = budget.Pace(update=900, time=100.0, schedule=schedule)
  assert later.project(1100, 180.0, 480.0, 10 ** 5) == 1100 + int(0.98 * 3.75 * 300) // 2
  # without accumulation the same figures as by updates
  assert budget.Pace(25, 100.0, AccumulateSchedule.constant(1)).project(
      100, 130.0, 730.0, 10 ** 5) == 1570


def test_budget_checks_are_due_every_interval_until_the_end_is_fixed():
  schedule = Schedule(train_steps=1000, log_every=0, cooldown_every=25)
  assert decide(Progress(tried=25, seen=24), Agreed(), schedule).read
  assert not decide(Progress(tried=26, seen=25), Agreed(), schedule).read
  assert decide(Progress(tried=25, seen=24, applied=25), Agreed(), schedule).project
  # not at a stop, and not for an update that was not applied
  assert not decide(Progress(tried=25, seen=24, applied=25), Agreed(out_of_time=True),
                    schedule).project
  assert not decide(Progress(tried=25, seen=25, applied=25), Agreed(), schedule).project
  fixed = Schedule(train_steps=1000, log_every=0)
  assert not decide(Progress(tried=25, seen=24), Agreed(), fixed).read


class FakeTime:
  """The time a run's budget reads (Trainer's `now`): it moves only after each update, by
  `per_micro_step` seconds for each of the update's micro-steps, so that a budget ends where
  the arithmetic says on any machine. `at(seconds, action)`: once the time reaches it."""

  def __init__(self, per_micro_step: float, schedule=None):
    self.seconds, self.per_micro_step = 0.0, per_micro_step
    self.schedule = schedule or AccumulateSchedule.constant(1)
    self.actions = []

  def __call__(self) -> float:
    return self.seconds

  def at(self, seconds, action) -> None:
    self.actions.append((seconds, action))

  def after_update(self, tried: int) -> None:
    self.seconds += self.per_micro_step * self.schedule.steps_for(tried)
    for seconds, action in list(self.actions):
      if self.seconds >= seconds:
        self.actions.remove((seconds, action))
        action()


def _trainer(output_dir, data_dir, train_steps, minutes=0.0, clock=None, **overrides):
  hparams = tiny_hparams(**{"learning_rate_schedule": SCHEDULE,
                            "learning_rate_warmup_steps": 8, **overrides})
  run = RunOptions(output_dir=str(output_dir), data_dir=data_dir, seed=3,
                   evaluation=Evaluation(frequency=0), log_every=5,
                   checkpointing=Checkpointing(save_steps=0),
                   stopping=Stopping(train_minutes=minutes))
  problem = registry.problem("translate_ende_multi30k")
  hooks = {"now": clock, "after_update": clock.after_update} if clock else {}
  return Trainer(hparams, problem, run_steps(hparams, 1, train_steps), run, **hooks), hparams


def test_a_time_budget_fixes_the_last_update_and_a_resumed_run_keeps_it(multi30k_data,
                                                                        tmp_path):
  """A 12-second budget with an accumulation schedule (2 micro-steps an update after update
  10), at half a second a micro-step. The end is projected from the pace of micro-steps
  through the schedule and fixed; the learning rate logged at the last update is the
  cooldown's; resumed, the run ends at the same update."""
  output_dir = tmp_path / "run"
  accumulate = AccumulateSchedule.parse("1@0;2@10")
  clock = FakeTime(0.5, accumulate)
  trainer, hparams = _trainer(output_dir, multi30k_data, 10 ** 5, minutes=0.2, clock=clock,
                              optimizer_multistep_accumulate_schedule=str(accumulate))
  first = trainer.train()
  # the projection counts the longer updates
  assert trainer.milestones.run_end.pace.schedule == accumulate
  assert first["micro_steps"] == accumulate.micro_steps(first["updates"]), first
  # Checked after updates 5 (the pace starts; 4 micro-steps timed) and 10 (9 micro-steps):
  # 2 micro-steps a second; 7.5 s left allow 0.98 x 15 = 14 more micro-steps, 24 in all:
  # 7 updates of 2 after update 10, so the end is 17, whose cooldown (6 updates) would start
  # at update 13, before the next check: fixed at update 10.
  end = int(trainer.learner.cooldown_end.numpy())
  assert end == 17 and first["updates"] == 17, first
  assert first["stop_reason"] == "the learning-rate cooldown's last update (17) reached"
  length = budget.cooldown_length(end, hparams.learning_rate_cooldown)
  rates = dict(_scalars(output_dir / "train")["learning_rate"])
  assert rates[17] == pytest.approx(_rate(hparams, 17, end), rel=1e-5)
  assert rates[17] == pytest.approx(_rate(hparams, 17) / length, rel=1e-5)

  resumed, _ = _trainer(output_dir, multi30k_data, 10 ** 5, minutes=0.2, clock=clock,
                        optimizer_multistep_accumulate_schedule=str(accumulate))
  second = resumed.train()
  assert int(resumed.learner.cooldown_end.numpy()) == end
  assert second["updates"] == end
  assert second["stop_reason"] == f"the learning-rate cooldown's last update ({end}) reached"


def test_without_a_budget_the_cooldown_ends_at_train_steps_and_stays_there(multi30k_data,
                                                                          tmp_path):
  trainer, hparams = _trainer(tmp_path / "run", multi30k_data, 4)
  assert trainer.train()["stop_reason"] == "train_steps reached"
  assert int(trainer.learner.cooldown_end.numpy()) == 4
  rates = dict(_scalars(tmp_path / "run" / "train")["learning_rate"])
  # L = ceil(0.3 x 4) = 2: update 4 at half the rate
  assert rates[4] == pytest.approx(_rate(hparams, 4) / 2, rel=1e-5)
  longer, _ = _trainer(tmp_path / "run", multi30k_data, 8)
  result = longer.train()
  assert result["updates"] == 4
  assert result["stop_reason"] == "the learning-rate cooldown's last update (4) reached"


def test_a_budget_split_over_two_processes_counts_the_runs_training_time(multi30k_data,
                                                                         tmp_path):
  """--train_minutes counts the run's training time over its processes: a 9-second budget
  (half a second an update) whose first process is stopped (SIGTERM) at 3 seconds continues
  in the second for the time left, whose projection fixes the cooldown's end from there; the
  checkpoint holds the run's time, and a third process, its budget spent, trains no more."""
  import signal
  import tensorflow as tf
  output_dir = tmp_path / "run"
  clock = FakeTime(0.5)
  first, _ = _trainer(output_dir, multi30k_data, 10 ** 5, minutes=0.15, clock=clock)
  clock.at(3.0, lambda: first.stops.request(signal.SIGTERM))
  stopped = first.train()
  assert stopped["stop_reason"] == "signal 15" and int(first.learner.cooldown_end.numpy()) == 0

  def recorded(result):
    return float(tf.train.load_checkpoint(result["checkpoint"]).get_tensor(
        "train_seconds/.ATTRIBUTES/VARIABLE_VALUE"))

  # asked after update 6 (3 s), the stop comes after update 7, saved as it read 3 s
  assert stopped["updates"] == 7 and recorded(stopped) == 3.0, stopped
  second, hparams = _trainer(output_dir, multi30k_data, 10 ** 5, minutes=0.15, clock=clock)
  result = second.train()
  end = int(second.learner.cooldown_end.numpy())
  length = budget.cooldown_length(end, hparams.learning_rate_cooldown)
  # the second process has 6 s: 12 more updates at most; its projection fixes the end
  assert stopped["updates"] < end - length < result["updates"] <= end <= 7 + 12, (end, result)
  assert recorded(result) <= 9.0  # the run's time, of which this process's is the rest:
  assert result["train_seconds"] == pytest.approx(recorded(result) - 3.0, abs=0.5)
  # Without the cooldown (which ends it at its last update), a run whose budget is spent
  # stops before its first update.
  spent_up, _ = _trainer(output_dir, multi30k_data, 10 ** 5, minutes=0.05, clock=clock,
                         learning_rate_schedule=SCHEDULE.replace("*linear_cooldown", ""))
  again = spent_up.train()
  assert again["updates"] == result["updates"] and again["micro_steps"] == result["micro_steps"]
  assert again["stop_reason"] == "time budget of 0.05 minutes reached"
