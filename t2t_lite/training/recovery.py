"""Recovering a diverging run without a person: roll back, skip exactly the batches that
diverged, go on.

The device notices a divergence inside the compiled update (training.divergence): a run of
`max_consecutive_nonfinite` non-finite updates, or a finite loss spike. The host learns of it
at its next read of the device's statistics, which every log line, save, evaluation and stop
begins with, so no checkpoint is ever written after a divergence that has not been acted on.
Every worker reads the same statistics (they come from the update's cross-replica sums) and
so takes the same decision at the same update, as with every other decision (training.decide).

A recovery (at most `divergence_max_recoveries` per run, then the run stops with exit 1
naming them):
1. restores the newest checkpoint (all of them are from before the divergence; a run that has
   none yet goes back to the state it started from);
2. records, in the checkpoint's `divergence` state, the span of micro-batches to skip: from
   the first micro-batch of the first update that diverged (for a non-finite run, the first
   of the run; never before the checkpoint restored) to the last micro-batch of the update
   at which the device noticed it, as global batch numbers of the training stream;
3. trains on from the checkpoint on the same batches as before up to the span, moves the data
   position past it, and trains the next `recovery_lr_updates` updates at
   `recovery_lr_factor` times the learning rate.
The data position is a few integers and resume is exact, so a run killed anywhere in a
recovery resumes to the weights of one never killed: killed before the skip, it meets the
same divergence at the same update again and takes the same decision.

Under float16, once the loss scale has sat at its minimum for `float16_fallback_updates`
updates in a row, the run continues in float32 (no loss scale; safe on every device, unlike
bfloat16), from the next update on; the checkpoint records from which update.
"""

from __future__ import annotations

import math
import os
import shutil
import tempfile

import tensorflow as tf
from absl import logging

from t2t_lite.core.errors import RunError
from t2t_lite.core.files import remove_stale_temporaries, writer_tag
from t2t_lite.training.divergence import KINDS, NONFINITE

# The local folder that holds the state a new run started from, until its first save.
INITIAL = "t2t-lite-initial-state-"


def describe_divergence(read: dict, hparams) -> str:
  """What the device noticed, in words (from a learner.read_window)."""
  if read["diverged"] == NONFINITE:
    return (f"{hparams.max_consecutive_nonfinite} updates in a row had a non-finite loss or "
            f"gradient (max_consecutive_nonfinite={hparams.max_consecutive_nonfinite})")
  return (f"the loss spiked to {read['diverged_loss']:.3f}, more than "
          f"divergence_spike_margin={hparams.divergence_spike_margin:g} above its running "
          f"mean {read['diverged_mean']:.3f}")


class InitialState:
  """The state a new run starts from, written locally (every worker its own) so that a
  divergence before the first checkpoint can roll back to it; removed at the first save (and
  what killed runs of this host left, at the start of the next)."""

  def __init__(self, checkpoint: tf.train.Checkpoint):
    remove_stale_temporaries(tempfile.gettempdir(), INITIAL)
    self.folder = tempfile.mkdtemp(prefix=f"{INITIAL}{writer_tag()}.")
    self.path = checkpoint.write(os.path.join(self.folder, "initial"))

  def restore(self, objects: dict) -> None:
    tf.train.Checkpoint(**objects).read(self.path).assert_existing_objects_matched()

  def remove(self) -> None:
    shutil.rmtree(self.folder, ignore_errors=True)


class Recovery:
  """The host's side of recovering (see the module docstring)."""

  def __init__(self, learner, hparams, replicas: int, faults):
    self.learner, self.hparams, self.replicas = learner, hparams, replicas
    self.state, self.faults = learner.divergence, faults
    self.initial = None  # InitialState of a new run, until its first save
    self._rows = []  # the host's copy of the record: (update, first, end, kind) each

  # --- reading the state ------------------------------------------------------------------
  def sync(self) -> None:
    """After a resume: the host's copy of the record, and the precision the run recorded."""
    self._rows = self.state.rollbacks()
    since = int(self.state.float32_from.numpy())
    if since and self.learner.scaling:
      self.learner.continue_in_float32()
      logging.info("float16: this run continues in float32 since update %d (recorded in "
                   "the run)", since)

  def count(self) -> int:
    return int(self.state.recoveries.numpy())

  def history(self) -> list[dict]:
    """The run's rollbacks: the update each was noticed at, the batches skipped, why."""
    return [{"update": u, "skipped_batches": [a, b], "kind": KINDS[k]}
            for u, a, b, k in self.state.rollbacks()]

  # --- a divergence -----------------------------------------------------------------------
  def check(self, read: dict, kept: str | None) -> None:
    """A RunError when the run may not recover from the divergence in `read` (none left of
    divergence_max_recoveries): the updates of its rollbacks, the checkpoint `kept` (the
    newest), what to change."""
    limit, done = self.hparams.divergence_max_recoveries, len(self._rows)
    if done < limit:
      return
    earlier = "; ".join(f"update {row['update']} ({row['kind']}, batches "
                        f"{row['skipped_batches'][0]}-{row['skipped_batches'][1] - 1} "
                        "skipped)" for row in self.history())
    raise RunError(
        f"{describe_divergence(read, self.hparams)} at update {read['diverged_update']}; "
        "stopped"
        + (f" after {done} recoveries (divergence_max_recoveries={limit}): {earlier}"
           if done else " (divergence_max_recoveries=0)")
        + (f". The last good checkpoint, {os.path.basename(kept)}, is kept" if kept else
           ". No checkpoint was saved")
        + "; lower learning_rate_constant or set clip_grad_norm, then resume")

  def rolled_back(self, read: dict, path: str | None, writer) -> None:
    """The run stands at the checkpoint restored (`path`; None: its initial state): its
    record is the run's so far and the new rollback, whose span will be skipped; say so."""
    learner, replicas = self.learner, self.replicas
    restored = learner.host.micro_step()
    first = max(read["diverged_from"], restored) * replicas
    end = read["diverged_to"] * replicas
    if learner.host.position() and restored * replicas > read["diverged_from"] * replicas:
      raise RunError(f"cannot roll back past update {read['diverged_update']}: the newest "
                     f"checkpoint, {path}, was saved mid-update inside the span that "
                     "diverged; resume from an older one (move the newer ones away)")
    self._rows.append((read["diverged_update"], first, end, read["diverged"]))
    self.state.record(self._rows)
    if not learner.scaling and not int(self.state.float32_from.numpy()):
      self.state.fall_back(int(learner.update_step.numpy()) + 1)  # (stays in float32)
    learner.window.forget_run()
    number, update = len(self._rows), int(learner.update_step.numpy())
    logging.warning(
        "diverged at update %d: %s. Recovery %d of %d: rolled back to %s (update %d); "
        "micro-batches %d-%d of the training stream (%d) will be skipped%s",
        read["diverged_update"], describe_divergence(read, self.hparams), number,
        self.hparams.divergence_max_recoveries, path or "the state the run started from",
        update, first, end - 1, end - first, self._lowered_words())
    with writer.as_default(step=read["diverged_update"]):
      tf.summary.scalar("recovery/rollbacks", number)
      tf.summary.scalar("recovery/skipped_batches", end - first)
    self.faults.rolled_back()

  def _lowered_words(self) -> str:
    hparams = self.hparams
    if hparams.recovery_lr_updates and hparams.recovery_lr_factor != 1.0:
      return (f", then {hparams.recovery_lr_updates} updates train at "
              f"{hparams.recovery_lr_factor:g} x the learning rate")
    return ""

  def lowered_span(self, update: int) -> tuple[int, int]:
    """The updates [first, end) at a lowered learning rate after a skip before `update`."""
    return update, update + self.hparams.recovery_lr_updates

  # --- before each update -----------------------------------------------------------------
  def before_update(self, stream, milestones) -> None:
    """Between updates, at a micro-batch of a recorded span: moves the run past it (the
    learner's counter and the stream's position) and lowers the learning rate for the
    updates that follow."""
    learner = self.learner
    if not self._rows or learner.host.position():
      return
    batch = learner.host.micro_step() * self.replicas
    span = next(((a, b) for _, a, b, _ in self._rows if a <= batch < b), None)
    if span is None:
      return
    micro_step = math.ceil(span[1] / self.replicas)
    update = int(learner.update_step.numpy()) + 1
    stream.skip_to(micro_step, milestones.switch, update)
    learner.skip_to(micro_step)
    if self._lowered_words():
      self.state.lower(self.lowered_span(update))
    hparams = self.hparams
    logging.info("update %d: skipped micro-batches %d-%d of the training stream, as the "
                 "recovery planned%s", update, batch, span[1] - 1,
                 f"; updates {update}-{update + hparams.recovery_lr_updates - 1} train at "
                 f"{hparams.recovery_lr_factor:g} x the learning rate"
                 if self._lowered_words() else "")
    self.before_update(stream, milestones)  # (a span may follow at once)

  # --- float16 ----------------------------------------------------------------------------
  def float16_fallback(self, read: dict) -> None:
    """When the loss scale sat at its minimum long enough: float32 from the next update."""
    if not read["float16_due"] or not self.learner.scaling:
      return
    update = read["updates_done"] + 1
    self.state.fall_back(update)
    self.learner.continue_in_float32()
    logging.warning("float16: the loss scale sat at its minimum (1) for %d updates in a row; "
                    "the run continues in float32 from update %d (recorded in its "
                    "checkpoints)", self.hparams.float16_fallback_updates, update)

  # --- the run's start and end ------------------------------------------------------------
  def started_new(self, checkpoint) -> None:
    """A new run: keep its initial state, for a divergence before the first checkpoint."""
    if self.hparams.divergence_max_recoveries:
      self.initial = InitialState(checkpoint)

  def saved(self) -> None:
    """A checkpoint exists (or the run ends): the initial state is no longer needed."""
    if self.initial is not None:
      self.initial.remove()
      self.initial = None

  def summary_lines(self) -> list[str]:
    lines = [f"recovered from a divergence {self.count()} time(s): " + "; ".join(
        f"update {row['update']} ({row['kind']}), batches {row['skipped_batches'][0]}-"
        f"{row['skipped_batches'][1] - 1} skipped" for row in self.history())] \
        if self.count() else []
    since = int(self.state.float32_from.numpy())
    if since:
      lines.append(f"float16 fell back to float32 from update {since}")
    widest, update = float(self.state.widest.numpy()), int(self.state.widest_update.numpy())
    if update:
      lines.append(f"largest loss above its running mean: {widest:.3f} nats, at update "
                   f"{update} (divergence_spike_margin={self.hparams.divergence_spike_margin:g})")
    return lines
