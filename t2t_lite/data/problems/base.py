"""A translation problem: raw parallel text -> joint sentencepiece vocab -> TFRecord shards.

Files in `data_dir`, all named after the problem:
  <problem>.manifest.json                    counts, drops, checksums, and the folder below
  <problem>.data-<time>-<pid>/               one datagen's files:
    <problem>.vocab.model                      the sentencepiece model
    <problem>-<split>-<i>-of-<n>.tfrecord      tf.train.Example: inputs, targets; train
                                               shuffled, dev and test in input order (+ raw);
                                               with subword sampling, train_sampled too
    <problem>-<split>.{lengths,offsets}.npy    the training splits' store, which the trainer
    <problem>-<split>.{inputs,targets}.ids     reads by index (problems.store)

A datagen writes its files into a folder of its own that nothing reads yet, then writes the
manifest naming it under a temporary name and renames it into place: that one rename makes
the new data visible, whole, and only then is the previous data removed. A datagen that
dies midway leaves the old data whole and a folder that the next datagen removes.
"""

from __future__ import annotations

import abc
import json
import os
import re
import shutil
import time

from absl import logging

from t2t_lite.core import faults, older_formats
from t2t_lite.core import files as files_lib
from t2t_lite.core.errors import RunError, UsageError
from t2t_lite.core.files import write_atomic
from t2t_lite.data import shards as shards_lib
from t2t_lite.data.corpora import SAMPLED, TrainingCorpora
from t2t_lite.data import store as store_lib
from t2t_lite.data.snapshot import DataSnapshot, is_training_split
from t2t_lite.data import vocab as vocab_lib
from t2t_lite.data.text import RawSplit, file_sha256

SPLITS = ("train", "dev", "test")  # of the raw data
MANIFEST_VERSION = 2  # 2: training shards shuffled, vocabulary from a seeded sample


def _remove_stale_temporaries(data_dir: str, problem: str, current: str | None) -> None:
  """What a datagen that was killed left (its process is gone): temporary files, and folders
  of `problem` that the manifest does not name (`current` is the one it names)."""
  for name in os.listdir(data_dir):
    path = os.path.join(data_dir, name)
    found = re.search(rf"\.(?:new|tmp)-({files_lib.TAG})$", name)
    if found and files_lib.stale(found.group(1)):
      os.remove(path)
      logging.info("removed %s, left by a datagen that was stopped", name)
      continue
    found = re.fullmatch(re.escape(problem) + rf"\.data-\d+-({files_lib.TAG})", name)
    if found and name != current and os.path.isdir(path) and files_lib.stale(found.group(1)):
      shutil.rmtree(path)
      logging.info("removed %s, left by a datagen that was stopped", name)


def _remove_data(data_dir: str, manifest: dict, vocab_name: str) -> None:
  """The files of replaced data: its folder, or (data made before folders) the files its
  manifest lists in data_dir itself (and its vocabulary, `vocab_name`)."""
  if manifest["dir"]:
    shutil.rmtree(os.path.join(data_dir, manifest["dir"]), ignore_errors=True)
    return
  names = [vocab_name] + [
      name for split in manifest.get("splits", {}).values()
      for name in split.get("files", []) + split.get("store", {}).get("files", [])]
  for name in names:
    path = os.path.join(data_dir, os.path.basename(name))
    if os.path.isfile(path):
      os.remove(path)


class TranslateProblem(abc.ABC):
  """Base of the translation problems: subclasses say where raw pairs come from."""

  name = ""  # set by registration
  source_lang = "en"
  target_lang = "de"
  vocab_size = 8000
  num_train_shards = 4
  datagen_seed = 1  # of the vocabulary sample, the order of the training shards, sampling
  sampling_copies = 0  # subword sampling of the training split (configure)
  sampling_alpha = 0.0
  corpora = TrainingCorpora()  # several training corpora (configure; none: the own one)

  # --- what subclasses provide -------------------------------------------------------
  @abc.abstractmethod
  def read_raw(self, split: str, tmp_dir: str) -> RawSplit:
    """The pairs of `split` ("train", "dev" or "test") in the raw data in `tmp_dir`, as a
    RawSplit that streams them (datagen reads train twice, dev and test twice)."""

  def input_fingerprint(self, tmp_dir: str) -> dict:
    """What identifies the raw inputs; a change makes datagen run again."""
    return {}

  def configure(self, vocab_size: int = 0, sampling_copies: int = 0,
                sampling_alpha: float = 0.0, corpora=(), back_translated=(), **options) -> None:
    """Datagen options: a vocabulary size other than the problem's (0: keep it), subword
    sampling of the training split (`sampling_copies` segmentations of every pair, drawn at
    `sampling_alpha`; 0 copies: the one best segmentation), more training corpora
    (`corpora`, `back_translated`: --corpus and --back_translated, see data.corpora), and
    problem-specific ones (e.g. languages for a folder corpus)."""
    self.corpora = TrainingCorpora(corpora, back_translated)
    if vocab_size < 0:
      raise UsageError(f"--vocab_size={vocab_size} must be positive (0: the problem's default)")
    if vocab_size:
      self.vocab_size = vocab_size
    if sampling_copies == 1 or sampling_copies < 0:
      raise UsageError(f"--subword_sampling_copies={sampling_copies}: give 2 or more sampled "
                       "segmentations of every training pair, or 0 for none")
    if sampling_copies and not 0.0 < sampling_alpha <= 1.0:
      raise UsageError(f"--subword_sampling_alpha={sampling_alpha:g} must be in (0, 1] (1: the "
                       "vocabulary's own probabilities; lower: more varied segmentations)")
    if not sampling_copies and sampling_alpha:
      raise UsageError("--subword_sampling_alpha needs --subword_sampling_copies (2 or more)")
    self.sampling_copies, self.sampling_alpha = sampling_copies, sampling_alpha
    given = sorted(name for name, value in options.items() if value)
    if given:
      raise UsageError(f"problem {self.name} takes no {', '.join('--' + n for n in given)}")

  # --- files -------------------------------------------------------------------------
  def manifest_file(self, data_dir: str) -> str:
    return os.path.join(data_dir, f"{self.name}.manifest.json")

  def _read_manifest(self, data_dir: str) -> dict | None:
    """The manifest in its current form (older_formats.data_manifest), or None if there is none
    or it is unreadable (an interrupted or foreign datagen)."""
    try:
      with open(self.manifest_file(data_dir)) as f:
        return older_formats.data_manifest(json.load(f))
    except (OSError, ValueError, TypeError):
      return None

  def files_dir(self, data_dir: str, manifest: dict | None = None) -> str:
    """The folder of the data's files, as the manifest names it."""
    manifest = manifest if manifest is not None else self._read_manifest(data_dir)
    return os.path.join(data_dir, manifest["dir"]) if manifest else data_dir

  def vocab_file(self, data_dir: str, manifest: dict | None = None) -> str:
    return os.path.join(self.files_dir(data_dir, manifest), f"{self.name}.vocab.model")

  def shard_names(self, split: str, num_shards: int) -> list[str]:
    return [f"{self.name}-{split}-{i:05d}-of-{num_shards:05d}.tfrecord"
            for i in range(num_shards)]

  def snapshot(self, data_dir: str, vocab_only: bool = False) -> DataSnapshot:
    """`data_dir` as its datagen left it, its manifest read once (see problems.snapshot)."""
    return DataSnapshot(self, data_dir, vocab_only)

  def manifest(self, data_dir: str) -> dict:
    return self.snapshot(data_dir).manifest

  def data_files(self, data_dir: str, split: str) -> list[str]:
    """The TFRecord shards of `split`, checked against the manifest (names and sizes)."""
    return self.snapshot(data_dir).files(split)

  def training_store(self, data_dir: str, split: str) -> store_lib.ExampleStore:
    """The store of training split `split` (checked as data_files checks the shards)."""
    return self.snapshot(data_dir).store(split)

  def get_vocab(self, data_dir: str) -> vocab_lib.SubwordVocab:
    return self.snapshot(data_dir, vocab_only=True).vocab()

  def vocab_size_in(self, data_dir: str | None) -> int:
    """The real vocabulary size when data exists, else the problem's nominal size."""
    if data_dir and os.path.isfile(self.vocab_file(data_dir)):
      return self.get_vocab(data_dir).size
    return self.vocab_size

  # --- datagen -----------------------------------------------------------------------
  def _settings(self) -> dict:
    settings = {"vocab_size": self.vocab_size, "num_train_shards": self.num_train_shards,
                "source_lang": self.source_lang, "target_lang": self.target_lang,
                "datagen_seed": self.datagen_seed, "version": MANIFEST_VERSION,
                "subword_sampling": ({"copies": self.sampling_copies,
                                      "alpha": self.sampling_alpha}
                                     if self.sampling_copies else None)}
    return settings | self.corpora.settings()

  def split_names(self) -> tuple[str, ...]:
    """The splits datagen writes: each corpus's training splits (the one best, and the
    sampled segmentations when it samples them), then dev and test."""
    return tuple(self.corpora.training_splits(bool(self.sampling_copies))) + SPLITS[1:]

  def _inputs(self, tmp_dir: str) -> dict:
    """input_fingerprint, and the files of the other corpora."""
    return self.input_fingerprint(tmp_dir) | self.corpora.inputs(self.source_lang,
                                                                 self.target_lang)

  def _up_to_date(self, data_dir: str, inputs: dict) -> bool:
    old = self._read_manifest(data_dir)
    if old is None:
      return False
    if (old.get("inputs") != inputs or old.get("settings") != self._settings()
        or old.get("problem") != self.name
        or sorted(old.get("splits") or {}) != sorted(self.split_names())):
      return False
    vocab_path = self.vocab_file(data_dir, old)
    if not os.path.isfile(vocab_path) or file_sha256(vocab_path) != old.get("vocab", {}).get(
        "sha256"):
      return False
    try:
      for split in old["splits"].values():
        store = split.get("store") or {"files": [], "bytes": []}  # (see _add_stores)
        for name, size in zip(split["files"] + store["files"], split["bytes"] + store["bytes"],
                              strict=True):
          path = os.path.join(self.files_dir(data_dir, old), name)
          if not os.path.isfile(path) or os.path.getsize(path) != size:
            return False
    except (KeyError, TypeError, ValueError):  # a manifest of another version: redo
      return False
    return True

  def _refuse_other_data(self, data_dir: str, inputs: dict, overwrite: bool) -> None:
    """A data directory holding this problem's data made from other inputs or settings is
    not replaced unasked: runs trained on it would read the new data."""
    old = self._read_manifest(data_dir)
    if old is None or overwrite:
      return  # no finished data here (none, or an interrupted datagen): nothing to keep
    differ = []
    if old.get("inputs") != inputs:
      differ.append("inputs")
    old_settings = dict(old.get("settings") or {}, version=None)
    new_settings = dict(self._settings(), version=None)
    differ += sorted(f"{k} {old_settings.get(k)!r} -> {v!r}" for k, v in new_settings.items()
                     if old_settings.get(k) != v)
    if SAMPLED in old.get("splits", {}) and "train" not in old["splits"]:
      differ.append("the sampled copies without the one best (an earlier datagen) -> both")
    if differ:
      raise UsageError(
          f"--data_dir={data_dir} holds {self.name} data made from other inputs or settings "
          f"({'; '.join(differ)}), which runs may be using; write the new data to another "
          "--data_dir, or pass --overwrite to replace it (runs that recorded its "
          "vocabulary then refuse the new one)")

  def generate_data(self, data_dir: str, tmp_dir: str, overwrite: bool = False) -> dict:
    """Runs datagen unless its outputs are already complete for the same inputs.

    Streams every split (memory holds a chunk, a bucket of the shuffle or the vocabulary
    sample, never a split): dev and test are read once to check them, train once for the
    vocabulary sample and once more to encode it into shuffled shards; dev and test are
    then written in input order, which decoding and BLEU rely on. Returns the manifest, with
    "skipped": True when nothing had to be done.

    The new files go to a folder of their own beside the old data; once all are complete,
    one rename of the new manifest (which names that folder) replaces the old data, whose
    files are removed after it. A killed datagen leaves the old data whole. Data made from
    other inputs or settings is replaced only with `overwrite`.
    """
    os.makedirs(data_dir, exist_ok=True)
    if not os.access(data_dir, os.W_OK):
      raise UsageError(f"--data_dir {data_dir} is not writable")
    inputs = self._inputs(tmp_dir)
    if self._up_to_date(data_dir, inputs):
      manifest = self.manifest(data_dir)
      if any("store" not in manifest["splits"][split] for split in self._stored(manifest)):
        return self._add_stores(data_dir, manifest)
      manifest["skipped"] = True
      return manifest
    self._refuse_other_data(data_dir, inputs, overwrite)
    old = self._read_manifest(data_dir)
    _remove_stale_temporaries(data_dir, self.name, old and old["dir"])
    raw = {split: self.read_raw(split, tmp_dir) for split in SPLITS[1:]}
    for split in ("dev", "test"):  # small: a bad line there stops datagen before the long part
      for _ in raw[split]:
        pass
      self._check_read(split, raw[split])
    raw["train"] = self.corpora.raw(self.read_raw("train", tmp_dir), self.source_lang,
                                    self.target_lang)
    model_bytes = self._train_vocab(raw["train"])
    folder = f"{self.name}.data-{int(time.time())}-{files_lib.writer_tag()}"
    os.makedirs(os.path.join(data_dir, folder))  # nothing reads it until the manifest says so
    try:
      manifest = self._write_files(data_dir, folder, inputs, raw, model_bytes)
      faults.from_environment().datagen_written()
      # The one rename that replaces the old data with the new.
      write_atomic(self.manifest_file(data_dir),
                   json.dumps(manifest, indent=2, sort_keys=True).encode())
    except BaseException:  # a failed datagen leaves the old data as it was
      shutil.rmtree(os.path.join(data_dir, folder), ignore_errors=True)
      raise
    if old is not None:
      _remove_data(data_dir, old, os.path.basename(self.vocab_file("", old)))
    manifest["skipped"] = False
    return older_formats.data_manifest(manifest)

  def _train_vocab(self, corpora: list) -> bytes:
    """The vocabulary's model file (bytes), from a seeded sample of the training sentences."""
    sample = vocab_lib.reservoir_sample(
        (sentence for corpus in corpora for sentence in corpus.sentences()),
        vocab_lib.SAMPLE_SENTENCES, self.datagen_seed)
    for index, corpus in enumerate(corpora):
      self._check_read(self.corpora.label(index), corpus)
    reserved = (vocab_lib.BT_TAG,) if self.corpora.any_tagged else ()  # tagged back-translation
    try:
      return vocab_lib.train_sentencepiece(sample, self.vocab_size, self.datagen_seed, reserved)
    except vocab_lib.VocabSizeTooHigh as err:
      raise UsageError(f"the {self.name} training text is too small for a {self.vocab_size}-piece "
                       f"vocabulary (at most {err.limit}); pass a smaller --vocab_size") from None

  def _write_files(self, data_dir: str, folder: str, inputs: dict, raw: dict,
                   model_bytes: bytes) -> dict:
    """Writes the vocabulary and shards into data_dir/folder; returns the manifest."""
    manifest = {"problem": self.name, "dir": folder}
    write_atomic(self.vocab_file(data_dir, manifest), model_bytes)
    vocab = vocab_lib.SubwordVocab(self.vocab_file(data_dir, manifest))
    at = lambda name: os.path.join(data_dir, folder, name)  # noqa: E731
    splits, training = {}, self.corpora.training_splits(bool(self.sampling_copies))
    for split in self.split_names():
      data = raw["train"][training[split][0]] if split in training else raw[split]
      expected = data.kept
      if split in training:  # the one best, or the sampled copies
        names = self.shard_names(split, self.num_train_shards)
        copies, alpha = ((self.sampling_copies, self.sampling_alpha) if training[split][1]
                         else (1, 0.0))
        tag = vocab.reserved_ids() if self.corpora.tagged(training[split][0]) else ()
        written = shards_lib.write_shuffled(vocab, data, [at(n) for n in names], expected,
                                            self.datagen_seed, copies, alpha, tag)
        expected *= copies  # records: every pass reads the split again
      else:
        names = self.shard_names(split, 1)
        written = shards_lib.write_in_order(vocab, data, at(names[0]))
      if written != expected:
        raise RunError(f"the {split} split of {self.name} changed while datagen read it "
                       f"({expected} records expected, {written} written; {data.source}); "
                       "run datagen again")
      splits[split] = {"read": data.read, "kept": data.kept, "dropped": data.dropped,
                       "source": data.source, "files": names,
                       "bytes": [os.path.getsize(at(n)) for n in names]}
      if split in training:
        splits[split]["store"] = store_lib.write([at(n) for n in names],
                                                 os.path.join(data_dir, folder),
                                                 f"{self.name}-{split}", vocab.size)
    return {**manifest, "inputs": inputs, "settings": self._settings(),
            **self.corpora.manifest(),
            "vocab": {"file": os.path.basename(self.vocab_file(data_dir, manifest)),
                      "size": vocab.size, "sha256": vocab_lib.sha256(model_bytes)},
            "splits": splits}

  @staticmethod
  def _stored(manifest: dict) -> list[str]:
    """The splits of `manifest` that have (or need) a store: the training splits."""
    return [split for split in manifest["splits"] if is_training_split(split)]

  def _add_stores(self, data_dir: str, manifest: dict) -> dict:
    """Data made before the store, otherwise up to date: its training splits' stores are
    written beside the records (which stay as they are), then the manifest naming them
    replaces the old one in one rename."""
    folder = self.files_dir(data_dir, manifest)
    _remove_stale_temporaries(folder, self.name, manifest["dir"])  # of a killed earlier try
    vocab_size = manifest["vocab"]["size"]
    written = dict(manifest, splits=dict(manifest["splits"]))
    written.pop("skipped", None)
    added = []
    for split in self._stored(manifest):
      info = manifest["splits"][split]
      if "store" not in info:
        files = [os.path.join(folder, name) for name in info["files"]]
        written["splits"][split] = dict(info, store=store_lib.write(
            files, folder, f"{self.name}-{split}", vocab_size))
        added.append(split)
    write_atomic(self.manifest_file(data_dir),
                 json.dumps(written, indent=2, sort_keys=True).encode())
    logging.info("%s: added the store of %s to the data in %s", self.name, ", ".join(added),
                 data_dir)
    return dict(older_formats.data_manifest(written), skipped=False, stores_added=added)

  def _check_read(self, split: str, data: RawSplit) -> None:
    if not data.kept:
      raise UsageError(f"the {split} split of {self.name} has no usable sentence pairs "
                       f"(read {data.read} lines from {data.source})")
    logging.info("%s %s: %d pairs read, %d kept", self.name, split, data.read, data.kept)
