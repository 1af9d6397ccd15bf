"""What the device keeps to notice a diverging run and to recover from it (checkpointed as
`divergence`; training.recovery acts on it).

- **Detection**, inside the compiled update: a run of `max_consecutive_nonfinite` updates in
  a row with a non-finite loss or gradient, or a finite spike, an update's loss (per target
  token) more than `divergence_spike_margin` nats above the running mean of the applied
  updates' losses (decaying by `divergence_spike_decay` per update, corrected for its start
  as Adam's moments are; spikes do not enter it). The mean trails a falling loss, so the
  warmup's fast fall never reads as a spike.
- **Recovery's record**: how many rollbacks the run made and each one's span of skipped
  micro-batches (global batch numbers, the same on any layout), which the run jumps over
  whenever it reaches them (again after a later rollback to an earlier checkpoint); the
  updates at a lowered learning rate; the update from which a float16 run continues in
  float32. A rollback restores an older checkpoint and then writes the record it had, plus
  the new rollback, so a run killed during its recovery resumes to the same state as one
  never killed.
"""

from __future__ import annotations

import tensorflow as tf

# Rollbacks a checkpoint can record (divergence_max_recoveries is at most this).
MAX_RECORDED = 64
NONFINITE, SPIKE = 1, 2
KINDS = {NONFINITE: "non-finite", SPIKE: "loss spike"}


class DivergenceState(tf.Module):
  """The detector's running mean and the record of recoveries (see the module docstring)."""

  def __init__(self, hparams):
    super().__init__(name="divergence")
    self.max_consecutive = hparams.max_consecutive_nonfinite
    self.fallback_after = hparams.float16_fallback_updates
    self.margin = float(hparams.divergence_spike_margin)
    self.decay = float(hparams.divergence_spike_decay)
    self.lr_factor_value = float(hparams.recovery_lr_factor)
    first = dict(trainable=False, aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)
    count = dict(dtype=tf.int64, **first)
    self.loss_mean = tf.Variable(0.0, name="loss_mean", **first)
    self.loss_weight = tf.Variable(0.0, name="loss_weight", **first)
    self.recoveries = tf.Variable(0, name="recoveries", **count)
    # The updates [first, end) that train at recovery_lr_factor times the learning rate.
    self.lowered = tf.Variable([0, 0], name="lowered", **count)
    # Rows (update detected at, first batch skipped, end batch, kind) of each rollback.
    self.history = tf.Variable(tf.zeros([MAX_RECORDED, 4], tf.int64), name="history", **count)
    # Updates in a row tried at the minimum float16 loss scale.
    self.at_min_scale = tf.Variable(0, name="at_min_scale", **count)
    # The first update that a float16 run trained in float32 (0: none).
    self.float32_from = tf.Variable(0, name="float32_from", **count)
    # The most an update's loss (not a spike) rose above the running mean, and its update:
    # what a margin must stay above (the run's last lines give it).
    self.widest = tf.Variable(0.0, name="widest", **first)
    self.widest_update = tf.Variable(0, name="widest_update", **count)

  def mean(self):
    return self.loss_mean / tf.maximum(self.loss_weight, 1e-30)

  # --- the record, written by the host (training.recovery) ----------------------------------
  def rollbacks(self) -> list[tuple[int, int, int, int]]:
    """The rows (update, first batch, end batch, kind) of the run's rollbacks."""
    count = min(int(self.recoveries.numpy()), MAX_RECORDED)
    return [tuple(int(x) for x in row) for row in self.history.numpy()[:count]]

  def record(self, rows: list[tuple[int, int, int, int]]) -> None:
    """The run's rollbacks are `rows` (the first MAX_RECORDED kept; all counted)."""
    table = self.history.numpy() * 0
    for number, row in enumerate(rows[:MAX_RECORDED]):
      table[number] = row
    self.history.assign(table)
    self.recoveries.assign(len(rows))

  def lower(self, updates: tuple[int, int]) -> None:
    """The updates [first, end) train at recovery_lr_factor x the learning rate."""
    self.lowered.assign(updates)

  def fall_back(self, update: int) -> None:
    """A float16 run computes in float32 from `update` on."""
    self.float32_from.assign(update)

  def judge(self, loss, finite, update):
    """Whether update `update`'s `loss` is a spike; a finite update that is not one enters
    the running mean. In the compiled update."""
    spike = tf.constant(False)
    if self.margin > 0:
      spike = finite & (self.loss_weight > 0) & (loss > self.mean() + self.margin)
    take = finite & ~spike
    excess = loss - self.mean()
    wider = take & (self.loss_weight > 0) & (excess > self.widest)
    self.widest.assign(tf.where(wider, excess, self.widest))
    self.widest_update.assign(tf.where(wider, update, self.widest_update))
    self.loss_mean.assign(tf.where(take, self.decay * self.loss_mean + (1 - self.decay) * loss,
                                   self.loss_mean))
    self.loss_weight.assign(tf.where(take, self.decay * self.loss_weight + (1 - self.decay),
                                     self.loss_weight))
    return spike

  def lr_factor(self, update):
    """The factor on update `update`'s learning rate: recovery_lr_factor while lowered."""
    lowered = (update >= self.lowered[0]) & (update < self.lowered[1])
    return tf.where(lowered, self.lr_factor_value, 1.0)

  def count_min_scale(self, at_minimum):
    """After the loss scale's adjustment: whether it has sat at its minimum for
    float16_fallback_updates updates in a row (counting this one)."""
    self.at_min_scale.assign(tf.where(at_minimum, self.at_min_scale + 1, 0))
    return self.at_min_scale >= self.fallback_after
