"""A data directory as one datagen left it, read once.

The manifest is read once (its bytes give the snapshot's digest) and everything else comes
from what it names: the vocabulary, every split's shards and the training splits' stores,
each checked against the sizes it records when asked for. A datagen writes each version of
the data into a folder of its own and removes the previous folder only after the new
manifest is in place, so a snapshot never mixes two versions: the files of a replaced
version are either still there, whole, or gone (a clear error), never another version's.
"""

from __future__ import annotations

import hashlib
import json
import os

from t2t_lite.core import older_formats
from t2t_lite.core.errors import UsageError
from t2t_lite.data import store as store_lib
from t2t_lite.data import vocab as vocab_lib

TRAINING_SPLITS = ("train", "train_sampled")  # (of the own corpus; "<split>.<name>" of others)


def is_training_split(split: str) -> bool:
  """Whether `split` is a training split: of the problem's own corpus or another's."""
  return split.partition(".")[0] in TRAINING_SPLITS


class DataSnapshot:
  """One read of `data_dir`'s manifest for `problem`, and what it names. With `vocab_only`,
  a folder without a manifest is read as its vocabulary file alone (what decoding and export
  need of a model's data: a deployed model's folder, say)."""

  def __init__(self, problem, data_dir: str, vocab_only: bool = False):
    self.problem, self.data_dir = problem, data_dir
    path = problem.manifest_file(data_dir)
    self._vocab, self.digest = None, None
    if not os.path.isfile(path):
      if vocab_only:
        self.manifest, self.folder = {"dir": "", "splits": {}}, problem.files_dir(data_dir, {})
        return
      raise UsageError(f"no prepared data for problem {problem.name} in {data_dir} "
                       f"({os.path.basename(path)} is missing); run t2t-lite-datagen "
                       f"--problem={problem.name} --data_dir={data_dir} --tmp_dir=<raw data>")
    with open(path, "rb") as f:
      raw = f.read()
    self.digest = hashlib.sha256(raw).hexdigest()
    try:
      self.manifest = older_formats.data_manifest(json.loads(raw))
      self.manifest["splits"].items()
    except (ValueError, TypeError, KeyError, AttributeError):
      raise UsageError(f"{path} is not a t2t-lite-datagen manifest (damaged, or written by "
                       f"something else); run t2t-lite-datagen --problem={problem.name} "
                       f"--data_dir={data_dir} again") from None
    self.folder = problem.files_dir(data_dir, self.manifest)

  @property
  def splits(self) -> dict:
    return self.manifest["splits"]

  @property
  def corpora(self) -> list[dict]:
    """The training corpora (name, weight, split of the one best), the own one first; [] for
    data of one corpus."""
    return self.manifest.get("corpora") or []

  @property
  def settings(self) -> dict:
    return self.manifest.get("settings", {})

  @property
  def vocab_path(self) -> str:
    return self.problem.vocab_file(self.data_dir, self.manifest)

  def vocab(self) -> vocab_lib.SubwordVocab:
    """The vocabulary (loaded once)."""
    if self._vocab is None:
      path, name = self.vocab_path, self.problem.name
      if not os.path.isfile(path):
        raise UsageError(f"vocabulary {path} is missing; run t2t-lite-datagen "
                         f"--problem={name} --data_dir={self.data_dir} first")
      try:
        self._vocab = vocab_lib.SubwordVocab(path)
      except (RuntimeError, OSError) as err:  # sentencepiece: "could not parse ModelProto"
        raise UsageError(f"vocabulary {path} is unreadable ({str(err).splitlines()[0][:120]}); "
                         f"run t2t-lite-datagen --problem={name} again") from None
    return self._vocab

  def vocab_sha256(self) -> str:
    """The sha256 of the vocabulary file's bytes."""
    path = self.vocab_path
    if not os.path.isfile(path):
      raise UsageError(f"vocabulary {path} is missing; run t2t-lite-datagen "
                       f"--problem={self.problem.name} --data_dir={self.data_dir} first")
    with open(path, "rb") as f:
      return vocab_lib.sha256(f.read())

  def files(self, split: str) -> list[str]:
    """The TFRecord shards of `split`, checked against the manifest (names and sizes), and
    its store's files too when it has one."""
    info = self.splits.get(split)
    if info is None:
      raise UsageError(f"problem {self.problem.name} has no '{split}' split in {self.data_dir}")
    files = [os.path.join(self.folder, name) for name in info["files"]]
    self._check_sizes(files, info.get("bytes") or [None] * len(files))
    if "store" in info:
      self._check_sizes([os.path.join(self.folder, name) for name in info["store"]["files"]],
                        info["store"]["bytes"])
    return files

  def store_info(self, split: str) -> dict:
    """The manifest's entry of training split `split`'s store, its files checked; a usage
    error saying what to do for data made before the store."""
    self.files(split)
    info = self.splits[split]
    if "store" not in info:
      raise UsageError(
          f"{self.data_dir} was made by an earlier t2t-lite-datagen, without the store of its "
          f"'{split}' split that training reads by index; run the same t2t-lite-datagen "
          f"command again (--problem={self.problem.name} --data_dir={self.data_dir} "
          "--tmp_dir=<its raw data>): it adds the store beside the records it keeps")
    return info["store"]

  def store(self, split: str) -> store_lib.ExampleStore:
    """Training split `split`'s examples, read by index."""
    return store_lib.ExampleStore(self.folder, self.store_info(split))

  def check(self) -> None:
    """Every split but test present and as datagen wrote it, with the store training reads
    for the training splits (which of them a run reads is milestones.training_splits's to
    say)."""
    for split in self.splits:
      if is_training_split(split):
        self.store_info(split)  # (its shards too)
      elif split != "test":
        self.files(split)

  def _check_sizes(self, files: list[str], sizes: list) -> None:
    name = self.problem.name
    for path, size in zip(files, sizes):
      if not os.path.isfile(path):
        raise UsageError(f"data file {path} listed in the manifest is missing; "
                         f"run t2t-lite-datagen --problem={name} again")
      if size is not None and os.path.getsize(path) != size:
        raise UsageError(f"data file {path} has {os.path.getsize(path)} bytes, the manifest "
                         f"says {size}: it was changed after datagen; run t2t-lite-datagen "
                         f"--problem={name} again")
