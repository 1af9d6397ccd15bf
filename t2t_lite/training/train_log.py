"""What a run reports as it trains: progress lines, train summaries, skipped updates.

The device keeps a window of statistics (learner.Window) that the host reads only when
`decide` asks for it; `TrainLog` adds each read to the window of the next progress line,
and says which updates were skipped (a diverging run is training.recovery's).
"""

from __future__ import annotations


import tensorflow as tf
from absl import logging


def format_duration(seconds: float) -> str:
  seconds = int(max(seconds, 0))
  hours, rest = divmod(seconds, 3600)
  return f"{hours}h{rest // 60:02d}m" if hours else f"{rest // 60}m{rest % 60:02d}s"


class TrainLog:
  """The progress lines and train summaries of one run (a no-op writer off the chief)."""

  def __init__(self, learner, run_steps):
    self.learner, self.run_steps = learner, run_steps
    self.writer = tf.summary.create_noop_writer()
    self._window = {"updates": 0, "tokens": 0.0, "loss": 0.0, "padding": 0.0, "slots": 0.0}
    self._last_read = None
    self._reduction_logged = False

  def write_summaries(self, directory: str) -> None:
    """The train summaries go to TensorBoard files in `directory` (the chief's)."""
    self.writer = tf.summary.create_file_writer(directory)

  def run_start(self, hparams, corpora=None) -> None:
    """What the run will do: the batch run_steps, the corpora's weights (a mixing.CorpusMix), the
    dropout ramp, the moving average."""
    from t2t_lite.core import hparams_check
    for line in self.run_steps.lines() + (corpora.start_lines() if corpora else []):
      logging.info("%s", line)
    if hparams_check.has_dropout_ramp(hparams):
      logging.info("residual dropout: %g until update %d, rising linearly to %g at update %d",
                   hparams.dropout_ramp_initial, hparams.dropout_ramp_start,
                   hparams.layer_prepostprocess_dropout, hparams.dropout_ramp_end)
    frozen = self.learner.model.frozen_variables()
    if frozen:
      logging.info("frozen (frozen_parts=%s): %d variables, %d parameters; they get no "
                   "gradient, Adam slots, accumulator or moving average", hparams.frozen_parts,
                   len(frozen), sum(v.shape.num_elements() for v in frozen))
    if self.learner.average is not None:
      logging.info("moving average of the weights: decay %g per %g target tokens (one more "
                   "copy of the parameters, %.1f MiB)", hparams.ema_decay,
                   hparams.ema_reference_tokens,
                   self.learner.state_bytes()["moving_average"] / 2 ** 20)

  @property
  def last_read(self) -> dict:
    return self._last_read

  def read(self) -> int:
    """Reads the device's window of statistics (a collective across workers): adds it to
    the window of the next log line and reports skipped updates (`last_read` holds all it
    read). Returns the updates applied."""
    read = self._last_read = self.learner.read_window()
    for name in self._window:
      self._window[name] += read[name]
    update = read["updates_done"]
    if read["overflows"]:
      logging.info("float16 overflow at %s: update%s skipped, loss scale lowered to %g",
                   f"update {update + 1}" if read["overflows"] == 1 else
                   f"{read['overflows']} updates since update {update - read['updates']}",
                   "" if read["overflows"] == 1 else "s", float(self.learner.loss_scale.numpy()))
    if read["skipped"]:
      where = (f"update {read['last_skip_update']} (micro-step {read['last_skip_micro_step']})")
      if read["skipped"] > 1:
        where = f"{read['skipped']} updates, the last at {where}"
      logging.warning("non-finite loss or gradient at %s: update%s skipped, accumulators "
                      "reset (%d in a row, %d skipped in all)", where,
                      "" if read["skipped"] == 1 else "s", read["consecutive"],
                      int(self.learner.skipped_updates.numpy()))
    return update

  def rolled_back(self) -> None:
    """After a rollback: the next line counts only the updates trained from there."""
    for name in self._window:
      self._window[name] = 0

  def line(self, update: int, end: int, clock) -> None:
    """One progress line and the train summaries of the updates since the previous one
    (the window, then emptied; the learning rate and norm of the last read). `end`: the
    run's last update as it stands; `clock`: budget.Clock."""
    window, read = self._window, self._last_read
    now, elapsed = clock.take_window()
    window_updates, window_tokens = max(window["updates"], 1), window["tokens"]
    remaining = (end - update) / max(window_updates / elapsed, 1e-9)
    if clock.deadline is not None:
      remaining = min(remaining, clock.deadline - now)
    tokens_per_second = window_tokens / elapsed
    loss = window["loss"] / window_updates
    padding = window["padding"] / max(window["slots"], 1)
    for name in window:
      window[name] = 0
    logging.info("update %d/%d (micro-step %d): loss %.4f, lr %.3g, %.0f tokens/s, "
                 "%.0f tokens/update, %.1f%% padding, ETA %s", update, end,
                 read["micro_step"], loss, read["learning_rate"], tokens_per_second,
                 window_tokens / window_updates, 100 * padding, format_duration(remaining))
    with self.writer.as_default(step=update):
      tf.summary.scalar("loss", loss)
      tf.summary.scalar("learning_rate", read["learning_rate"])
      tf.summary.scalar("grad_norm", read["grad_norm"])
      tf.summary.scalar("tokens_per_second", tokens_per_second)
      tf.summary.scalar("tokens_per_update", window_tokens / window_updates)
      tf.summary.scalar("padding_fraction", padding)

  def phase(self, update: int) -> None:
    """With an accumulation schedule: says when the next update starts another phase."""
    schedule, run_steps = self.learner.schedule, self.run_steps
    if schedule.varies and update < run_steps.train_steps:
      old, new = schedule.steps_for(update), schedule.steps_for(update + 1)
      if old != new:
        logging.info("accumulate steps %d -> %d from update %d (%d tokens per update)", old,
                     new, update + 1, run_steps.batch_size * new * run_steps.replicas)

  def reduction(self) -> None:
    """Once, after the first update: how the update's cross-replica sum was built."""
    if self.learner.reduction is None or self._reduction_logged:
      return
    self._reduction_logged = True
    collectives = self.learner.reduction["collective_ops"]
    logging.info("cross-replica sum per update: %d tensors in %s",
                 self.learner.reduction["tensors"],
                 f"{collectives} collective all-reduce op(s)" if collectives
                 else "a reduction to one device")
