"""Older formats, in one place. What a file written by an earlier t2t-lite lacks is filled in
here, as it is read, or refused with what to do; the rest of the code sees the current
format only.

- Run records (`hparams.json`): runs from before the data record and the seed have `data`
  and `random_seed` set to None (nothing to compare; the --random_seed flag applies), and
  from before the time budget was recorded `train_minutes` None (--train_minutes applies),
  and from before the batch plan was recorded `xla_compile` None (not compared);
  an hparam added since records began takes the value that reproduces what the run did
  before it existed (ADDED_HPARAMS: no dropout ramp, one accumulate n, the training split
  from the start), and the hparams no version reads any more (hparams.RETIRED) are dropped.
- Checkpoints of a training run: from before the update in progress was recorded
  (`in_update`), it is derived from the micro-step counter (n was constant then); from
  before layouts were recorded (`layout`), the layout is one replica with the recorded
  accumulate steps; from before the planned stream (a tf.data iterator, one per replica
  before that) only with --allow_stream_change, at its update on the planned stream; from
  before the run's training time was recorded, that time starts at 0.
- Datagen manifests: data made before each datagen wrote into a folder of its own has its
  files in the data directory itself (`dir` is ""); data made before subword sampling has
  one segmentation (`subword_sampling` None); sampled data made before the one best was kept
  beside the sampled copies has its sampled "train" read as "train_sampled" (and no "train":
  datagen replaces it only with --overwrite, and a run that wants the one best first is
  refused).
- Averaged checkpoints made before averages recorded their update are refused (average
  again).
- The best model's record: `best/bleu.json` (before early stopping) reads as `best.json`
  judged by dev BLEU.
"""

from __future__ import annotations

import os

from absl import logging

from t2t_lite.errors import UsageError
from t2t_lite.hparams import RETIRED

# Hparams added since run records began whose registered values changed what a run does,
# each with the value that reproduces what a run recorded before it existed did (run_record
# fills them in; tests/test_formats.py has a test per entry): without them a resumed run
# would take its set's value of today. The others added since keep a run's meaning with
# every set's value: optimizer_multistep_accumulate_schedule is "" (one n),
# learning_rate_cooldown is read only by the linear_cooldown factor, which no schedule had,
# and dropout_ramp_initial, 0.0, only with a ramp.
ADDED_HPARAMS = {
    "dropout_ramp_start": 0,          # no dropout ramp: the set's rate from update 1
    "dropout_ramp_end": 0,
    "subword_sampling_start": 0,      # the training split, sampled or not, from the start
    "subword_sampling_min_updates": 0,
}
# Checkpoint objects that later versions added (see checkpoint_lacks).
ADDED_TO_CHECKPOINTS = ("in_update", "layout")
BEST_FILE = "best.json"
OLDER_BEST_FILE = "bleu.json"


def run_record(meta: dict | None) -> dict | None:
  """The current form of a run record (None stays None: no run there)."""
  if meta is None:
    return None
  meta = {"data": None, "random_seed": None, "train_minutes": None, "xla_compile": None,
          **meta}
  if isinstance(meta.get("hparams"), dict):
    meta["hparams"] = {**ADDED_HPARAMS, **{name: value for name, value in
                                           meta["hparams"].items() if name not in RETIRED}}
  return meta


def data_manifest(manifest: dict) -> dict:
  """The current form of a datagen manifest: `dir`, the folder of its files, and the
  settings' `subword_sampling` (None: one segmentation), and with it the "train_sampled"
  split."""
  manifest = {"dir": "", **manifest}
  if isinstance(manifest.get("settings"), dict):
    manifest["settings"] = {"subword_sampling": None, **manifest["settings"]}
    splits = manifest.get("splits")
    if (manifest["settings"]["subword_sampling"] and isinstance(splits, dict)
        and "train_sampled" not in splits and "train" in splits):
      # Its "train" holds the sampled copies, and no split the one best.
      manifest["splits"] = {("train_sampled" if name == "train" else name): info
                            for name, info in splits.items()}
  return manifest


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


def upgrade_restored(learner, lacks: set[str], meta: dict | None, path: str) -> None:
  """Fills in what a restored checkpoint lacked (`checkpoint_lacks`), on `learner`."""
  steps = learner.accumulate_steps(int(learner.update_step.numpy()) + 1)
  if "in_update" in lacks:  # n was constant: the position follows from the micro-steps
    learner.in_update.assign(int(learner.micro_step.numpy()) % steps)
  if "layout" in lacks:  # one replica, with the accumulate steps the run recorded
    hparams = (meta or {}).get("hparams", {})
    recorded = hparams.get("optimizer_multistep_accumulate_steps")
    if recorded is not None and not hparams.get("effective_batch_tokens") and recorded != steps:
      raise UsageError(
          f"checkpoint {path} predates recorded layouts and was trained with "
          f"optimizer_multistep_accumulate_steps={recorded}; resume it with that value")
    learner.layout.assign([1, steps])
  learner.forget_host_counters()


def checkpoint_update(path: str) -> int:
  """The update checkpoint `path` records (checkpoints.recorded_update); ValueError for an
  average made before averages recorded it."""
  from t2t_lite.checkpoints import recorded_update
  update = recorded_update(path)
  if update is None:
    raise ValueError("it records no update (an average made by an older "
                     "t2t-lite-avg-checkpoints: average again)")
  return update


def best_record(best_dir: str, read_json) -> dict | None:
  """The best model's record in `best_dir` in the current form, or None if there is none;
  `read_json(path)` reads (and checks) a JSON file."""
  path = os.path.join(best_dir, BEST_FILE)
  if os.path.isfile(path):
    return read_json(path)
  older = os.path.join(best_dir, OLDER_BEST_FILE)
  if not os.path.isfile(older):
    return None
  kept = read_json(older)  # written before early stopping: the best by dev BLEU
  return {"metric": "dev_bleu", "value": kept["bleu"], "update": kept["update"],
          "improved_at": kept["update"], "checkpoint": kept.get("checkpoint")}
