"""The last update of a run with a learning-rate cooldown. Pure Python, no TensorFlow.

A schedule with the `linear_cooldown` factor (see optimize.learning_rate) falls to 0 over
the last updates of the run, so it needs the run's last update E. With `--train_steps`
alone, E = train_steps, fixed when the run starts. With a time budget (`--train_minutes`),
E is the update the budget reaches: the loop measures the pace of its micro-steps (saves
and evaluations included) and projects it to the deadline at regular checks; with an
accumulation schedule an update costs its phase's n micro-steps, so a projection that
crosses a phase boundary counts the later, longer updates at their cost. Until the cooldown
starts the factor is 1 and E is not needed, so the projection is refined at every check
and fixed at the last check before the projected cooldown would start. Once fixed, E is
held in the checkpoint: a resumed run keeps it, and its learning rates are those of a run
never stopped. The run stops at E (or at the deadline, if that comes first).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from t2t_lite.steps import AccumulateSchedule

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
