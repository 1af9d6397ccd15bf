"""When a run stops, and what every worker acts on after an update.

`StopRequests` takes the stop signals (SIGINT, SIGTERM, or a fault's) and says whether a stop
may cut an update short; `Agreement` turns each process's flags (a stop signal, the time
budget, a timed save; see budget.Clock.flags) into what all workers act on, so that every
worker enters the same collectives (see t2t_lite.training.decide).
"""

from __future__ import annotations

import contextlib
import signal

from absl import logging

from t2t_lite.training.budget import Clock
from t2t_lite.training.decide import Agreed
from t2t_lite.training.learner import NO_FLAGS


class StopRequests:
  """Stop signals (SIGINT, SIGTERM, or a fault's), and whether a stop may cut an update
  short: `mid_update` for one replica in one process; replicas save only between updates
  (replica-local accumulators are not checkpointed)."""

  def __init__(self, mid_update: bool, replicas: int, faults):
    self.mid_update, self.replicas, self.faults = mid_update, replicas, faults
    self.signal = None  # the first signal received

  def request(self, signum: int) -> None:
    if self.signal is not None:  # a second Ctrl-C stops at once
      raise KeyboardInterrupt
    self.signal = signum
    logging.warning("received signal %d: finishing this %s and saving", signum,
                    "micro-step" if self.mid_update else
                    f"update ({self.replicas} replicas save only between updates)")

  def after_micro_step(self, micro_step: int) -> bool:
    """Whether to cut the update short after this micro-step (a stop signal)."""
    self.faults.after_micro_step(micro_step, self.request)
    return self.signal is not None and self.mid_update

  @contextlib.contextmanager
  def handling_signals(self):
    """SIGINT and SIGTERM ask for a stop while the block runs."""
    previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    for s in previous:
      signal.signal(s, lambda signum, frame: self.request(signum))
    try:
      yield
    finally:
      for s, handler in previous.items():
        signal.signal(s, handler)


class Agreement:
  """What every worker acts on. One process acts on its own flags (see Clock.flags) at
  once. Several workers send theirs in the next update's cross-replica sum and all act on
  that sum, read after the update from each worker's own copy of it (no extra collective).
  A worker's flags are taken after it has done what the last update asked (a save, say), so
  that it does not ask again for what was just done."""

  def __init__(self, learner, multi_worker: bool, clock: Clock, signalled):
    self.learner, self.multi_worker, self.clock = learner, multi_worker, clock
    self.signalled = signalled  # () -> whether this process got a stop signal
    self.outgoing = NO_FLAGS

  def after_update(self) -> Agreed:
    """The flags to act on after this update."""
    if not self.multi_worker:
      return Agreed(*(bool(flag) for flag in self.clock.flags(self.signalled())))
    return Agreed(*self.learner.read_agreed())

  def before_next_update(self) -> None:
    """Several workers: this process's flags, sent with the next update."""
    if self.multi_worker:
      self.outgoing = self.clock.flags(self.signalled())
