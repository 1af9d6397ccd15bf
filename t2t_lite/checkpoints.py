"""Checkpoints of a training run: save, restore the newest readable one, agree across workers.

Checkpoints are named `ckpt-<N>`, N the micro-batches trained on (of all replicas). A damaged
one (a file cut short, say) is reported and the previous one used. Under
MultiWorkerMirroredStrategy every worker restores the chief's checkpoints (one run directory
on a shared filesystem) and takes part in every save, which only the chief keeps: the others
write theirs to a local scratch folder and remove it at once. After restoring, the workers
compare the checkpoint each restored in one collective and, if they differ (a filesystem
that showed one worker an older state), all fall back to the newest one every worker read.
Folders `workers/<task>` of runs from before are left alone.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile

import tensorflow as tf
from absl import logging

from t2t_lite.decide import Checkpointing
from t2t_lite.errors import RunError, UsageError
from t2t_lite.faults import NoFaults
from t2t_lite.files import remove_stale_temporaries, writer_tag

# The local folder in which a worker other than the chief writes its part of a save.
SCRATCH = "t2t-lite-worker-save-"
NOTHING = 0       # "restored nothing": a fresh start
FAILED = -1       # this worker could not restore (its error is raised after the agreement)


def checkpoint_number(path: str) -> int:
  return int(path.rsplit("-", 1)[1])


class Checkpoints:
  """The run's CheckpointManager, with fallback on damage and multi-worker agreement."""

  def __init__(self, objects: dict, directory: str, options: Checkpointing,
               strategy: tf.distribute.Strategy, faults: NoFaults | None = None,
               before_restore=None, optional: tuple[str, ...] = (),
               shape_differences: tuple[str, ...] = (), is_chief: bool = True):
    """`objects`: what a checkpoint holds, by name; those named in `optional` may be missing
    from a checkpoint (they keep their initial values), the others must all match.
    `shape_differences`: the settings in which this model differs from the one the run
    recorded ("filter_size=96 (recorded 128)"), named when a checkpoint does not fit."""
    self.objects, self.optional = objects, optional
    self.shape_differences = shape_differences
    checkpoint = self.checkpoint = tf.train.Checkpoint(**objects)
    # before_restore(path, its top-level names) raises a UsageError to refuse a checkpoint.
    self.before_restore = before_restore
    self.strategy = strategy
    self.faults = faults or NoFaults()
    # keep_max = 0 keeps every checkpoint. keep_every_n_hours: of the checkpoints that
    # rotation removes, one per this many hours stays (TensorFlow's CheckpointManager does
    # the bookkeeping, in the directory's checkpoint state, so it survives a restart).
    self.manager = tf.train.CheckpointManager(
        checkpoint, directory, max_to_keep=options.keep_max or None,
        keep_checkpoint_every_n_hours=options.keep_every_n_hours or None)
    self.multi_worker = isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy)
    self.is_chief = is_chief
    if not is_chief:  # what saves of this host's killed workers left
      remove_stale_temporaries(tempfile.gettempdir(), SCRATCH)
    self.last_saved = self._last_path = None

  @property
  def directory(self) -> str:
    return self.manager.directory

  def _candidates(self) -> list[str]:
    return newest_first(self.directory, "trying them newest first; they stay on disk "
                        "outside the rotation of --keep_checkpoint_max")

  def _restore_newest(self, at_most: int | None = None):
    """(number of the checkpoint restored, or NOTHING / FAILED; its path; the error to raise
    if FAILED)."""
    candidates = [p for p in self._candidates()
                  if at_most is None or checkpoint_number(p) <= at_most]
    for index, path in enumerate(candidates):
      try:
        stored = {name.split("/")[0] for name, _ in tf.train.list_variables(path)}
        if self.before_restore is not None:
          self.before_restore(path, stored)
        tf.train.Checkpoint(**{
            name: value for name, value in self.objects.items()
            if name in stored or name not in self.optional}).restore(
                path).assert_existing_objects_matched()
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
          f"no readable checkpoint in {self.directory}: all of {len(candidates)} are "
          "damaged; move them away to start afresh")
    return NOTHING, None, None

  def _misfit(self, path: str) -> UsageError | None:
    """The error for a readable checkpoint whose model variables have other shapes, naming
    them; None when the shapes fit (or the checkpoint cannot be read at all)."""
    if "model" not in self.objects:
      return None
    try:
      mismatched = [m for m in _mismatches({"model": self.objects["model"]}, path)
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
    values = self.strategy.experimental_distribute_values_from_function(
        lambda context: tf.constant([number], tf.int64))
    return [int(n) for n in self.strategy.gather(values, axis=0).numpy()]

  def restore(self) -> str | None:
    """Restores the newest usable checkpoint; its path, or None for a fresh start."""
    number, path, error = self._restore_newest()
    if self.multi_worker:
      number, path, error = self._agree(number, path, error)
    if error is not None:
      raise error
    if path is not None:
      self.last_saved, self._last_path = number, path
    return path

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
          f"the workers read no checkpoint in common in {self.directory} (newest by worker: "
          f"{first}); make sure every worker sees the same --output_dir, or move its "
          "checkpoints away to start afresh")
    if first != numbers:
      logging.warning("workers' newest checkpoints disagreed (ckpt-N by worker: %s); all "
                      "resume from ckpt-%d, the newest every worker has", first,
                      numbers[0])
    return number, path, None

  def save(self, number: int) -> str:
    """Saves ckpt-`number` unless that one is already saved."""
    if number == self.last_saved:
      return self._last_path
    if not self.is_chief:  # its part of the collective save, written and thrown away
      scratch = tempfile.mkdtemp(prefix=f"{SCRATCH}{writer_tag()}.")
      try:
        self.faults.save(tf.train.CheckpointManager(self.checkpoint, scratch, max_to_keep=1),
                         self.checkpoint, number)
      finally:
        shutil.rmtree(scratch, ignore_errors=True)
      path = os.path.join(self.directory, f"ckpt-{number}")
      self.last_saved, self._last_path = number, path
      return path
    path = self.faults.save(self.manager, self.checkpoint, number)
    self.last_saved, self._last_path = number, path
    return path


def newest_first(directory: str, what_follows: str = "reading the newest") -> list[str]:
  """A run's checkpoints, newest first: those its state file lists (and are there); without a
  readable state file (checkpoints copied without it, say), the ckpt-N found on disk, so
  that no reader of a run (the trainer, the decoder, the averager, warm start, the
  exporter) takes a run that has checkpoints for one that has none. (translate-all scores
  the ckpt-N on disk, and reads the state file only to skip one still being written.)
  `what_follows`: what the warning about the missing state file says the reader does."""
  try:
    state = tf.train.get_checkpoint_state(directory)
  except Exception as err:  # noqa: BLE001  (a damaged state file: many error types)
    logging.warning("the checkpoint state file in %s is unreadable (%s)", directory,
                    str(err).strip().splitlines()[0][:160] if str(err).strip() else err)
    state = None
  listed = [path for path in reversed(state.all_model_checkpoint_paths if state else [])
            if tf.io.gfile.exists(path + ".index")]  # (those deleted by hand: not there)
  if listed:
    return listed
  on_disk = sorted((checkpoint_number(name[:-len(".index")]), name[:-len(".index")])
                   for name in (os.listdir(directory) if os.path.isdir(directory) else [])
                   if re.fullmatch(r"ckpt-\d+\.index", name))
  if on_disk:
    logging.warning("%s has checkpoints but no readable checkpoint state file: %s (%s)",
                    directory, what_follows,
                    ", ".join(name for _, name in reversed(on_disk[-3:])))
  return [os.path.join(directory, name) for _, name in reversed(on_disk)]


def recorded_update(path: str) -> int | None:
  """The update a checkpoint records: Adam's step (skipped non-finite updates do not count),
  or for an average the update of the newest checkpoint averaged; None if it records none."""
  reader = tf.train.load_checkpoint(path)
  for key in ("optimizer/iterations/.ATTRIBUTES/VARIABLE_VALUE",
              "update_step/.ATTRIBUTES/VARIABLE_VALUE"):
    if reader.has_tensor(key):
      return int(reader.get_tensor(key))
  return None


def warm_start_source(source: str) -> str:
  """A checkpoint prefix: `source` itself, or the newest checkpoint of a run directory."""
  if os.path.isdir(source):
    path = next(iter(newest_first(source)), None)
    if path is not None and not os.path.basename(path).rsplit("-", 1)[-1].isdigit():
      raise UsageError(f"--warm_start_from={source}: its newest checkpoint {path} is not "
                       "named PREFIX-N; give the checkpoint prefix itself")
    if path is None:
      raise UsageError(f"--warm_start_from={source} holds no checkpoint; give a run "
                       "directory with checkpoints or a checkpoint prefix (RUN/ckpt-N)")
    return path
  if not tf.io.gfile.exists(source + ".index"):
    raise UsageError(f"--warm_start_from={source} is neither a run directory nor a "
                     f"checkpoint prefix (no {source}.index)")
  return source


def _mismatches(objects: dict, path: str) -> list[str]:
  """What of `objects` the checkpoint at `path` lacks or holds in another shape."""
  import tempfile
  theirs = dict(tf.train.list_variables(path))
  with tempfile.TemporaryDirectory() as tmp:  # our names and shapes, as a checkpoint has them
    ours = dict(tf.train.list_variables(tf.train.Checkpoint(**objects).write(
        os.path.join(tmp, "ours"))))
  found = []
  for name, shape in sorted(ours.items()):
    if not name.endswith(".ATTRIBUTES/VARIABLE_VALUE"):
      continue
    short = name.replace("/.ATTRIBUTES/VARIABLE_VALUE", "")
    if name not in theirs:
      found.append(f"{short} (missing)")
    elif list(theirs[name]) != list(shape):
      found.append(f"{short} {list(theirs[name])} != ours {list(shape)}")
  return found


def cluster_warm_start_source(source: str, is_chief: bool, from_chief) -> str:
  """The checkpoint that --warm_start_from=`source` names on a cluster, resolved once, by
  the chief (`from_chief(values)`: its values on every worker): a run's newest checkpoint
  may change while the workers start, and all must read the same."""
  number = 0.0
  if is_chief:
    path = warm_start_source(source)
    if os.path.isdir(source):
      if not os.path.basename(path).startswith("ckpt-"):
        raise UsageError(f"--warm_start_from={source}: its newest checkpoint {path} is not "
                         "a t2t-lite ckpt-N; on a cluster give the checkpoint prefix itself")
      number = float(checkpoint_number(path))
  number = int(from_chief([number])[0])
  return os.path.join(source, f"ckpt-{number}") if os.path.isdir(source) else source


def warm_start(learner, path: str, with_optimizer: bool = False, source: str = "") -> None:
  """A new run starts from the model weights of the checkpoint `path` (see
  warm_start_source; `source`: what the user named) and, with `with_optimizer`, from Adam's
  slots; counters, accumulators and Adam's step stay at 0. A usage error names what does not
  match."""
  source = source or path
  if not tf.io.gfile.exists(path + ".index"):
    raise UsageError(f"--warm_start_from={source}: checkpoint {path} is not readable here "
                     f"(no {path}.index); every worker must see the same files")
  objects = {"model": learner.model}
  if with_optimizer:
    # The slots only: the stand-in has the optimizer's attribute names, not its counter.
    objects["optimizer"] = tf.train.Checkpoint(m=learner.adam.m, v=learner.adam.v)
  mismatched = _mismatches(objects, path)
  if mismatched:
    shown = "; ".join(mismatched[:4]) + (f"; and {len(mismatched) - 4} more"
                                         if len(mismatched) > 4 else "")
    raise UsageError(f"--warm_start_from={source}: {len(mismatched)} variable(s) do not match "
                     f"this model: {shown}; warm start needs the same model shapes and "
                     "vocabulary")
  tf.train.Checkpoint(**objects).read(path).assert_existing_objects_matched()

