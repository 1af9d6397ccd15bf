"""The run's milestones: its last update and where its training stream switches segmentations.

One unit, with its state in the checkpoint and its own tests (tests/test_milestones.py):
- the last update: --train_steps, or, when the learning-rate schedule cools down, the
  cooldown's end (`learner.cooldown_end`): --train_steps without a time budget, else
  projected from the time budget and fixed before the cooldown would start (budget.RunEnd);
- on data with sampled segmentations, the micro-batch of the training stream from which
  they are read (`sampled_from_batch`): decided at the start (no minimum length, or a fixed
  length), or at the last budget check before subword_sampling_start is passed; UNDECIDED
  until then, NEVER for a run too short.
`schedule()`, what `decide` reads, is built from this state; nothing patches it.
"""

from __future__ import annotations

import tensorflow as tf
from absl import logging

from t2t_lite.training import budget
from t2t_lite.core import hparams_check
from t2t_lite.training.decide import Schedule
from t2t_lite.core.errors import UsageError
from t2t_lite.data.problems.base import SAMPLED

SAMPLED_FROM = "sampled_from_batch"  # its name in the checkpoint
UNDECIDED, NEVER = -1, -2


def training_splits(hparams, sampling_start: int, train_minutes: float, data_dir: str,
                    splits_in_data) -> list[str]:
  """The training splits read in turn: "train", or on data with sampled segmentations the
  sampled split, after the one best's updates if the hparams may want any; refusals of the
  combinations that cannot be judged or read (before the model is built)."""
  minimum = hparams.subword_sampling_min_updates
  if SAMPLED not in splits_in_data:
    return ["train"]  # nothing to switch to: the one best throughout (logged)
  if minimum and not sampling_start and train_minutes:
    raise UsageError(
        f"subword_sampling_min_updates={minimum} with a time budget is judged by the "
        "budget's projection at update subword_sampling_start, which is 0: set "
        "subword_sampling_start to an update after the first budget checks (e.g. 100)")
  if minimum and train_minutes and not hparams_check.has_cooldown(hparams):
    raise UsageError(
        f"subword_sampling_min_updates={minimum} with a time budget is judged by the "
        "projection of the learning-rate cooldown, which learning_rate_schedule="
        f"{hparams.learning_rate_schedule!r} lacks; append '*linear_cooldown', or "
        "drop --train_minutes or subword_sampling_min_updates")
  if "train" not in splits_in_data and (sampling_start or minimum):
    raise UsageError(
        f"{data_dir} holds only sampled segmentations (made by an earlier "
        f"t2t-lite-datagen), and subword_sampling_start={sampling_start} with "
        f"subword_sampling_min_updates={minimum} may want the one best; make it again "
        "with t2t-lite-datagen --overwrite (the same sampled records, the one best beside "
        "them), or set both to 0 to read its sampled records from the start")
  return ["train", SAMPLED] if sampling_start or minimum else [SAMPLED]


class Milestones:
  """The run's last update and its segmentation switch (see the module docstring)."""

  def __init__(self, hparams, run_steps, options, learner, splits: list[str],
               strategy: tf.distribute.Strategy):
    """`run_steps`: the run's steps.RunSteps; `options`: options.RunOptions; `learner`: its
    counters and cooldown_end; `splits`: training_splits()."""
    self.hparams, self.run_steps, self.options, self.learner = hparams, run_steps, options, learner
    self.splits = splits
    with strategy.scope():
      self.sampled_from = tf.Variable(UNDECIDED, name=SAMPLED_FROM, dtype=tf.int64,
                                      trainable=False,
                                      aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)
    self.switch = UNDECIDED  # the host's mirror of sampled_from
    self.run_end = budget.RunEnd(hparams, run_steps.train_steps, options.stopping,
                                 options.log_every, learner, options.output_dir)

  def trackables(self) -> dict:
    """What the checkpoint holds of the milestones (the cooldown's end is the learner's)."""
    return {SAMPLED_FROM: self.sampled_from} if len(self.splits) == 2 else {}

  def schedule(self) -> Schedule:
    """What `decide` reads: the run's length as it stands, and the budget checks."""
    options, end = self.options, self.run_end.end
    return Schedule(min(self.run_steps.train_steps, end) if end else self.run_steps.train_steps,
                    options.stopping, options.checkpointing, options.evaluation,
                    options.log_every, self.run_end.check_every)

  # --- at the start of the loop ---------------------------------------------------------
  def start(self, update: int) -> None:
    """The cooldown's end and the switch, as recorded in the checkpoint or decided now."""
    self.run_end.start(update)
    self._start_sampling(update)

  def _start_sampling(self, update: int) -> None:
    minimum, start = self.hparams.subword_sampling_min_updates, self.run_steps.sampling_start
    if len(self.splits) < 2:
      if self.splits == [SAMPLED]:
        logging.info("subword sampling: the sampled segmentations from the start")
      elif start or minimum:
        logging.info("subword sampling: the one best segmentation throughout (%s has no "
                     "sampled segmentations)", self.options.data_dir)
      return
    self.switch = int(self.sampled_from.numpy())
    if self.switch != UNDECIDED:
      logging.info("subword sampling: %s (recorded in the run)", self._said())
    elif not minimum:
      self._decide(True, update, "")
    elif int(self.learner.cooldown_end.numpy()):  # fixed: no more checks of the budget
      end = int(self.learner.cooldown_end.numpy())
      self._decide(end >= minimum, update, f"the run's last update, {end}")
    elif not self.options.stopping.train_minutes:
      self._decide(self.run_steps.train_steps >= minimum, update,
                   f"--train_steps={self.run_steps.train_steps}")
    else:
      logging.info("subword sampling: from update %d if the time budget's projection at "
                   "update %d reaches %d updates, else the one best throughout",
                   start + 1, start, minimum)

  # --- at a check of the time budget ------------------------------------------------------
  def check_budget(self, update: int, now: float, deadline: float, agree) -> budget.Check:
    """The budget's check (budget.RunEnd.check), and the switch decided at the last check
    before subword_sampling_start."""
    check = self.run_end.check(update, now, deadline, agree)
    self._judge(update, check.projected, check.fixed)
    return check

  def _judge(self, update: int, length: int, final: bool) -> None:
    if len(self.splits) < 2 or self.switch != UNDECIDED or not length:
      return
    if final or update + self.run_end.check_every > self.run_steps.sampling_start:
      self._decide(length >= self.hparams.subword_sampling_min_updates, update,
                   f"the time budget's projection at update {update}: {length} updates")

  def _decide(self, switch: bool, update: int, why: str) -> None:
    start, accumulation = self.run_steps.sampling_start, self.run_steps.accumulation
    chosen = NEVER
    if switch:
      # From where the stream is now: the micro-steps of the updates still to come before
      # start (the counter's past may have run on another layout, or skipped updates).
      ahead = (accumulation.micro_steps(start) - accumulation.micro_steps(update)
               if update < start else 0)
      done = self.learner.host.micro_step() - self.learner.host.position()  # at the update's start
      chosen = self.run_steps.replicas * (done + ahead)
    self.sampled_from.assign(chosen)
    self.switch = chosen
    minimum = self.hparams.subword_sampling_min_updates
    logging.info("subword sampling: %s%s", self._said(),
                 f" ({why}; subword_sampling_min_updates={minimum})" if why else "")

  def _said(self) -> str:
    if self.switch == NEVER:
      return "the one best segmentation throughout"
    update = self.run_steps.accumulation.last_update_within(self.switch // self.run_steps.replicas,
                                                       1 << 40)
    return (f"the sampled segmentations from update {update + 1}" if update else
            "the sampled segmentations from the start")

  # --- as the stream is read --------------------------------------------------------------
  def switches_at(self, micro_step: int) -> bool:
    """Whether the batches of `micro_step` are the first sampled ones (logged once)."""
    return (self.switch >= 0 and len(self.splits) == 2
            and micro_step * self.run_steps.replicas == self.switch)

  def stop_reason(self) -> str | None:
    """Why a run that reached its last update stopped, when that was the cooldown's end
    before --train_steps."""
    end = self.schedule().train_steps
    if end < self.run_steps.train_steps:
      return f"the learning-rate cooldown's last update ({end}) reached"
    return None
