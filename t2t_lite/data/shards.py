"""TFRecord shards of encoded sentence pairs: dev and test in input order, train shuffled.

Pairs are encoded and written in chunks of CHUNK_PAIRS, so memory never holds a split.
The training shards get a seeded two-pass external shuffle: pass 1 sends each encoded pair
to a uniformly random bucket file; pass 2 loads one bucket at a time, permutes it and
appends it to its shard (shard i takes buckets i, i + shards, ...). Every bucket is a random
sample of the whole corpus, so nothing of the input order (sub-corpora one after the other,
say) survives into any shard, and memory holds one chunk or one bucket (about BUCKET_PAIRS
pairs), never the corpus. A shuffle within bounded windows of a shard would keep the
corpus order at every scale larger than its window, which is why it is not done that way.
With subword sampling, pass 1 reads the split once per copy, each time encoding every pair
with a freshly sampled segmentation, so all copies are shuffled together.
"""

from __future__ import annotations

import math
import os
import struct
from typing import Iterable, Iterator

import numpy as np

from t2t_lite.core import runtime
from t2t_lite.core.files import atomic_path, writer_tag

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


def encoded_chunks(vocab, pairs: Iterable[tuple[str, str]], keep_text: bool,
                   sampling: tuple[float, int] | None = None,
                   source_prefix: tuple[int, ...] = ()) -> Iterator[list[bytes]]:
  """Serialized examples of `pairs`, in input order, CHUNK_PAIRS at a time. `sampling` =
  (alpha, seed): segmentations drawn with vocab.sample_batch (seeded by seed and the chunk),
  else the vocabulary's one best. `source_prefix`: ids every source begins with (the
  back-translation tag)."""
  serialize = _ExampleBytes(keep_text)
  chunk, index = [], 0
  for pair in pairs:
    chunk.append(pair)
    if len(chunk) == CHUNK_PAIRS:
      yield _encode(vocab, chunk, serialize, sampling, index, source_prefix)
      chunk, index = [], index + 1
  if chunk:
    yield _encode(vocab, chunk, serialize, sampling, index, source_prefix)


def _encode(vocab, chunk, serialize, sampling, index: int, prefix=()) -> list[bytes]:
  texts = ([source for source, _ in chunk], [target for _, target in chunk])
  if sampling is None:
    sources, targets = (vocab.encode_batch(side) for side in texts)
  else:
    alpha, seed = sampling
    sources, targets = (vocab.sample_batch(side, alpha, _seed(seed, index, n))
                        for n, side in enumerate(texts))
  prefix = list(prefix)
  return [serialize(prefix + source_ids, target_ids, source, target)
          for (source, target), source_ids, target_ids in zip(chunk, sources, targets)]


def _seed(*numbers: int) -> int:
  """A 32-bit seed that depends on all of `numbers`."""
  return int(np.random.SeedSequence(list(numbers)).generate_state(1)[0])


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
                   expected_pairs: int, seed: int, copies: int = 1,
                   sampling_alpha: float = 0.0, source_prefix: tuple[int, ...] = ()) -> int:
  """Writes `pairs` (ids only) to the shards `files` in a seeded random order; returns how
  many records. `expected_pairs` (from an earlier pass) sizes the buckets.

  `sampling_alpha` > 0: `copies` passes over `pairs`, each pair encoded once per pass with
  a segmentation sampled at that alpha (vocab.sample_batch), all shuffled together; so the
  shards hold copies x pairs records, every pair's copies in random places.
  """
  if copies > 1 and not sampling_alpha:
    raise ValueError("copies of one segmentation add nothing: sample them (sampling_alpha)")
  tf = runtime.import_tensorflow()
  buckets = bucket_count(expected_pairs * copies, len(files))
  bucket_files = [f"{files[b % len(files)]}.bucket-{b:05d}.tmp-{writer_tag()}"
                  for b in range(buckets)]
  rng = np.random.default_rng(seed)
  written = 0
  try:
    outputs = [open(path, "wb") for path in bucket_files]
    try:
      for copy in range(copies):
        sampling = (sampling_alpha, _seed(seed, copy)) if sampling_alpha else None
        for chunk in encoded_chunks(vocab, pairs, keep_text=False, sampling=sampling,
                                    source_prefix=source_prefix):
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
