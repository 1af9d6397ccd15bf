"""What follows an update (t2t_lite.decide): a pure function, tested without TensorFlow."""

import os
import subprocess
import sys

from t2t_lite.training.decide import (EARLY_STOP, SIGNAL, TIME_BUDGET, TRAIN_STEPS, Actions, Agreed,
                                      Progress, Schedule, decide)
from t2t_lite.training.options import Checkpointing, Evaluation

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The reproduction of the cluster crash: evaluation every 5 updates, log lines every 4.
SCHEDULE = Schedule(train_steps=12, log_every=4, checkpointing=Checkpointing(save_steps=0),
                    evaluation=Evaluation(frequency=5))
NOTHING = Agreed()


def run(schedule, agreed_at=None, skipped=(), start=0):
  """Drives `decide` as the training loop does, from update `start` until it says stop: the
  window is read when asked, and the updates attempted in `skipped` (1-based attempt
  numbers) are not applied. `agreed_at`: the agreed flags after an attempt. Returns
  [(attempt, actions)] of the attempts that did something, and the stop."""
  agreed_at = agreed_at or {}
  applied = start
  progress = Progress(tried=start, seen=start, applied=start)
  done = []
  for attempt in range(1, 100):
    applied += attempt not in skipped
    progress = progress.next(True)
    agreed = agreed_at.get(attempt, NOTHING)
    actions = decide(progress, agreed, schedule)
    if actions.read:
      progress = Progress(progress.tried, progress.seen, applied=applied)
      actions = decide(progress, agreed, schedule)
    if actions != Actions():
      done.append((attempt, actions))
    if actions.stop:
      return done, actions.stop
  raise AssertionError("never stopped")


def test_decide_needs_no_tensorflow():
  code = ("import sys, t2t_lite.training.decide; "
          "sys.exit('tensorflow' in sys.modules or 'numpy' in sys.modules)")
  assert subprocess.run([sys.executable, "-c", code], cwd=REPO).returncode == 0


def test_an_evaluation_off_log_and_save_updates_reads_the_window_first():
  """Update 5 is due for an evaluation only: the window is read there too, on every worker
  (the crash: only the chief read it, and the workers' collectives did not match)."""
  progress = Progress(tried=5, seen=4)
  assert decide(progress, NOTHING, SCHEDULE) == Actions(read=True)
  assert decide(Progress(5, 4, applied=5), NOTHING, SCHEDULE) == Actions(save=True,
                                                                         evaluate=True)
  done, stop = run(SCHEDULE)
  assert [(u, a.log, a.evaluate, a.save) for u, a in done] == [
      (4, True, False, False), (5, False, True, True), (8, True, False, False),
      (10, False, True, True), (12, True, False, True)]
  assert stop == TRAIN_STEPS


def test_every_evaluation_comes_after_a_save_of_its_update():
  """Saves every 3 updates, evaluations every 2: the evaluated updates are saved too (the
  loop saves before it evaluates), the others only when due."""
  schedule = Schedule(train_steps=6, log_every=0, checkpointing=Checkpointing(save_steps=3),
                      evaluation=Evaluation(frequency=2))
  done, _ = run(schedule)
  assert [(u, a.save, a.evaluate) for u, a in done] == [
      (2, True, True), (3, True, False), (4, True, True), (6, True, True)]


def test_nothing_is_read_between_due_updates():
  schedule = Schedule(train_steps=10, log_every=5, checkpointing=Checkpointing(save_steps=0),
                      evaluation=Evaluation(frequency=0))
  for tried in (1, 2, 3, 4, 6, 9):
    assert decide(Progress(tried, 0), NOTHING, schedule) == Actions()


def test_a_timed_save_reads_first():
  """A save always follows a read of the window, so that a divergence the device noticed
  is acted on before anything is saved (training.recovery)."""
  schedule = Schedule(train_steps=10, log_every=5, evaluation=Evaluation(frequency=0))
  assert decide(Progress(3, 0), Agreed(timed_save=True), schedule) == Actions(read=True)
  assert decide(Progress(3, 0, applied=3), Agreed(timed_save=True), schedule) == Actions(
      save=True)
  done, _ = run(schedule, agreed_at={3: Agreed(timed_save=True)})
  assert done[0] == (3, Actions(save=True))


def test_a_stop_signal_reads_logs_and_saves():
  done, stop = run(SCHEDULE, agreed_at={2: Agreed(signal=True)})
  assert done == [(2, Actions(log=True, save=True, stop=SIGNAL))] and stop == SIGNAL


def test_the_time_budget_stops_at_the_update_it_is_agreed():
  done, stop = run(SCHEDULE, agreed_at={7: Agreed(out_of_time=True)})
  assert done[-1] == (7, Actions(log=True, save=True, stop=TIME_BUDGET))


def test_early_stopping_after_an_evaluation_and_on_resume():
  """The evaluation's verdict, shared by the chief, is decided on at once; a resumed run
  that had stopped early stays stopped; the end of the run comes first."""
  progress = Progress(5, 5, applied=5)
  assert decide(progress, Agreed(early_stop=True), SCHEDULE) == Actions(save=True,
                                                                         stop=EARLY_STOP)
  assert decide(Progress(12, 12, 12), Agreed(early_stop=True), SCHEDULE).stop == TRAIN_STEPS
  assert decide(Progress(0, 0, 0), NOTHING, SCHEDULE) == Actions()


def test_actions_wait_for_the_update_that_really_reaches_them():
  """Update 4 (tried) was skipped: the 4th applied update is the 5th tried, and its log line
  comes then; the run ends once 12 updates are applied, at the 13th tried."""
  done, stop = run(SCHEDULE, skipped={4})
  assert [(u, a.log, a.evaluate) for u, a in done if a.log or a.evaluate] == [
      (5, True, False), (6, False, True), (9, True, False), (11, False, True),
      (13, True, False)]
  assert stop == TRAIN_STEPS
  # a read at a due update that found no new applied update does nothing else
  assert decide(Progress(4, 3, applied=3), NOTHING, SCHEDULE) == Actions()


def test_a_run_resumed_at_its_end_stops_at_once():
  assert decide(Progress(12, 12, 12), NOTHING, SCHEDULE) == Actions(save=True,
                                                                    stop=TRAIN_STEPS)


FLAGS = ("signal", "out_of_time", "timed_save")


def _summed(asked_by_worker: dict) -> dict:
  """What every worker reads after each update: the cross-replica sum of the flags each
  worker sent with it (those it raised after the update before), as learner.read_agreed
  turns the sum into flags."""
  updates = {update + 1 for asked in asked_by_worker.values() for update in asked}
  summed = {}
  for update in updates:
    sent = [asked.get(update - 1, NOTHING) for asked in asked_by_worker.values()]
    totals = [sum(float(getattr(flags, name)) for flags in sent) for name in FLAGS]
    summed[update] = Agreed(*(total > 0 for total in totals))
  return summed


def test_two_workers_act_together_on_what_each_asked_alone():
  """After update 3 worker 0's timed save is due and worker 1 wants one too; after update 6
  worker 1 gets SIGTERM while worker 0's time budget runs out. Each sends its flags in the
  next update's sum: both save once after update 4, and both act on the signal and the
  budget together after update 7 (the signal named), where alone they would have stopped
  at 6."""
  local = {0: {3: Agreed(timed_save=True), 6: Agreed(out_of_time=True)},
           1: {3: Agreed(timed_save=True), 6: Agreed(signal=True)}}
  summed = _summed(local)
  assert summed == {4: Agreed(timed_save=True), 7: Agreed(signal=True, out_of_time=True)}
  together = [run(SCHEDULE, agreed_at=summed) for _ in local]
  assert together[0] == together[1]
  assert together[0][0] == [(4, Actions(log=True, save=True)),
                            (5, Actions(save=True, evaluate=True)),
                            (7, Actions(log=True, save=True, stop=SIGNAL))], together
  alone = [run(SCHEDULE, agreed_at=local[worker]) for worker in local]
  assert [stop for _, stop in alone] == [TIME_BUDGET, SIGNAL]
  assert [done[-1][0] for done, _ in alone] == [6, 6]
