"""Resuming a run, in one place: restore its newest readable checkpoint, check that its data
position can be continued, fill in what older versions lacked, and move it to this run's
layout. What cannot resume exactly is refused with what to do instead.

- **The newest readable checkpoint.** A damaged one (a file cut short, say) is reported and
  the previous one used; a readable one of another model or setup is refused, naming what
  differs (not called damaged). Under MultiWorkerMirroredStrategy every worker restores the
  chief's checkpoints (one run directory on a shared filesystem), then the workers compare
  the checkpoint each restored in one collective and, if they differ (a filesystem that
  showed one worker an older state), all fall back to the newest one every worker read.
- **Older checkpoints.** From before the update in progress was recorded (`in_update`), it
  is derived from the micro-step counter (n was constant then); from before layouts were
  recorded (`layout`), the layout is one replica with the recorded accumulate steps; from
  before the planned stream (a tf.data iterator, one per replica before that) only with
  --allow_stream_change, at its update on the planned stream; from before the run's
  training time was recorded, that time starts at 0. (The older forms of the other files a
  run writes are upgraded in core.older_formats.)
- **Another layout** (replicas x accumulate steps). Between updates a run's state is
  layout-free: the training stream is shared by all replicas (micro-step m of replica r
  reads batch m x replicas + r), so a checkpoint may resume on another layout with the same
  tokens per update, its micro-step counter rescaled so that the run continues the same
  stream. Mid-update, at other tokens per update (unless allowed), or at a micro-batch the
  new replicas cannot continue evenly, it is refused.
"""

from __future__ import annotations

import tensorflow as tf
from absl import logging

from t2t_lite.core.errors import RunError, UsageError
from t2t_lite.runs.checkpoints import (PerVariable, StandIn, checkpoint_number, mismatches,
                                       newest_first)
from t2t_lite.training.budget import TRAIN_SECONDS
from t2t_lite.training.milestones import SAMPLED_FROM

NOTHING = 0       # "restored nothing": a fresh start
FAILED = -1       # this worker could not restore (its error is raised after the agreement)
# Checkpoint objects that later versions added (see checkpoint_lacks).
ADDED_TO_CHECKPOINTS = ("in_update", "layout")
# What a checkpoint may lack and still resume: the parts a run has only with some hparams
# (they keep their initial values), and what later versions added (upgrade fills it in).
# Batches of the training stream between where the micro-step counter points and where the
# run reads: not 0 once a resume re-planned the stream (see replan_stream).
STREAM_SHIFT = "stream_shift"
OPTIONAL = ("accumulator", "cooldown_end", "ema", "loss_scale", "good_updates", SAMPLED_FROM,
            "divergence",
            TRAIN_SECONDS, STREAM_SHIFT, *ADDED_TO_CHECKPOINTS)


class Resume:
  """Resumes a run from its newest readable checkpoint (see the module docstring)."""

  def __init__(self, checkpoints, learner, run_steps, record: dict | None,
               shape_differences: tuple[str, ...] = (), allow_stream_change: bool = False,
               allow_hparams_change: bool = False):
    """`checkpoints`: the run's training.checkpoints.Checkpoints; `run_steps`: its
    steps.RunSteps; `record`: the run's record (hparams.json) as read at the start;
    `shape_differences`: the settings in which this model differs from the one the run
    recorded ("filter_size=96 (recorded 128)"), named when a checkpoint does not fit."""
    self.checkpoints, self.learner, self.run_steps = checkpoints, learner, run_steps
    self.record, self.shape_differences = record, shape_differences
    self.allow_stream_change = allow_stream_change
    self.allow_hparams_change = allow_hparams_change
    self.lacks = set()  # what the checkpoint restored lacks (upgraded once restored)
    self.per_variable = None  # its runs.checkpoints.PerVariable

  def _recorded(self, name: str):
    """The value of hparam `name` that the run recorded (this run's where none is)."""
    hparams = (self.record or {}).get("hparams", {})
    return hparams.get(name, getattr(self.learner.hparams, name))

  def restore(self) -> str | None:
    """Restores the newest usable checkpoint, upgraded and on this run's layout; its path,
    or None for a fresh start."""
    number, path, error = self._restore_newest()
    if self.checkpoints.multi_worker:
      number, path, error = self._agree(number, path, error)
    if error is not None:
      raise error
    if path is None:
      return None
    self.checkpoints.restored(number, path)
    learner = self.learner
    learner.host.forget()
    upgrade(learner, self.lacks, self.record, path)
    take_per_variable(learner, self.per_variable, path, self._recorded("frozen_parts"))
    move_layout(learner, self.run_steps, path, self.allow_hparams_change,
                self._recorded("batch_size"))
    logging.info("resumed from %s: update %d, micro-step %d", path,
                 int(learner.update_step.numpy()), int(learner.micro_step.numpy()))
    return path

  def _candidates(self) -> list[str]:
    return newest_first(self.checkpoints.directory, "trying them newest first; they stay on "
                        "disk outside the rotation of --keep_checkpoint_max")

  def _restore_newest(self, at_most: int | None = None):
    """(number of the checkpoint restored, or NOTHING / FAILED; its path; the error to raise
    if FAILED)."""
    candidates = [p for p in self._candidates()
                  if at_most is None or checkpoint_number(p) <= at_most]
    for index, path in enumerate(candidates):
      try:
        stored = {name.split("/")[0] for name, _ in tf.train.list_variables(path)}
        self.lacks = checkpoint_lacks(path, stored, self.allow_stream_change)
        objects = {name: value for name, value in self.checkpoints.objects.items()
                   if name in stored or name not in OPTIONAL}
        objects, self.per_variable = by_variable(self.learner, objects, path,
                                                 self._recorded("frozen_parts"))
        tf.train.Checkpoint(**objects).restore(path).assert_existing_objects_matched()
      except UsageError as err:
        return FAILED, None, err
      except AssertionError as err:  # readable, but written by another setup
        return FAILED, None, UsageError(
            f"checkpoint {path} does not match this run (replicas, accumulate steps or "
            f"precision differ: {str(err).splitlines()[0][:160]}); resume with the settings "
            "it was written with, or use a new --output_dir")
      except Exception as err:  # a damaged file surfaces as many error types  # noqa: BLE001
        misfit = self._misfit(path)
        if misfit is not None:  # readable, but of another model: not damage
          return FAILED, None, misfit
        reason = str(err).strip().splitlines()[0][:200]
        fallback = candidates[index + 1] if index + 1 < len(candidates) else None
        logging.warning("checkpoint %s is unreadable (%s); %s", path, reason,
                        f"falling back to {fallback}" if fallback else "no older one left")
        continue
      return checkpoint_number(path), path, None
    if candidates:
      return FAILED, None, RunError(
          f"no readable checkpoint in {self.checkpoints.directory}: all of {len(candidates)} are "
          "damaged; move them away to start afresh")
    return NOTHING, None, None

  def _misfit(self, path: str) -> UsageError | None:
    """The error for a readable checkpoint whose model variables have other shapes, naming
    them; None when the shapes fit (or the checkpoint cannot be read at all)."""
    objects = self.checkpoints.objects
    if "model" not in objects:
      return None
    try:
      mismatched = [m for m in mismatches({"model": objects["model"]}, path)
                    if not m.endswith("(missing)")]
    except Exception:  # noqa: BLE001  (unreadable: damage, reported by the caller)
      return None
    if not mismatched:
      return None
    shown = "; ".join(mismatched[:3]) + (f"; and {len(mismatched) - 3} more"
                                         if len(mismatched) > 3 else "")
    cause = (f"this model has {', '.join(self.shape_differences)}"
             if self.shape_differences else
             "the vocabulary or the model hparams differ from those it was trained with "
             "(recorded in the run's hparams.json)")
    return UsageError(f"checkpoint {path} is of another model shape ({shown}): {cause}; "
                      "resume with the recorded values, or use a new --output_dir")

  def _gather(self, number: int) -> list[int]:
    """Every worker's `number` (one collective)."""
    values = self.checkpoints.strategy.experimental_distribute_values_from_function(
        lambda context: tf.constant([number], tf.int64))
    return [int(n) for n in self.checkpoints.strategy.gather(values, axis=0).numpy()]

  def _agree(self, number: int, path: str | None, error: Exception | None):
    """Brings every worker to the same checkpoint (see the module docstring)."""
    first = numbers = self._gather(number)
    while FAILED not in numbers and min(numbers) != max(numbers):
      if min(numbers) == NOTHING:
        break
      bound = min(numbers)
      number, path, error = self._restore_newest(at_most=bound)
      numbers = self._gather(number)
    if FAILED in numbers:
      return number, path, error or RunError(
          f"another worker could not restore its checkpoint (checkpoints by worker: "
          f"{first}); see its log")
    if min(numbers) != max(numbers):
      return number, path, UsageError(
          f"the workers read no checkpoint in common in {self.checkpoints.directory} (newest "
          f"by worker: {first}); make sure every worker sees the same --output_dir, or move its "
          "checkpoints away to start afresh")
    if first != numbers:
      logging.warning("workers' newest checkpoints disagreed (ckpt-N by worker: %s); all "
                      "resume from ckpt-%d, the newest every worker has", first,
                      numbers[0])
    return number, path, None


def by_variable(learner, objects: dict, path: str, frozen_then: str):
  """(`objects` with the per-variable state of the checkpoint at `path` read through
  stand-ins that hold only what it has of the variables that train now, the
  runs.checkpoints.PerVariable); `frozen_then`: the frozen_parts the run recorded (the
  order of an earlier version's lists)."""
  model = learner.model
  names = model.variable_names()
  per_variable = PerVariable(path, learner.names, model.trained_names(frozen_then),
                             {names[v.ref()]: v for v in model.trainable_variables})
  objects = dict(objects)
  adam = learner.adam
  objects["optimizer"] = StandIn({"iterations": adam.iterations,
                                  **per_variable.fields("m_of", "m", adam.m_of),
                                  **per_variable.fields("v_of", "v", adam.v_of)})
  if "accumulator" in objects:
    acc = learner.accumulator
    objects["accumulator"] = StandIn({
        "loss": acc.loss, "tokens": acc.tokens,
        **per_variable.fields("gradient_of", "gradients", acc.gradient_of)})
  if "ema" in objects:
    average = learner.average
    objects["ema"] = StandIn({"weight": average.weight,
                              **per_variable.fields("average_of", "averages",
                                                    average.average_of)})
  return objects, per_variable


def take_per_variable(learner, per_variable, path: str, frozen_then: str) -> None:
  """After a restore on which other variables train than the checkpoint's (frozen_parts
  changed): the newly trained ones start as in a new run, their moving average at their
  weights (which did not change while frozen); refused mid-update, where the accumulated
  gradients of the update in progress would cover only some variables."""
  if not per_variable.changed:
    return
  position = learner.host.position()
  if position:
    update = int(learner.update_step.numpy()) + 1
    raise UsageError(
        f"checkpoint {path} was written mid-update ({position} micro-steps of update "
        f"{update}) with other frozen_parts than this run's; resume it with "
        f"frozen_parts={frozen_then} and --train_steps={update} to finish that update, "
        "then change them")
  learner.start_fresh(per_variable.fresh)
  logging.info("frozen_parts changed since %s: Adam's moments%s %s", path,
               " and the moving average" if learner.average is not None else "",
               per_variable.describe())


def checkpoint_lacks(path: str, names: set[str], allow_stream_change: bool = False) -> set[str]:
  """What of ADDED_TO_CHECKPOINTS the checkpoint at `path` (its top-level `names`) lacks;
  a UsageError for a data position that the planned stream cannot continue exactly (a
  tf.data iterator, or one per replica), unless `allow_stream_change`."""
  iterators = sorted(name for name in names if name.startswith("iterator_"))
  if "layout" not in names and "iterator_1" in names:
    raise UsageError(
        f"checkpoint {path} was written by a t2t-lite whose replicas each read their own "
        "data shard, before layouts were recorded; this version cannot tell its layout: "
        "finish the run with the version that wrote it")
  if iterators and not allow_stream_change:
    raise UsageError(
        f"checkpoint {path} holds its data position as a tf.data iterator (written by an "
        "earlier t2t-lite), which the planned training stream cannot continue exactly; "
        "pass --allow_stream_change to resume it at its update on the planned stream (other "
        "batches than it would have read), or finish the run with the version that wrote it")
  if iterators:
    logging.warning("checkpoint %s held a tf.data iterator: resumed on the planned stream at "
                    "its micro-batch (--allow_stream_change)", path)
  return {name for name in ADDED_TO_CHECKPOINTS if name not in names}


def upgrade(learner, lacks: set[str], meta: dict | None, path: str) -> None:
  """Fills in what a restored checkpoint lacked (`checkpoint_lacks`), on `learner`."""
  steps = learner.accumulate_steps(int(learner.update_step.numpy()) + 1)
  if "in_update" in lacks:  # n was constant: the position follows from the micro-steps
    learner.derive_in_update(steps)
  if "layout" in lacks:  # one replica, with the accumulate steps the run recorded
    hparams = (meta or {}).get("hparams", {})
    recorded = hparams.get("optimizer_multistep_accumulate_steps")
    if recorded is not None and not hparams.get("effective_batch_tokens") and recorded != steps:
      raise UsageError(
          f"checkpoint {path} predates recorded layouts and was trained with "
          f"optimizer_multistep_accumulate_steps={recorded}; resume it with that value")
    learner.take_layout(1, steps)  # (the Learner's methods re-read its host counters)


def _plan_changes(recorded, batching) -> str:
  """What of data.stream.Batching `recorded` differs in `batching` as it shapes the training
  batches ("" if nothing): the bucket hparams matter only where batches are padded to their
  bucket (--xla_compile)."""
  names = ["batch_size", "max_length"]
  if recorded.pad_to_bucket_boundary or batching.pad_to_bucket_boundary:
    names += ["min_length_bucket", "length_bucket_step"]
  changed = [f"{name}={getattr(batching, name)} (recorded {getattr(recorded, name)})"
             for name in names if getattr(batching, name) != getattr(recorded, name)]
  if recorded.pad_to_bucket_boundary != batching.pad_to_bucket_boundary:
    changed.append("--xla_compile" if batching.pad_to_bucket_boundary else "no --xla_compile")
  return ", ".join(changed)


def recorded_batching(record: dict | None, pad_to_bucket_boundary: bool):
  """The data.stream.Batching the run's record (hparams.json) says its training batches were
  cut by; None without a record. (A record from before --xla_compile was recorded: cut as
  `pad_to_bucket_boundary` says now.)"""
  hparams = (record or {}).get("hparams")
  if not hparams:
    return None
  from t2t_lite.data.stream import Batching
  defaults = Batching(0, 0)
  return Batching(hparams["batch_size"], hparams["max_length"],
                  hparams.get("min_length_bucket", defaults.min_length_bucket),
                  hparams.get("length_bucket_step", defaults.length_bucket_step),
                  bool(record.get("xla_compile", pad_to_bucket_boundary)))


def replan_stream(stream, recorded, learner, replicas: int, shift: int, path: str) -> int:
  """The stream's shift (STREAM_SHIFT) after restoring `path`, a checkpoint of a run whose
  training batches were cut by `recorded` (a data.stream.Batching; None: not recorded) and
  are now cut by `stream`'s (batch_size, max_length or the buckets changed): the run goes on
  in the same epoch at the same fraction of its batches (docs/resuming.md). Refused
  mid-update and on a stream of several splits."""
  batching = stream.plans[0].batching
  if recorded is None:
    return shift
  changed = _plan_changes(recorded, batching)
  if not changed:
    return shift
  if len(stream.plans) > 1:
    raise UsageError(f"resuming {path} with {changed} would re-plan a training stream of "
                     "several corpora or sampled segmentations, which this version does not "
                     "do; resume with the recorded values")
  position = learner.host.position()
  if position:
    update = int(learner.update_step.numpy()) + 1
    raise UsageError(f"checkpoint {path} was written mid-update ({position} micro-steps of "
                     f"update {update}); resume it with the recorded values and "
                     f"--train_steps={update} to finish that update, then change {changed}")
  from t2t_lite.data.stream import SplitPlan
  before = SplitPlan(stream.stores[0].lengths, recorded, stream.seed, 0).batches_per_epoch
  after = stream.plans[0].batches_per_epoch
  counted = int(learner.micro_step.numpy()) * replicas
  done = counted + shift
  epoch, within = divmod(done, before)
  target = epoch * after - (-within * after // before)  # ceil(within x after / before)
  logging.info("%s re-planned the training stream: an epoch has %d batches (%d before); the "
               "run had read %d of epoch %d's and reads on from its batch %d (batch %d of the "
               "stream)", changed, after, before, within, epoch + 1, target - epoch * after,
               target)
  return target - counted


def describe(replicas: int, steps: int) -> str:
  return (f"{replicas} replica{'s' if replicas > 1 else ''} x {steps} micro-step"
          f"{'s' if steps > 1 else ''} per update")


def move_layout(learner, run_steps, path: str, allow_change: bool,
                batch_size_then: int | None = None) -> None:
  """Moves the restored checkpoint `path` to `run_steps`'s layout, or refuses it: mid-update, at
  other tokens per update (unless `allow_change`), or at a micro-batch the new replicas
  cannot continue evenly. `batch_size_then`: the batch_size the run recorded (default: this
  run's)."""
  old_replicas, old_steps = (int(x) for x in learner.layout.numpy())
  steps = learner.accumulate_steps()
  if (old_replicas, old_steps) == (run_steps.replicas, steps):
    return
  update = int(learner.update_step.numpy())
  position = learner.host.position()
  layouts = f"from {describe(old_replicas, old_steps)} to {describe(run_steps.replicas, steps)}"
  if position:
    raise UsageError(
        f"checkpoint {path} was written mid-update ({position} of {old_steps} micro-steps "
        f"of update {update + 1}) and cannot resume on another layout ({layouts}); resume "
        f"it on its own layout with --train_steps={update + 1} to reach the end of that "
        "update, then move")
  batch_size_then = batch_size_then or run_steps.batch_size
  if old_replicas * old_steps != run_steps.replicas * steps and not allow_change:
    raise UsageError(
        f"resuming {path} on {layouts} changes the tokens per update from "
        f"{old_replicas * old_steps * batch_size_then} to "
        f"{run_steps.replicas * steps * run_steps.batch_size}; "
        f"{hint(learner.schedule, run_steps.replicas, old_replicas, old_steps, update)}")
  batches = int(learner.micro_step.numpy()) * old_replicas
  if batches % run_steps.replicas:
    raise UsageError(f"checkpoint {path} is at micro-batch {batches} of the training "
                     f"stream, which {run_steps.replicas} replicas cannot continue evenly; "
                     "resume on its own layout")
  learner.take_layout(run_steps.replicas, steps, micro_step=batches // run_steps.replicas)
  logging.info("resumed on another layout: %s (%d tokens per update), at micro-batch %d "
               "of the training stream", layouts, run_steps.replicas * steps * run_steps.batch_size,
               batches)


def hint(schedule, replicas: int, old_replicas: int, old_steps: int, update: int) -> str:
  """How to keep the tokens per update on `replicas` replicas (`schedule`: the run's
  steps.AccumulateSchedule)."""
  if not schedule.explicit:
    wanted = old_replicas * old_steps / replicas
    choice = (f"optimizer_multistep_accumulate_steps={int(wanted)}" if wanted == int(wanted)
              else f"a replica count that divides {old_replicas * old_steps}")
    return (f"use {choice} (or set effective_batch_tokens), or pass --allow_hparams_change "
            "to accept the change")
  # A schedule: its phases from the update in progress on, scaled to the new replicas
  # (the phases before it are done and stay as they were).
  current = [i for i, (_, after) in enumerate(schedule.phases) if after <= update][-1]
  scaled = [(n, after) if i < current else (n * old_replicas / replicas, after)
            for i, (n, after) in enumerate(schedule.phases)]
  if any(n != int(n) or n < 1 for n, _ in scaled[current:]):
    return (f"use a replica count that divides every n from update {update + 1} on, or "
            "pass --allow_hparams_change to accept the change")
  text = ";".join(f"{int(n)}@{after}" for n, after in scaled)
  return (f"pass --hparams=optimizer_multistep_accumulate_schedule={text} (the schedule's "
          "n from here on scaled to the new replicas) with --allow_hparams_change, or "
          "pass --allow_hparams_change alone to accept the change")
