"""The best evaluated checkpoints of a run, and early stopping's state, in `output_dir/best`.

`best.json` holds, for the metric the run judges by (`--eval_early_stopping_metric`):
- the best value so far, its update and checkpoint (`value`, `update`, `checkpoint`);
- early stopping's state: `improved_at`, the update of the last improvement by more than
  the delta, and `evaluated_at`, the last update evaluated (so that a run killed between a
  save and its evaluation evaluates that update when it resumes);
- `kept`: the K best evaluations (`--keep_best_checkpoints`), best first, each with its
  update, value, all its dev figures, the weights evaluated (`weights`: the moving average
  where the run evaluates it, else the raw weights) and its checkpoint `ckpt-<update>` in
  this folder, which holds those weights. A run resumed to evaluate the other weights is
  refused, as one judging by another metric is: the two would be ranked together.
Checkpoints are named relative to the folder, so a moved or copied run reads its own.
The kept checkpoints are this folder's own: `--keep_checkpoint_max` never rotates them away.
A checkpoint's state file lists them worst to best, so a reader of the newest checkpoint
(`newest_first`) reads the best.

Every change is written in an order that a kill at any point leaves readable: the new
checkpoint first, then best.json (atomically), then the state file, then the evicted files;
at start, files of this folder that best.json does not list (a kill left them) are removed
and the state file is written again from best.json.
"""

from __future__ import annotations

import json
import os
import re

import tensorflow as tf
from absl import logging

from t2t_lite.core import older_formats
from t2t_lite.core.errors import UsageError
from t2t_lite.core.files import write_atomic
from t2t_lite.core.older_formats import BEST_FILE

CHECKPOINT_FILE = re.compile(r"ckpt-(\d+)\.(index|data-\d+-of-\d+)")


class BestCheckpoints:
  """The K best evaluations of one metric, and early stopping's state (see the module doc)."""

  def __init__(self, directory: str, metric: str, lower_is_better: bool, keep: int,
               delta: float = 0.0, weights: str = "raw"):
    self.directory, self.metric, self.lower_is_better = directory, metric, lower_is_better
    self.keep, self.delta, self.weights = keep, delta, weights
    self.state = self._read()  # None until the first evaluation
    if self.state is not None:
      self._tidy()

  # --- reading -------------------------------------------------------------------------
  def _read(self) -> dict | None:
    """The record of this run so far. One judged by another metric is refused, not replaced:
    a new best model would delete the ones kept."""
    state = older_formats.best_record(self.directory, _read_json)
    if state is None:
      return None
    if state.get("metric") != self.metric:
      raise UsageError(f"{self.directory} holds the best checkpoints by {state.get('metric')} "
                       f"and this run judges by {self.metric}, which would replace them; "
                       f"resume with --eval_early_stopping_metric={state.get('metric')}, or "
                       f"move {self.directory} away to keep them")
    ranked = {entry.get("weights", state.get("weights", "raw")) for entry in state["kept"]}
    if ranked - {self.weights}:
      raise UsageError(f"{self.directory} ranks the evaluations of the "
                       f"{'/'.join(sorted(ranked))} weights and this run evaluates the "
                       f"{self.weights} ones, which would rank the two together; resume with "
                       f"--eval_weights={'/'.join(sorted(ranked))}, or move {self.directory} "
                       "away to keep them")
    return state

  @property
  def value(self) -> float | None:
    return None if self.state is None else self.state["value"]

  def evaluated_at(self) -> int | None:
    """The last update evaluated (None: none, or a record from before it was kept)."""
    return None if self.state is None else self.state.get("evaluated_at")

  def kept(self) -> list[dict]:
    return [] if self.state is None else list(self.state["kept"])

  def better(self, value: float, than: float, by: float = 0.0) -> bool:
    return value < than - by if self.lower_is_better else value > than + by

  # --- recording -----------------------------------------------------------------------
  def record(self, update: int, figures: dict, model) -> None:
    """Evaluation `figures` of `update` (with self.metric among them); `model` holds the
    weights evaluated, saved if they rank among the K best."""
    value = float(figures[self.metric])
    state = dict(self.state or {"metric": self.metric, "value": value, "update": update,
                                "improved_at": update, "checkpoint": None, "kept": []})
    state.update(lower_is_better=self.lower_is_better, weights=self.weights, keep=self.keep,
                 evaluated_at=update)
    if self.state is not None and self.better(value, state["value"]):
      if self.better(value, state["value"], self.delta):
        state["improved_at"] = update
      state.update(value=value, update=update)
    entry = {"update": update, "value": value, "figures": figures, "weights": self.weights,
             "checkpoint": f"ckpt-{update}"}  # in this folder, wherever the run is moved
    ranked = sorted([e for e in state["kept"] if e["update"] != update] + [entry],
                    key=self._rank)
    kept, evicted = ranked[:self.keep], ranked[self.keep:]
    os.makedirs(self.directory, exist_ok=True)
    if entry in kept:
      self._write_checkpoint(model, update)
    state["kept"] = kept
    state["checkpoint"] = next((e["checkpoint"] for e in kept
                                if e["update"] == state["update"]), None)
    write_atomic(os.path.join(self.directory, BEST_FILE), json.dumps(state, indent=2))
    self.state = state
    self._write_state_file()
    for gone in evicted:
      if gone is not entry:
        self._remove(gone["update"])

  def _rank(self, entry: dict):
    """Best first; of equal values the earlier update (the best so far reached it first)."""
    return (entry["value"] if self.lower_is_better else -entry["value"], entry["update"])

  def _write_checkpoint(self, model, update: int) -> None:
    step = tf.Variable(update, dtype=tf.int64, trainable=False)
    checkpoint = tf.train.Checkpoint(model=model, update_step=step)
    checkpoint.save_counter.assign(update)  # held by every checkpoint a reader restores
    checkpoint.write(os.path.join(self.directory, f"ckpt-{update}"))

  def _write_state_file(self) -> None:
    kept = [os.path.basename(e["checkpoint"]) for e in reversed(self.state["kept"])]
    path = os.path.join(self.directory, "checkpoint")  # TensorFlow's text format, worst first
    if not kept:
      if os.path.exists(path):
        os.remove(path)
      return
    write_atomic(path, f'model_checkpoint_path: "{kept[-1]}"\n' + "".join(
        f'all_model_checkpoint_paths: "{name}"\n' for name in kept))

  def _remove(self, update: int) -> None:
    for name in os.listdir(self.directory):
      match = CHECKPOINT_FILE.fullmatch(name)
      if match and int(match.group(1)) == update:
        os.remove(os.path.join(self.directory, name))

  def _tidy(self) -> None:
    """What a kill between the steps of `record` left: unlisted checkpoint files removed,
    the state file written from best.json. A record of an earlier version (one best model,
    no `kept`) is read as a list of one."""
    if "kept" not in self.state:
      kept = [] if not self.state.get("checkpoint") else [{
          "update": self.state["update"], "value": self.state["value"],
          "checkpoint": self.state["checkpoint"], "figures": {self.metric: self.state["value"]}}]
      self.state = dict(self.state, kept=kept)
      return  # its files (a CheckpointManager's) are left as they are
    listed = {e["update"] for e in self.state["kept"]}
    stray = sorted({int(m.group(1)) for m in map(CHECKPOINT_FILE.fullmatch,
                                                  os.listdir(self.directory))
                    if m and int(m.group(1)) not in listed})
    for update in stray:
      self._remove(update)
    if stray:
      logging.info("removed unlisted checkpoints of %s left by an interrupted evaluation: %s",
                   self.directory, ", ".join(f"ckpt-{u}" for u in stray))
    self._write_state_file()

  # --- early stopping ------------------------------------------------------------------
  def stop_reason(self, update: int, steps: int) -> str | None:
    """Why to stop after `update` (no improvement by more than the delta for `steps`
    updates), or None."""
    if not steps or self.state is None:
      return None
    since = update - self.state["improved_at"]
    if since < steps:
      return None
    return (f"early stopping: {self.metric} has not improved by more than {self.delta:g} for "
            f"{since} updates (best {self.state['value']:.4f} at update "
            f"{self.state['update']}, kept in {self.directory})")


def read(directory: str) -> tuple[dict, list[str]]:
  """The record of a run's best checkpoints (`RUN/best`), for readers such as the averager,
  and the paths of the kept ones in `directory`, best first; a usage error when there is no
  record."""
  state = older_formats.best_record(directory, _read_json)
  if state is None:
    raise UsageError(f"{directory} holds no record of best checkpoints ({BEST_FILE}); train "
                     "with evaluations (--local_eval_frequency) to keep them")
  kept = state.get("kept") or ([{"checkpoint": state["checkpoint"]}]
                               if state.get("checkpoint") else [])
  return state, [os.path.join(directory, os.path.basename(e["checkpoint"])) for e in kept]


def _read_json(path: str) -> dict:
  try:
    with open(path) as f:
      value = json.load(f)
  except (OSError, ValueError) as err:
    raise UsageError(f"{path} is unreadable ({str(err).splitlines()[0][:120]}); restore it, "
                     f"or move {os.path.dirname(path)} away to start a new best model") from None
  if not isinstance(value, dict):
    raise UsageError(f"{path} is not a JSON object; restore it, or move "
                     f"{os.path.dirname(path)} away to start a new best model")
  return value
