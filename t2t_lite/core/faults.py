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
            non-finite guard and the loss scale can be tested on real runs (the gradient
            only: under float16 loss scaling, an overflow);
  spike:K,L,...  multiply the loss of micro-steps K, L, ... by 30, gradient included (a
            finite loss spike, for the divergence detector);
  rollback:K  SIGKILL right after this process's K-th rollback of a diverging run (the
            checkpoint restored, the batches to skip not yet reached);
  export:written  SIGKILL once an export is complete in its temporary directory, just
            before it is renamed into place.
  datagen:written  SIGKILL once a datagen's files are all written, just before its
            manifest is renamed into place.
Several faults are joined by ";" (`spike:7;micro:10`), each acting as if alone.
Production code always calls `loss`, `after_micro_step`, `save`, `evaluating`,
`rolled_back`, `export_written` and `datagen_written`;
without the variable they are the plain versions, so no code path branches on faults (`loss`
is applied when the step is traced: without a nan fault the traced graph is unchanged).
"""

from __future__ import annotations

import errno
import os
import signal

ENV = "T2T_LITE_FAULT"
SPIKE_FACTOR = 30.0


class NoFaults:
  """The production behaviour."""

  def loss(self, loss, micro_step):
    """The loss of the micro-step numbered `micro_step` (1-based; a tensor), as traced, that
    the gradient is taken of."""
    return loss

  def reported_loss(self, loss, micro_step):
    """The loss that micro-step reports (counted in the update's loss), as traced."""
    return loss

  def after_micro_step(self, micro_step: int, request_stop) -> None:
    """Called after every micro-step; `request_stop(signum)` asks the loop to stop."""

  def save(self, manager, checkpoint, number: int) -> str:
    return manager.save(checkpoint_number=number)

  def evaluating(self) -> None:
    """Called as an evaluation during training begins."""

  def rolled_back(self) -> None:
    """Called when a diverging run has restored the checkpoint it rolls back to."""

  def export_written(self) -> None:
    """Called when an export is complete, before it is renamed into place."""

  def datagen_written(self) -> None:
    """Called when a datagen's files are written, before its manifest is renamed into
    place."""


class InjectedFault(NoFaults):
  def __init__(self, kind: str, at):
    """`at`: a micro-step or save number; for kind "nan", the poisoned micro-steps."""
    self.kind, self.at = kind, at
    self._saves = self._evaluations = self._rollbacks = 0

  def loss(self, loss, micro_step):
    if self.kind not in ("nan", "spike"):
      return loss
    import tensorflow as tf
    poisoned = tf.reduce_any(tf.equal(tf.cast(micro_step, tf.int64),
                                      tf.constant(self.at, tf.int64)))
    return loss * tf.where(poisoned, float("nan") if self.kind == "nan" else SPIKE_FACTOR, 1.0)

  def reported_loss(self, loss, micro_step):
    """The loss the update reports: a spike's, poisoned as its gradient is."""
    return self.loss(loss, micro_step) if self.kind == "spike" else loss

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

  def rolled_back(self) -> None:
    self._rollbacks += 1
    if self.kind == "rollback" and self._rollbacks == self.at:
      os.kill(os.getpid(), signal.SIGKILL)

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


class Faults(NoFaults):
  """Several faults, each acting as if alone (in the order given)."""

  def __init__(self, faults: list[InjectedFault]):
    self.faults = faults

  def loss(self, loss, micro_step):
    for fault in self.faults:
      loss = fault.loss(loss, micro_step)
    return loss

  def reported_loss(self, loss, micro_step):
    for fault in self.faults:
      loss = fault.reported_loss(loss, micro_step)
    return loss

  def _each(self, hook: str, *args) -> None:
    for fault in self.faults:
      getattr(fault, hook)(*args)

  def after_micro_step(self, micro_step: int, request_stop) -> None:
    self._each("after_micro_step", micro_step, request_stop)

  def save(self, manager, checkpoint, number: int) -> str:
    saving = [fault for fault in self.faults if fault.kind in ("save", "nospace")]
    return (saving[0] if saving else super()).save(manager, checkpoint, number)

  def evaluating(self) -> None:
    self._each("evaluating")

  def rolled_back(self) -> None:
    self._each("rolled_back")

  def export_written(self) -> None:
    self._each("export_written")

  def datagen_written(self) -> None:
    self._each("datagen_written")


def _one(spec: str) -> InjectedFault:
  if spec in ("export:written", "datagen:written"):
    return InjectedFault(spec.split(":")[0], 0)
  kind, _, at = spec.partition(":")
  if kind in ("nan", "spike") and at and all(step.isdigit() for step in at.split(",")):
    return InjectedFault(kind, tuple(int(step) for step in at.split(",")))
  if kind not in ("micro", "save", "signal", "nospace", "raise", "evaluate", "rollback") or \
      not at.isdigit():
    raise ValueError(f"{ENV}={spec!r}: expected micro:K, save:K, signal:K, nospace:K, "
                     "raise:K, evaluate:K, rollback:K, nan:K,L,..., spike:K,L,..., "
                     "export:written or datagen:written, or several joined by ';'")
  return InjectedFault(kind, int(at))


def from_environment() -> NoFaults:
  spec = os.environ.get(ENV, "")
  if not spec:
    return NoFaults()
  faults = [_one(part.strip()) for part in spec.split(";") if part.strip()]
  if sum(fault.kind in ("save", "nospace") for fault in faults) > 1:
    raise ValueError(f"{ENV}={spec!r}: at most one fault of the saves (save:K or nospace:K)")
  return faults[0] if len(faults) == 1 else Faults(faults)
