"""What follows an update: log, save, evaluate, stop, and why. Pure Python, no TensorFlow.

The training loop asks `decide` after every update and does what it answers. The answer is
a function of values every worker of a cluster holds identically, never of a clock, a
signal or the chief's role:

- the update counts (`Progress`): updates tried, counted on the host, and updates applied,
  read from the device's statistics window (a skipped non-finite update is tried but not
  applied);
- the agreed flags (`Agreed`): what any worker asked for (a stop signal, the time budget,
  a timed save), summed over all workers in the update's cross-replica sum, and whether the
  last evaluation, shared by the chief, says to stop early;
- the options, the same on every worker.

So every worker enters the same collectives (window read, save, evaluation) at the same
update, and a cluster cannot split into workers that wait for each other in different ones.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from t2t_lite.training.options import Checkpointing, Evaluation, Stopping

TRAIN_STEPS = "train_steps reached"
EARLY_STOP = "early stopping"
SIGNAL = "signal"
TIME_BUDGET = "time budget reached"


@dataclass(frozen=True)
class Schedule:
  """Everything `decide` reads: the run's length in updates and the option groups."""
  train_steps: int
  stopping: Stopping = Stopping()
  checkpointing: Checkpointing = Checkpointing()
  evaluation: Evaluation = Evaluation()
  log_every: int = 100            # updates; 0 = only the last update
  # Every this many updates, the time budget is projected to the learning-rate cooldown's
  # last update (see t2t_lite.training.budget); 0 = not (no cooldown, or its end is fixed).
  cooldown_every: int = 0


@dataclass(frozen=True)
class Progress:
  """The update counts after an update. `applied` is None until the window is read at this
  update; `seen` is the applied count of the read before."""
  tried: int
  seen: int
  applied: int | None = None

  def next(self, completed: bool) -> Progress:
    """The counts once another update ran (`completed`) or was cut short by a stop."""
    seen = self.seen if self.applied is None else self.applied
    tried = (self.tried if self.applied is None else self.applied) + int(completed)
    return Progress(tried=tried, seen=seen)


@dataclass(frozen=True)
class Agreed:
  """Flags every worker holds identically (see the module docstring)."""
  signal: bool = False
  out_of_time: bool = False
  timed_save: bool = False
  early_stop: bool = False

  def with_early_stop(self) -> Agreed:
    return dataclasses.replace(self, early_stop=True)


@dataclass(frozen=True)
class Actions:
  """What to do, in this order: read the window, log, project the time budget to the
  cooldown's end (`project`), save, evaluate, stop (with why)."""
  read: bool = False
  log: bool = False
  project: bool = False
  save: bool = False
  evaluate: bool = False
  stop: str | None = None


def every(count: int, update: int) -> bool:
  """Whether `update` is one of every `count` updates (count 0: never)."""
  return count > 0 and update % count == 0


def decide(progress: Progress, agreed: Agreed, schedule: Schedule) -> Actions:
  """What follows the update that brought the counts to `progress`.

  Before the window is read (`progress.applied` is None) the answer is at most a read: it
  is due at updates due for a log line, a budget check, a save, an evaluation or the end,
  and whenever a stop or a timed save was agreed. Once read, actions keyed to an
  update number wait for the update that really reaches it: after skipped updates, the
  applied count is lower than the count tried, and nothing is due until an applied update
  is new. A stop always saves (the final checkpoint), and so does an evaluation, before it
  evaluates (as tensor2tensor evaluates saved checkpoints): an evaluation that fails loses no
  update, on any worker.
  """
  checkpointing = schedule.checkpointing
  frequency = schedule.evaluation.frequency
  stop_agreed = agreed.signal or agreed.out_of_time or agreed.early_stop
  if progress.applied is None:
    tried = progress.tried
    due = (tried >= schedule.train_steps or every(schedule.log_every, tried) or
           every(checkpointing.save_steps, tried) or every(frequency, tried) or
           every(schedule.cooldown_every, tried))
    # A save always follows a read: a divergence the device noticed is acted on first
    # (training.recovery), so no checkpoint holds weights past one.
    if due or stop_agreed or agreed.timed_save:
      return Actions(read=True)
    return Actions()
  update = progress.applied
  fresh = update > progress.seen
  stop = (TRAIN_STEPS if update >= schedule.train_steps else EARLY_STOP if agreed.early_stop
          else SIGNAL if agreed.signal else TIME_BUDGET if agreed.out_of_time else None)
  evaluate = fresh and every(frequency, update)
  return Actions(
      log=fresh and (every(schedule.log_every, update) or stop is not None),
      project=fresh and stop is None and every(schedule.cooldown_every, update),
      save=(fresh and every(checkpointing.save_steps, update)) or evaluate
      or agreed.timed_save or stop is not None,
      evaluate=evaluate,
      stop=stop)
