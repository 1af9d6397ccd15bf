"""TFRecord shards of encoded sentence pairs: dev and test in input order, train shuffled.

Pairs are encoded and written in chunks of CHUNK_PAIRS, so memory never holds a split.
The training shards get a seeded two-pass external shuffle: pass 1 sends each encoded pair
to a uniformly random bucket file; pass 2 loads one bucket at a time, permutes it and
appends it to its shard (shard i takes buckets i, i + shards, ...). Every bucket is a random
sample of the whole corpus, so nothing of the input order (sub-corpora one after the other,
say) survives into any shard, and memory holds one chunk or one bucket (about BUCKET_PAIRS
pairs), never the corpus. A shuffle within bounded windows of a shard would keep the
corpus order at every scale larger than its window, which is why it is not done that way.
"""

from __future__ import annotations

import math
import os
import struct
from typing import Iterable, Iterator

import numpy as np

from t2t_lite import runtime
from t2t_lite.files import atomic_path

CHUNK_PAIRS = 10_000
BUCKET_PAIRS = 100_000
MAX_BUCKETS = 512  # open files in pass 1; corpora beyond ~50M pairs get larger buckets
_LENGTH = struct.Struct("<I")


class _ExampleBytes:
  """Serializes encoded pairs as tf.train.Example bytes, reusing one message (about 6 us a
  pair, against 50 for a new message each time)."""

  def __init__(self, keep_text: bool):
    tf = runtime.import_tensorflow()
    self._example = tf.train.Example()
    feature = self._example.features.feature
    self._ids = (feature["inputs"].int64_list.value, feature["targets"].int64_list.value)
    self._texts = ((feature["inputs_text"].bytes_list.value,
                    feature["targets_text"].bytes_list.value) if keep_text else ())

  def __call__(self, source_ids, target_ids, source: str, target: str) -> bytes:
    for field, ids in zip(self._ids, (source_ids, target_ids)):
      del field[:]
      field.extend(ids)
    for field, text in zip(self._texts, (source, target)):
      del field[:]
      field.append(text.encode("utf-8"))
    return self._example.SerializeToString(deterministic=True)


def encoded_chunks(vocab, pairs: Iterable[tuple[str, str]],
                   keep_text: bool) -> Iterator[list[bytes]]:
  """Serialized examples of `pairs`, in input order, CHUNK_PAIRS at a time."""
  serialize = _ExampleBytes(keep_text)
  chunk = []
  for pair in pairs:
    chunk.append(pair)
    if len(chunk) == CHUNK_PAIRS:
      yield _encode(vocab, chunk, serialize)
      chunk = []
  if chunk:
    yield _encode(vocab, chunk, serialize)


def _encode(vocab, chunk, serialize) -> list[bytes]:
  sources = vocab.encode_batch([source for source, _ in chunk])
  targets = vocab.encode_batch([target for _, target in chunk])
  return [serialize(source_ids, target_ids, source, target)
          for (source, target), source_ids, target_ids in zip(chunk, sources, targets)]


def write_in_order(vocab, pairs: Iterable[tuple[str, str]], path: str) -> int:
  """Writes `pairs` (with their text, for decoding and BLEU) to one shard in input order;
  returns how many."""
  tf = runtime.import_tensorflow()
  written = 0
  with atomic_path(path) as tmp, tf.io.TFRecordWriter(tmp) as writer:
    for chunk in encoded_chunks(vocab, pairs, keep_text=True):
      for record in chunk:
        writer.write(record)
      written += len(chunk)
  return written


def bucket_count(pairs: int, shards: int) -> int:
  """Buckets for the shuffle: a multiple of `shards`, each of about BUCKET_PAIRS pairs."""
  per_shard = math.ceil(pairs / (shards * BUCKET_PAIRS))
  return shards * max(1, min(per_shard, MAX_BUCKETS // shards))


def write_shuffled(vocab, pairs: Iterable[tuple[str, str]], files: list[str],
                   expected_pairs: int, seed: int) -> int:
  """Writes `pairs` (ids only) to the shards `files` in a seeded random order; returns how
  many. `expected_pairs` (from an earlier pass) sizes the buckets."""
  tf = runtime.import_tensorflow()
  buckets = bucket_count(expected_pairs, len(files))
  bucket_files = [f"{files[b % len(files)]}.bucket-{b:05d}.tmp-{os.getpid()}"
                  for b in range(buckets)]
  rng = np.random.default_rng(seed)
  written = 0
  try:
    outputs = [open(path, "wb") for path in bucket_files]
    try:
      for chunk in encoded_chunks(vocab, pairs, keep_text=False):
        for record, bucket in zip(chunk, rng.integers(buckets, size=len(chunk)).tolist()):
          outputs[bucket].write(_LENGTH.pack(len(record)))
          outputs[bucket].write(record)
        written += len(chunk)
    finally:
      for output in outputs:
        output.close()
    for shard, path in enumerate(files):
      with atomic_path(path) as tmp, tf.io.TFRecordWriter(tmp) as writer:
        for bucket in range(shard, buckets, len(files)):
          records = _read_bucket(bucket_files[bucket])
          for index in rng.permutation(len(records)).tolist():
            writer.write(records[index])
          del records
          os.remove(bucket_files[bucket])
  finally:
    for path in bucket_files:
      if os.path.exists(path):
        os.remove(path)
  return written


def _read_bucket(path: str) -> list[bytes]:
  with open(path, "rb") as f:
    data = f.read()
  records, offset = [], 0
  while offset < len(data):
    (length,) = _LENGTH.unpack_from(data, offset)
    offset += _LENGTH.size
    records.append(data[offset:offset + length])
    offset += length
  return records
