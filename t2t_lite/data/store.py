"""The training examples' random-access store: token ids in flat arrays, read by index.

A training split's TFRecord shards are sequential; the trainer plans its batches from the
examples' lengths and each worker reads only the examples of its own batches, so datagen
also writes every training split as four files beside its shards (as fairseq's indexed
datasets do):

  <problem>-<split>.lengths.npy   [n, 2] source and target lengths (ids, EOS included):
                                  the small array every worker plans from, held in memory
  <problem>-<split>.offsets.npy   [n + 1, 2] int64: where example i starts in the id files
  <problem>-<split>.inputs.ids    the source ids of all examples, one after the other
  <problem>-<split>.targets.ids   the target ids, likewise (uint16, or int32 for
                                  vocabularies over 65,535 pieces; little-endian)

The id and offset files are memory-mapped: no process holds the corpus, and a batch reads
only its own rows. Examples are stored in the order of the shards (read in turn).
"""

from __future__ import annotations

import os

import numpy as np

from t2t_lite.core import runtime
from t2t_lite.core.errors import UsageError
from t2t_lite.core.files import atomic_path, writer_tag

SIDES = ("inputs", "targets")
READ_BATCH = 4096  # records parsed at a time when the shards are read
CHUNK = 1 << 20  # lengths copied at a time into the arrays


def file_names(prefix: str) -> list[str]:
  """The store's files of the split whose shards are named `prefix`-..."""
  return [f"{prefix}.lengths.npy", f"{prefix}.offsets.npy",
          *(f"{prefix}.{side}.ids" for side in SIDES)]


def id_dtype(vocab_size: int) -> np.dtype:
  return np.dtype("<u2") if vocab_size <= np.iinfo(np.uint16).max + 1 else np.dtype("<i4")


def _parsed_batches(shard_files: list[str]):
  """(source ids, source lengths, target ids, target lengths) of the shards' records, in
  order, READ_BATCH records at a time, as numpy arrays."""
  tf = runtime.import_tensorflow()
  features = {side: tf.io.RaggedFeature(tf.int64) for side in SIDES}
  dataset = tf.data.TFRecordDataset(shard_files).batch(READ_BATCH).map(
      lambda records: tf.io.parse_example(records, features))
  for parsed in dataset:
    yield tuple(array for side in SIDES
                for array in (parsed[side].flat_values.numpy(),
                              parsed[side].row_lengths().numpy()))


def write(shard_files: list[str], folder: str, prefix: str, vocab_size: int) -> dict:
  """Writes the store of the split in `shard_files` into `folder`; returns its manifest
  entry: files, their bytes, the examples and the id type. Memory holds READ_BATCH records
  at a time, never the split: the lengths go to a scratch file first, then into the two
  arrays, a chunk at a time."""
  dtype = id_dtype(vocab_size)
  names = file_names(prefix)
  paths = [os.path.join(folder, name) for name in names]
  lengths_raw = f"{paths[0]}.raw.tmp-{writer_tag()}"
  try:
    return _write(shard_files, paths, dtype, lengths_raw) | {"files": names}
  finally:
    if os.path.exists(lengths_raw):
      os.remove(lengths_raw)


def _write(shard_files: list[str], paths: list[str], dtype: np.dtype, lengths_raw: str) -> dict:
  examples, written = 0, np.zeros(2, np.int64)
  with atomic_path(paths[2]) as inputs_tmp, atomic_path(paths[3]) as targets_tmp, \
      open(inputs_tmp, "wb") as inputs_out, open(targets_tmp, "wb") as targets_out, \
      open(lengths_raw, "wb") as lengths_out:
    for source, source_lengths, target, target_lengths in _parsed_batches(shard_files):
      inputs_out.write(source.astype(dtype).tobytes())
      targets_out.write(target.astype(dtype).tobytes())
      lengths_out.write(np.stack([source_lengths, target_lengths], 1).astype("<i4").tobytes())
      examples += len(source_lengths)
      written += (len(source), len(target))
    lengths_out.close()
    raw = np.memmap(lengths_raw, "<i4", "r", shape=(examples, 2)) if examples else np.zeros(
        (0, 2), "<i4")
    with atomic_path(paths[0]) as lengths_tmp, atomic_path(paths[1]) as offsets_tmp:
      lengths = np.lib.format.open_memmap(lengths_tmp, "w+", "<i4", (examples, 2))
      offsets = np.lib.format.open_memmap(offsets_tmp, "w+", "<i8", (examples + 1, 2))
      offsets[0] = 0
      for start in range(0, examples, CHUNK):
        chunk = raw[start:start + CHUNK]
        lengths[start:start + len(chunk)] = chunk
        offsets[start + 1:start + 1 + len(chunk)] = offsets[start] + np.cumsum(chunk, axis=0)
      end = offsets[examples].tolist()
      lengths.flush()
      offsets.flush()
      del lengths, offsets, raw
      if end != written.tolist():
        raise ValueError(f"the store's offsets end at {end}, its id files hold "
                         f"{written.tolist()} ids")
  return {"bytes": [os.path.getsize(p) for p in paths], "examples": examples,
          "dtype": dtype.str}


class ExampleStore:
  """One training split's examples, read by index (see the module docstring)."""

  def __init__(self, folder: str, info: dict):
    lengths, offsets, inputs, targets = (os.path.join(folder, n) for n in info["files"])
    self.lengths = np.load(lengths)  # [n, 2]
    self.offsets = np.load(offsets, mmap_mode="r")
    dtype = np.dtype(info["dtype"])
    self.ids = {side: (np.memmap(path, dtype=dtype, mode="r") if os.path.getsize(path)
                       else np.zeros(0, dtype))
                for side, path in zip(SIDES, (inputs, targets))}
    if len(self.lengths) != info["examples"] or len(self.offsets) != len(self.lengths) + 1:
      raise UsageError(f"the store in {folder} holds {len(self.lengths)} examples, its "
                       f"manifest says {info['examples']}: it was changed after datagen; "
                       "run t2t-lite-datagen again")

  def __len__(self) -> int:
    return len(self.lengths)

  def batch(self, indices: np.ndarray, pad_to: int = 0) -> dict[str, np.ndarray]:
    """The examples `indices` as int32 arrays [rows, longest] padded with 0, each side to
    its own longest row (or both to `pad_to`)."""
    out = {}
    for column, side in enumerate(SIDES):
      lengths = self.lengths[indices, column]
      starts = self.offsets[indices, column]
      array = np.zeros((len(indices), pad_to or int(lengths.max(initial=0))), np.int32)
      ids = self.ids[side]
      for row, (start, length) in enumerate(zip(starts.tolist(), lengths.tolist())):
        array[row, :length] = ids[start:start + length]
      out[side] = array
    return out
