"""A run's checkpoints as every reader finds them: newest first, the update each records, and
what of a set of objects a checkpoint lacks or holds in another shape.

Checkpoints are named `ckpt-<N>`, N the micro-batches trained on (of all replicas); the
trainer writes them (training.checkpoints), and the decoder, the averager, the exporter,
translate-all and warm start read them through this module.
"""

from __future__ import annotations

import os
import re
import tempfile

import tensorflow as tf
from absl import logging


def checkpoint_number(path: str) -> int:
  return int(path.rsplit("-", 1)[1])


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


def update_of(path: str) -> int:
  """The update checkpoint `path` records (recorded_update); ValueError for an
  average made before averages recorded it."""
  update = recorded_update(path)
  if update is None:
    raise ValueError("it records no update (an average made by an older "
                     "t2t-lite-avg-checkpoints: average again)")
  return update


def mismatches(objects: dict, path: str) -> list[str]:
  """What of `objects` the checkpoint at `path` lacks or holds in another shape."""
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


def _unescape(part: str) -> str:
  """A name as a checkpoint key spells it ('/' as '.S', '.' as '..') back to the name."""
  return re.sub(r"\.(.)", lambda m: "/" if m.group(1) == "S" else m.group(1), part)


def state_by_name(path: str, field: str) -> set[str] | None:
  """The variable names under which the checkpoint at `path` keeps the per-variable state
  `field` ("optimizer/m_of", "ema/average_of", ...); None where it keeps that state as a
  list in the order of the variables that trained (checkpoints of earlier versions, see
  training.resume) or holds none of it."""
  prefix, suffix = field + "/", "/.ATTRIBUTES/VARIABLE_VALUE"
  names = {_unescape(key[len(prefix):-len(suffix)]) for key, _ in tf.train.list_variables(path)
           if key.startswith(prefix) and key.endswith(suffix)}
  return names or None


class StandIn(tf.Module):
  """A stand-in for an object a checkpoint holds: its attribute names, other variables, so
  that reading the checkpoint into it writes into those (some of a run's state, or a
  selection of it)."""

  def __init__(self, fields: dict):
    super().__init__()
    for name, value in fields.items():
      setattr(self, name, value)


class PerVariable:
  """Which variables' own state (Adam's moments, the accumulated gradients, the moving
  average) the checkpoint at `path` holds, against the variables that train now (`names`,
  in order): those it holds are carried, the others start fresh, and what it holds of
  variables that no longer train is dropped.

  A checkpoint keeps that state by variable name (`optimizer/m_of/<name>`); one of an
  earlier version as lists in the order of the variables that trained then (`earlier`, the
  names under the frozen_parts it was written with). `model`: the variables by name, for
  the shapes of dropped list entries."""

  def __init__(self, path: str, names: list[str], earlier: list[str], model_variables: dict):
    stored = state_by_name(path, "optimizer/m_of")
    self.by_name = stored is not None
    self.earlier, self.model_variables = earlier, model_variables
    stored = stored if stored is not None else set(earlier)
    self.carried = [name for name in names if name in stored]
    self.fresh = [name for name in names if name not in stored]
    self.dropped = sorted(stored - set(names))

  def fields(self, by_name: str, listed: str, of: dict) -> dict:
    """The fields of a stand-in for the dict `of` (the object's attribute `by_name`; in an
    earlier version's checkpoint, its list attribute `listed`)."""
    if self.by_name:
      return {by_name: {name: of[name] for name in self.carried}}
    return {listed: [of[name] if name in of else
                     tf.Variable(tf.zeros_like(self.model_variables[name]), trainable=False)
                     for name in self.earlier]}

  @property
  def changed(self) -> bool:
    return bool(self.fresh or self.dropped)

  def describe(self) -> str:
    return (f"carried for {len(self.carried)} variables, started fresh for "
            f"{len(self.fresh)} newly trained, dropped for {len(self.dropped)} newly frozen")
