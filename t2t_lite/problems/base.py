"""A translation problem: raw parallel text -> joint sentencepiece vocab -> TFRecord shards.

Files in `data_dir`, all named after the problem:
  <problem>.vocab.model                      the sentencepiece model
  <problem>-<split>-<i>-of-<n>.tfrecord      tf.train.Example: inputs, targets (+ raw text)
  <problem>.manifest.json                    written last; counts, drops, checksums

Every file is written under a temporary name and renamed, and the manifest comes last, so
a run that dies midway leaves no file that a later run could mistake for finished work.
"""

from __future__ import annotations

import abc
import gzip
import hashlib
import json
import os
from dataclasses import dataclass, field
from absl import logging

from t2t_lite.errors import UsageError
from t2t_lite.files import atomic_path, write_atomic
from t2t_lite.problems import vocab as vocab_lib

SPLITS = ("train", "dev", "test")
MANIFEST_VERSION = 1


@dataclass
class RawSplit:
  """Sentence pairs read from one split, with what was dropped and why."""
  pairs: list[tuple[str, str]]
  read: int
  dropped: dict[str, int] = field(default_factory=dict)
  source: str = ""


def open_text(path: str):
  return gzip.open(path, "rb") if path.endswith(".gz") else open(path, "rb")


def read_lines(path: str) -> list[str]:
  """Lines of a plain or gzip UTF-8 file, without line ends; invalid UTF-8 is an error."""
  lines = []
  with open_text(path) as f:
    for number, raw in enumerate(f, start=1):
      try:
        lines.append(raw.decode("utf-8").rstrip("\r\n"))
      except UnicodeDecodeError as err:
        raise UsageError(f"{path}: line {number} is not valid UTF-8 ({err.reason} at byte "
                         f"{err.start}); fix or re-encode the file as UTF-8") from None
  return lines


def read_parallel(source_path: str, target_path: str) -> RawSplit:
  """Aligned pairs of two files; counts must match; empty pairs are dropped and counted."""
  for path in (source_path, target_path):
    if not os.path.isfile(path):
      raise UsageError(f"missing data file {os.path.basename(path)}: looked for {path}")
  sources, targets = read_lines(source_path), read_lines(target_path)
  if len(sources) != len(targets):
    raise UsageError(f"line counts differ: {source_path} has {len(sources)} lines, "
                     f"{target_path} has {len(targets)}; the files must be line-aligned")
  pairs, empty = [], 0
  for source, target in zip(sources, targets):
    source, target = source.strip(), target.strip()
    if not source or not target:
      empty += 1
      continue
    pairs.append((source, target))
  return RawSplit(pairs=pairs, read=len(sources), dropped={"empty_or_whitespace": empty},
                  source=f"{source_path} + {target_path}")


def file_sha256(path: str) -> str:
  digest = hashlib.sha256()
  with open(path, "rb") as f:
    for block in iter(lambda: f.read(1 << 20), b""):
      digest.update(block)
  return digest.hexdigest()


def _int_feature(values):
  import tensorflow as tf
  return tf.train.Feature(int64_list=tf.train.Int64List(value=values))


def _bytes_feature(value: str):
  import tensorflow as tf
  return tf.train.Feature(bytes_list=tf.train.BytesList(value=[value.encode("utf-8")]))


class TranslateProblem(abc.ABC):
  """Base of the translation problems: subclasses say where raw pairs come from."""

  name = ""  # set by registration
  source_lang = "en"
  target_lang = "de"
  vocab_size = 8000
  num_train_shards = 4

  # --- what subclasses provide -------------------------------------------------------
  @abc.abstractmethod
  def read_raw(self, split: str, tmp_dir: str) -> RawSplit:
    """The pairs of `split` ("train", "dev" or "test") from the raw data in `tmp_dir`."""

  def input_fingerprint(self, tmp_dir: str) -> dict:
    """What identifies the raw inputs; a change makes datagen run again."""
    return {}

  def configure(self, vocab_size: int = 0, **options) -> None:
    """Datagen options: a vocabulary size other than the problem's (0: keep it), and
    problem-specific ones (e.g. languages for a folder corpus)."""
    if vocab_size < 0:
      raise UsageError(f"--vocab_size={vocab_size} must be positive (0: the problem's default)")
    if vocab_size:
      self.vocab_size = vocab_size
    given = sorted(name for name, value in options.items() if value)
    if given:
      raise UsageError(f"problem {self.name} takes no {', '.join('--' + n for n in given)}")

  # --- files -------------------------------------------------------------------------
  def vocab_file(self, data_dir: str) -> str:
    return os.path.join(data_dir, f"{self.name}.vocab.model")

  def manifest_file(self, data_dir: str) -> str:
    return os.path.join(data_dir, f"{self.name}.manifest.json")

  def shard_files(self, data_dir: str, split: str, num_shards: int) -> list[str]:
    return [os.path.join(data_dir, f"{self.name}-{split}-{i:05d}-of-{num_shards:05d}.tfrecord")
            for i in range(num_shards)]

  def manifest(self, data_dir: str) -> dict:
    path = self.manifest_file(data_dir)
    if not os.path.isfile(path):
      raise UsageError(f"no prepared data for problem {self.name} in {data_dir} "
                       f"({os.path.basename(path)} is missing); run t2t-lite-datagen "
                       f"--problem={self.name} --data_dir={data_dir} --tmp_dir=<raw data>")
    with open(path) as f:
      return json.load(f)

  def data_files(self, data_dir: str, split: str) -> list[str]:
    """The TFRecord shards of `split`, checked against the manifest."""
    info = self.manifest(data_dir)["splits"].get(split)
    if info is None:
      raise UsageError(f"problem {self.name} has no '{split}' split in {data_dir}")
    files = [os.path.join(data_dir, name) for name in info["files"]]
    for path in files:
      if not os.path.isfile(path):
        raise UsageError(f"data file {path} listed in the manifest is missing; "
                         f"run t2t-lite-datagen --problem={self.name} again")
    return files

  def get_vocab(self, data_dir: str) -> vocab_lib.SubwordVocab:
    path = self.vocab_file(data_dir)
    if not os.path.isfile(path):
      raise UsageError(f"vocabulary {path} is missing; run t2t-lite-datagen "
                       f"--problem={self.name} --data_dir={data_dir} first")
    return vocab_lib.SubwordVocab(path)

  def vocab_size_in(self, data_dir: str | None) -> int:
    """The real vocabulary size when data exists, else the problem's nominal size."""
    if data_dir and os.path.isfile(self.vocab_file(data_dir)):
      return self.get_vocab(data_dir).size
    return self.vocab_size

  # --- datagen -----------------------------------------------------------------------
  def _settings(self) -> dict:
    return {"vocab_size": self.vocab_size, "num_train_shards": self.num_train_shards,
            "source_lang": self.source_lang, "target_lang": self.target_lang,
            "version": MANIFEST_VERSION}

  def _up_to_date(self, data_dir: str, inputs: dict) -> bool:
    path = self.manifest_file(data_dir)
    if not os.path.isfile(path):
      return False
    try:
      with open(path) as f:
        old = json.load(f)
    except (OSError, ValueError):
      return False
    if (old.get("inputs") != inputs or old.get("settings") != self._settings()
        or old.get("problem") != self.name):
      return False
    vocab_path = self.vocab_file(data_dir)
    if not os.path.isfile(vocab_path) or file_sha256(vocab_path) != old.get("vocab", {}).get(
        "sha256"):
      return False
    try:
      for split in old["splits"].values():
        for name, size in zip(split["files"], split["bytes"], strict=True):
          path = os.path.join(data_dir, name)
          if not os.path.isfile(path) or os.path.getsize(path) != size:
            return False
    except (KeyError, TypeError, ValueError):  # a manifest of another version: redo
      return False
    return True

  def generate_data(self, data_dir: str, tmp_dir: str) -> dict:
    """Runs datagen unless its outputs are already complete for the same inputs.

    Returns the manifest, with "skipped": True when nothing had to be done.
    """
    os.makedirs(data_dir, exist_ok=True)
    if not os.access(data_dir, os.W_OK):
      raise UsageError(f"--data_dir {data_dir} is not writable")
    inputs = self.input_fingerprint(tmp_dir)
    if self._up_to_date(data_dir, inputs):
      manifest = self.manifest(data_dir)
      manifest["skipped"] = True
      return manifest
    raw = {split: self.read_raw(split, tmp_dir) for split in SPLITS}
    for split, data in raw.items():
      if not data.pairs:
        raise UsageError(f"the {split} split of {self.name} has no usable sentence pairs "
                         f"(read {data.read} lines from {data.source})")
      logging.info("%s %s: %d pairs read, %d kept", self.name, split, data.read,
                   len(data.pairs))

    train_text = [s for pair in raw["train"].pairs for s in pair]
    try:
      model_bytes = vocab_lib.train_sentencepiece(train_text, self.vocab_size)
    except vocab_lib.VocabSizeTooHigh as err:
      raise UsageError(f"the {self.name} training text is too small for a {self.vocab_size}-piece "
                       f"vocabulary (at most {err.limit}); pass a smaller --vocab_size") from None
    write_atomic(self.vocab_file(data_dir), model_bytes)
    vocab = self.get_vocab(data_dir)

    splits = {}
    for split, data in raw.items():
      shards = self.num_train_shards if split == "train" else 1
      files = self.shard_files(data_dir, split, shards)
      self._write_records(vocab, data.pairs, files, keep_text=split != "train")
      splits[split] = {"read": data.read, "kept": len(data.pairs), "dropped": data.dropped,
                       "source": data.source, "files": [os.path.basename(p) for p in files],
                       "bytes": [os.path.getsize(p) for p in files]}
    manifest = {"problem": self.name, "inputs": inputs, "settings": self._settings(),
                "vocab": {"file": os.path.basename(self.vocab_file(data_dir)),
                          "size": vocab.size, "sha256": vocab_lib.sha256(model_bytes)},
                "splits": splits}
    write_atomic(self.manifest_file(data_dir),
                  json.dumps(manifest, indent=2, sort_keys=True).encode())
    manifest["skipped"] = False
    return manifest

  @staticmethod
  def _write_records(vocab, pairs, files, keep_text: bool) -> None:
    import tensorflow as tf
    sources = vocab.encode_batch([s for s, _ in pairs])
    targets = vocab.encode_batch([t for _, t in pairs])
    for shard, path in enumerate(files):
      with atomic_path(path) as tmp, tf.io.TFRecordWriter(tmp) as writer:
        for i in range(shard, len(pairs), len(files)):
          feature = {"inputs": _int_feature(sources[i]), "targets": _int_feature(targets[i])}
          if keep_text:
            feature["inputs_text"] = _bytes_feature(pairs[i][0])
            feature["targets_text"] = _bytes_feature(pairs[i][1])
          example = tf.train.Example(features=tf.train.Features(feature=feature))
          writer.write(example.SerializeToString())
