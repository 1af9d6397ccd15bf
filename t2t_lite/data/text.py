"""Parallel and plain text as datagen and the programs read it: plain or gzip UTF-8 files,
line-aligned pairs streamed (`RawSplit`), and a file's digest (the inputs' fingerprint)."""

from __future__ import annotations

import gzip
import hashlib
import os
from typing import Callable, Iterable, Iterator

from t2t_lite.core.errors import UsageError


class RawSplit:
  """The sentence pairs of one split, streamed: each pass over it reads the raw data again.

  A pass strips both sides and drops (and counts) the pairs with an empty side; `read`,
  `kept` and `dropped` hold the counts of the last complete pass.
  """

  def __init__(self, read_pairs: Callable[[], Iterable[tuple[str, str]]], source: str):
    self._read_pairs = read_pairs
    self.source = source
    self.read = self.kept = 0
    self.dropped = {"empty_or_whitespace": 0}

  def __iter__(self) -> Iterator[tuple[str, str]]:
    read = empty = 0
    for source, target in self._read_pairs():
      read += 1
      source, target = source.strip(), target.strip()
      if source and target:
        yield source, target
      else:
        empty += 1
    self.read, self.kept, self.dropped = read, read - empty, {"empty_or_whitespace": empty}

  def sentences(self) -> Iterator[str]:
    """Source and target of each kept pair, in turn."""
    for pair in self:
      yield from pair


def open_text(path: str):
  return gzip.open(path, "rb") if path.endswith(".gz") else open(path, "rb")


def iter_lines(path: str) -> Iterator[str]:
  """Lines of a plain or gzip UTF-8 file, without line ends; invalid UTF-8 is an error."""
  with open_text(path) as f:
    for number, raw in enumerate(f, start=1):
      try:
        line = raw.decode("utf-8")
      except UnicodeDecodeError as err:
        raise UsageError(f"{path}: line {number} is not valid UTF-8 ({err.reason} at byte "
                         f"{err.start}); fix or re-encode the file as UTF-8") from None
      yield line.rstrip("\r\n")


def read_lines(path: str) -> list[str]:
  """All lines of a plain or gzip UTF-8 file (see iter_lines)."""
  return list(iter_lines(path))


def read_parallel(source_path: str, target_path: str) -> RawSplit:
  """Line-aligned pairs of two files, streamed; a line-count mismatch is an error."""
  for path in (source_path, target_path):
    if not os.path.isfile(path):
      raise UsageError(f"missing data file {os.path.basename(path)}: looked for {path}")

  def mismatch(source_lines: int, target_lines: int) -> UsageError:
    return UsageError(f"line counts differ: {source_path} has {source_lines} lines, "
                      f"{target_path} has {target_lines}; the files must be line-aligned")

  def pairs() -> Iterator[tuple[str, str]]:
    sources, targets = iter_lines(source_path), iter_lines(target_path)
    count = 0
    for source in sources:
      target = next(targets, None)
      if target is None:
        raise mismatch(count + 1 + sum(1 for _ in sources), count)
      count += 1
      yield source, target
    rest = sum(1 for _ in targets)
    if rest:
      raise mismatch(count, count + rest)

  return RawSplit(pairs, source=f"{source_path} + {target_path}")


def file_sha256(path: str) -> str:
  digest = hashlib.sha256()
  with open(path, "rb") as f:
    for block in iter(lambda: f.read(1 << 16), b""):
      digest.update(block)
  return digest.hexdigest()
