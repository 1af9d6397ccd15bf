"""Fault injection for the reliability tests, behind one seam.

`T2T_LITE_FAULT` chooses one fault for this process:
  micro:K   SIGKILL right after micro-step K (mid-accumulation when K is not a multiple of n);
  save:K    SIGKILL inside this process's K-th checkpoint save, after the files are written
            and before the checkpoint state names them (the worst moment of a save);
  signal:K  after micro-step K, behave as if SIGTERM had arrived (a stop at a known point);
  nospace:K this process's K-th checkpoint save fails as on a full disk (OSError ENOSPC);
  raise:K   after micro-step K, raise a RuntimeError (a failure outside the compiled steps);
  evaluate:K  SIGKILL as this process's K-th evaluation begins (its update saved, not yet
            evaluated);
  nan:K,L,...  poison the loss of micro-steps K, L, ... (1-based) with NaN, so the
            non-finite guard and the loss scale can be tested on real runs;
  export:written  SIGKILL once an export is complete in its temporary directory, just
            before it is renamed into place.
  datagen:written  SIGKILL once a datagen's files are all written, just before its
            manifest is renamed into place.
Production code always calls `loss`, `after_micro_step`, `save`, `evaluating`,
`export_written` and `datagen_written`;
without the variable they are the plain versions, so no code path branches on faults (`loss`
is applied when the step is traced: without a nan fault the traced graph is unchanged).
"""

from __future__ import annotations

import errno
import os
import signal

ENV = "T2T_LITE_FAULT"


class NoFaults:
  """The production behaviour."""

  def loss(self, loss, micro_step):
    """The loss of the micro-step numbered `micro_step` (1-based; a tensor), as traced."""
    return loss

  def after_micro_step(self, micro_step: int, request_stop) -> None:
    """Called after every micro-step; `request_stop(signum)` asks the loop to stop."""

  def save(self, manager, checkpoint, number: int) -> str:
    return manager.save(checkpoint_number=number)

  def evaluating(self) -> None:
    """Called as an evaluation during training begins."""

  def export_written(self) -> None:
    """Called when an export is complete, before it is renamed into place."""

  def datagen_written(self) -> None:
    """Called when a datagen's files are written, before its manifest is renamed into
    place."""


class InjectedFault(NoFaults):
  def __init__(self, kind: str, at):
    """`at`: a micro-step or save number; for kind "nan", the poisoned micro-steps."""
    self.kind, self.at = kind, at
    self._saves = self._evaluations = 0

  def loss(self, loss, micro_step):
    if self.kind != "nan":
      return loss
    import tensorflow as tf
    poisoned = tf.reduce_any(tf.equal(tf.cast(micro_step, tf.int64),
                                      tf.constant(self.at, tf.int64)))
    return loss * tf.where(poisoned, float("nan"), 1.0)

  def after_micro_step(self, micro_step: int, request_stop) -> None:
    if micro_step == self.at and self.kind == "micro":
      os.kill(os.getpid(), signal.SIGKILL)
    if micro_step == self.at and self.kind == "signal":
      request_stop(signal.SIGTERM)
    if micro_step == self.at and self.kind == "raise":
      raise RuntimeError(f"injected failure after micro-step {micro_step}")

  def save(self, manager, checkpoint, number: int) -> str:
    self._saves += 1
    if self.kind == "save" and self._saves == self.at:
      checkpoint.write(os.path.join(manager.directory, f"ckpt-{number}"))
      os.kill(os.getpid(), signal.SIGKILL)
    if self.kind == "nospace" and self._saves == self.at:
      raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC),
                    os.path.join(manager.directory, f"ckpt-{number}"))
    return super().save(manager, checkpoint, number)

  def evaluating(self) -> None:
    self._evaluations += 1
    if self.kind == "evaluate" and self._evaluations == self.at:
      os.kill(os.getpid(), signal.SIGKILL)

  def export_written(self) -> None:
    if self.kind == "export":
      os.kill(os.getpid(), signal.SIGKILL)

  def datagen_written(self) -> None:
    if self.kind == "datagen":
      os.kill(os.getpid(), signal.SIGKILL)


def from_environment() -> NoFaults:
  spec = os.environ.get(ENV, "")
  if not spec:
    return NoFaults()
  if spec in ("export:written", "datagen:written"):
    return InjectedFault(spec.split(":")[0], 0)
  kind, _, at = spec.partition(":")
  if kind == "nan" and at and all(step.isdigit() for step in at.split(",")):
    return InjectedFault(kind, tuple(int(step) for step in at.split(",")))
  if kind not in ("micro", "save", "signal", "nospace", "raise", "evaluate") or not at.isdigit():
    raise ValueError(f"{ENV}={spec!r}: expected micro:K, save:K, signal:K, nospace:K, "
                     "raise:K, evaluate:K, nan:K,L,..., export:written or datagen:written")
  return InjectedFault(kind, int(at))
