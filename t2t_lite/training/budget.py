"""The time budget of a run (--train_minutes), in one place: the clock, the projection of
the run's last update, and fixing it. Pure Python, no TensorFlow.

`Clock` keeps the run's training time over all its processes (the part spent by earlier
processes is recorded in the checkpoints), timed saves, and the time tokens/s is measured
over (saves and evaluations left out).

A schedule with the `linear_cooldown` factor (see optimize.learning_rate) falls to 0 over
the last updates of the run, so it needs the run's last update E. With `--train_steps`
alone, E = train_steps, fixed when the run starts. With a time budget (`--train_minutes`),
E is the update the budget reaches: the loop measures the pace of its micro-steps (saves
and evaluations included) and projects it to the deadline at regular checks; with an
accumulation schedule an update costs its phase's n micro-steps, so a projection that
crosses a phase boundary counts the later, longer updates at their cost. Until the cooldown
starts the factor is 1 and E is not needed, so the projection is refined at every check
and fixed at the last check before the projected cooldown would start (`RunEnd`). Once
fixed, E is held in the checkpoint: a resumed run keeps it, and its learning rates are
those of a run never stopped. The run stops at E (or at the deadline, if that comes first).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

from absl import logging

from t2t_lite.training.steps import AccumulateSchedule

# The run's training time in seconds over all its processes, which --train_minutes budgets
# (its name in the checkpoint).
TRAIN_SECONDS = "train_seconds"
# The projection keeps this share of the micro-steps the remaining time allows at the
# measured pace: the last save and the stop take a little time, and a run that reaches E a few
# updates before the deadline loses less than one cut off above the learning-rate floor.
MARGIN = 0.98


def cooldown_length(end: int, fraction: float) -> int:
  """How many updates the cooldown of a run ending at update `end` spans (as
  optimize.cooldown_length)."""
  return max(math.ceil(fraction * end), 1)


def cooldown_start(end: int, fraction: float) -> int:
  """The first update whose learning rate is below the schedule without the cooldown."""
  return end + 2 - cooldown_length(end, fraction)


@dataclass
class Pace:
  """The pace since a reference check of this process, at which the run's `schedule` (the
  micro-steps of each update) is projected."""
  update: int
  time: float
  schedule: AccumulateSchedule

  def rate(self, update: int, now: float) -> float | None:
    """Updates per second since the reference; None before any update was timed."""
    if update <= self.update or now <= self.time:
      return None
    return (update - self.update) / (now - self.time)

  def project(self, update: int, now: float, deadline: float, train_steps: int) -> int | None:
    """The update the deadline is reached at, at the pace of micro-steps since the reference
    (at most `train_steps`, at least the next update); None before any update was timed."""
    if self.rate(update, now) is None:
      return None
    done = self.schedule.micro_steps(update)
    per_second = (done - self.schedule.micro_steps(self.update)) / (now - self.time)
    reachable = done + int(MARGIN * per_second * max(deadline - now, 0.0))
    return min(max(self.schedule.last_update_within(reachable, train_steps), update + 1),
               train_steps)


def fix_now(update: int, projected: int, fraction: float, every: int) -> bool:
  """Whether a check at `update` must fix the end at `projected`: the next check (`every`
  updates on) would come after the cooldown of a run ending there has started."""
  return update + every >= cooldown_start(projected, fraction)


@dataclass(frozen=True)
class Check:
  """A check of the time budget: its update, what it projected (0: no projection yet), and
  whether it fixed the run's end there."""
  update: int
  projected: int
  rate_per_minute: float
  fixed: bool = False


class RunEnd:
  """The run's last update when its learning-rate schedule cools down: --train_steps without
  a time budget, else projected from the budget's pace at checks every log interval and
  fixed before the cooldown would start (see the module docstring). The fixed end is the
  learner's `cooldown_end`, in the checkpoint."""

  def __init__(self, hparams, train_steps: int, stopping, log_every: int, learner,
               output_dir: str):
    """`stopping`: options.Stopping (its train_minutes); `learner`: its cooldown_end."""
    self.hparams, self.train_steps, self.learner = hparams, train_steps, learner
    self.train_minutes, self.log_every, self.output_dir = (stopping.train_minutes, log_every,
                                                            output_dir)
    self.end = 0  # the host's mirror of a fixed end (0: none, or not yet)
    self.check_every = 0  # updates between budget checks while the end is not fixed
    self.pace = None  # since the first budget check

  def start(self, update: int) -> None:
    """The end as recorded in the checkpoint, or fixed now (--train_steps without a budget),
    or the checks that will fix it."""
    learner = self.learner
    if not learner.cooldown:
      return
    end, source = int(learner.cooldown_end.numpy()), "recorded in the run"
    if end == 0 and not self.train_minutes:
      end, source = self.train_steps, "--train_steps"
      learner.fix_cooldown_end(end)
    if end == 0:
      self.check_every = self.log_every or 25
      logging.info("learning-rate cooldown over the last %g of the updates that the time "
                   "budget allows, projected every %d updates until it starts",
                   self.hparams.learning_rate_cooldown, self.check_every)
      return
    self._fixed(end, source)
    if end < self.train_steps and update >= end:
      logging.info("this run ended at update %d, the end of its learning-rate cooldown; to "
                   "train longer, start a new run with --warm_start_from=%s", end,
                   self.output_dir)

  def _fixed(self, end: int, source: str) -> None:
    self.end, self.check_every = end, 0
    fraction = self.hparams.learning_rate_cooldown
    logging.info("learning-rate cooldown: updates %d-%d, falling to 0 after update %d (%s)",
                 cooldown_start(end, fraction), end, end, source)

  def check(self, update: int, now: float, deadline: float, agree) -> Check:
    """Projects the run's last update from the pace since the first check; `agree(value)`
    is the chief's projection on every worker. Fixes the end at the last check before the
    cooldown would start."""
    if self.pace is None:
      self.pace = Pace(update, now, self.learner.schedule)
      return Check(update, 0, 0.0)
    projected = int(agree(self.pace.project(update, now, deadline, self.train_steps) or 0))
    fraction = self.hparams.learning_rate_cooldown
    final = bool(projected) and fix_now(update, projected, fraction, self.check_every)
    rate = (self.pace.rate(update, now) or 0.0) * 60
    if final:
      self.learner.fix_cooldown_end(projected)
      self._fixed(projected, f"the time budget's projection at update {update}, "
                  f"{rate:.0f} updates a minute")
    return Check(update, projected, rate, final)


class Clock:
  """This process's clocks: the time budget (the run's training time, `spent_before` by
  its earlier processes and recorded in its checkpoints), timed saves, and the training time
  that tokens/s is measured over (saves and evaluations excluded). The time budget counts
  wall time: saves and evaluations included. `now()` reads the time (time.time; a test's
  own clock makes a budget exact)."""

  def __init__(self, train_minutes: float, save_secs: float, spent_before: float = 0.0,
               now=time.time):
    self.now = now
    self.start = self.window_start = self.last_save = now()
    self.spent_before = spent_before
    self.deadline = (self.start + train_minutes * 60 - spent_before if train_minutes > 0
                     else None)
    self.save_secs = save_secs

  def spent(self) -> float:
    """The run's training time so far, this process's included."""
    return self.spent_before + self.now() - self.start

  def flags(self, signalled: bool) -> tuple[float, float, float]:
    """This process's (stop signal, time budget reached, timed save due). A timed save is
    asked for once; the clock restarts when it is asked (the save follows within an
    update), so workers that act on it an update later do not ask twice."""
    now = self.now()
    out_of_time = self.deadline is not None and now >= self.deadline
    timed_save = self.save_secs > 0 and now - self.last_save >= self.save_secs
    if timed_save:
      self.last_save = now
    return float(signalled), float(out_of_time), float(timed_save)

  def saved(self, since: float) -> None:
    self.last_save = self.now()
    self.paused(since)

  def paused(self, since: float) -> None:
    """Time since `since` was not training: tokens/s leaves it out."""
    self.window_start += self.now() - since

  def spent_up(self) -> bool:
    """Whether the time budget is reached."""
    return self.deadline is not None and self.now() >= self.deadline

  def take_window(self) -> tuple[float, float]:
    """(now, the training time since the last call: saves and evaluations left out), and a
    new window from now."""
    now = self.now()
    elapsed = max(now - self.window_start, 1e-9)
    self.window_start = now
    return now, elapsed
