"""Checkpoints of a training run: what they hold, and their saves (restoring one is
training.resume).

Checkpoints are named `ckpt-<N>`, N the micro-batches trained on (of all replicas). Under
MultiWorkerMirroredStrategy every worker takes part in every save, which only the chief
keeps: the others write theirs to a local scratch folder and remove it at once. Folders
`workers/<task>` of runs from before are left alone.
"""

from __future__ import annotations

import os
import shutil
import tempfile

import tensorflow as tf

from t2t_lite.training.options import Checkpointing
from t2t_lite.core.faults import NoFaults
from t2t_lite.core.files import remove_stale_temporaries, writer_tag

# The local folder in which a worker other than the chief writes its part of a save.
SCRATCH = "t2t-lite-worker-save-"


class Checkpoints:
  """The run's CheckpointManager: what a checkpoint holds, and its saves."""

  def __init__(self, objects: dict, directory: str, options: Checkpointing,
               strategy: tf.distribute.Strategy, faults: NoFaults | None = None,
               is_chief: bool = True):
    """`objects`: what a checkpoint holds, by name (training.resume restores them)."""
    self.objects = objects
    checkpoint = self.checkpoint = tf.train.Checkpoint(**objects)
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

  def restored(self, number: int, path: str) -> None:
    """A restore read ckpt-`number` at `path` (training.resume): saving it again is a no-op."""
    self.last_saved, self._last_path = number, path

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
