"""Older formats of the records a run and a datagen write, in one place. What a file
written by an earlier t2t-lite lacks is filled in here, as it is read, or refused with what
to do; the rest of the code sees the current format only. (A training checkpoint's older
forms are resuming's, in training.resume.)

- Run records (`hparams.json`): runs from before the data record and the seed have `data`
  and `random_seed` set to None (nothing to compare; the --random_seed flag applies), and
  from before the time budget was recorded `train_minutes` None (--train_minutes applies),
  and from before the batch sizes and steps were recorded `xla_compile` None (not compared);
  an hparam added since records began takes the value that reproduces what the run did
  before it existed (ADDED_HPARAMS: no dropout ramp, one accumulate n, the training split
  from the start), and the hparams no version reads any more (hparams.RETIRED) are dropped.
- Datagen manifests: data made before each datagen wrote into a folder of its own has its
  files in the data directory itself (`dir` is ""); data made before subword sampling has
  one segmentation (`subword_sampling` None); sampled data made before the one best was kept
  beside the sampled copies has its sampled "train" read as "train_sampled" (and no "train":
  datagen replaces it only with --overwrite, and a run that wants the one best first is
  refused).
- Averaged checkpoints made before averages recorded their update are refused (average
  again; runs.checkpoints.update_of).
- The best model's record: `best/bleu.json` (before early stopping) reads as `best.json`
  judged by dev BLEU.
"""

from __future__ import annotations

import os


from t2t_lite.core.hparams import RETIRED

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
