"""The last update of a run with a learning-rate cooldown. Pure Python, no TensorFlow.

A schedule with the `linear_cooldown` factor (see optimize.learning_rate) falls to 0 over
the last updates of the run, so it needs the run's last update E. With `--train_steps`
alone, E = train_steps, fixed when the run starts. With a time budget (`--train_minutes`),
E is the update the budget reaches: the loop measures the pace of its updates (saves and
evaluations included) and projects it to the deadline at regular checks. Until the cooldown
starts the factor is 1 and E is not needed, so the projection is refined at every check
and fixed at the last check before the projected cooldown would start. Once fixed, E is
held in the checkpoint: a resumed run keeps it, and its learning rates are those of a run
never stopped. The run stops at E (or at the deadline, if that comes first).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

# The projection keeps this share of the updates the remaining time allows at the measured
# pace: the last save and the stop take a little time, and a run that reaches E a few updates
# before the deadline loses less than one cut off above the learning-rate floor.
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
  """Updates per second since a reference check of this process."""
  update: int
  time: float

  def rate(self, update: int, now: float) -> float | None:
    """Updates per second since the reference; None before any update was timed."""
    if update <= self.update or now <= self.time:
      return None
    return (update - self.update) / (now - self.time)

  def project(self, update: int, now: float, deadline: float, train_steps: int) -> int | None:
    """The update the deadline is reached at, at the pace since the reference (at most
    `train_steps`); None before any update was timed."""
    rate = self.rate(update, now)
    if rate is None:
      return None
    ahead = int(MARGIN * rate * max(deadline - now, 0.0))
    return min(update + max(ahead, 1), train_steps)


def fix_now(update: int, projected: int, fraction: float, every: int) -> bool:
  """Whether a check at `update` must fix the end at `projected`: the next check (`every`
  updates on) would come after the cooldown of a run ending there has started."""
  return update + every >= cooldown_start(projected, fraction)
