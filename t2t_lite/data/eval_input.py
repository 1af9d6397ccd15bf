"""The tf.data input of evaluation: length buckets and batches counted in tokens.

`batch_size` is tensor2tensor's: a batch's rows x longest sequence (source or target,
padding included) never exceeds it. Sequences are grouped into geometric length buckets
(min_length_bucket, x length_bucket_step) so that sentences of similar length share a batch
and little is padding. Each batch is padded to its own longest source and target. (Training
batches are planned from the examples' lengths instead: t2t_lite.data.stream.)
"""

from __future__ import annotations

import tensorflow as tf

from t2t_lite.core.hparams_check import check_batch_size

_FEATURES = {
    "inputs": tf.io.VarLenFeature(tf.int64),
    "targets": tf.io.VarLenFeature(tf.int64),
}


def bucket_boundaries(max_length: int, min_length: int = 8, step: float = 1.1) -> list[int]:
  """tensor2tensor's geometric boundaries: 8, 9, 10, ... growing by `step`, up to max_length."""
  boundaries, x = [], min_length
  while x < max_length:
    boundaries.append(x)
    x = max(x + 1, int(x * step))
  return boundaries + [max_length + 1]


def bucket_batch_sizes(boundaries: list[int], batch_size: int) -> list[int]:
  """Rows per batch for each bucket: elements of bucket i are shorter than boundaries[i]."""
  return [max(1, batch_size // (b - 1)) for b in boundaries] + [1]


def parse_example(serialized):
  parsed = tf.io.parse_single_example(serialized, _FEATURES)
  return {name: tf.cast(tf.sparse.to_dense(parsed[name]), tf.int32) for name in _FEATURES}


def _length(example):
  return tf.maximum(tf.shape(example["inputs"])[0], tf.shape(example["targets"])[0])


def examples(files: list[str], max_length: int) -> tf.data.Dataset:
  """Parsed examples of `files`, in file order, without pairs longer than `max_length`."""
  dataset = tf.data.TFRecordDataset(files)
  dataset = dataset.map(parse_example, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
  return dataset.filter(lambda ex: _length(ex) <= max_length)


def batched(dataset: tf.data.Dataset, batch_size: int, max_length: int,
            min_length_bucket: int = 8, length_bucket_step: float = 1.1,
            pad_to_bucket_boundary: bool = False) -> tf.data.Dataset:
  """Token-bucketed batches. `pad_to_bucket_boundary`: every batch of a bucket padded to the
  bucket's longest length (one shape per bucket, as XLA wants; more padding)."""
  check_batch_size(batch_size, max_length)
  boundaries = bucket_boundaries(max_length, min_length_bucket, length_bucket_step)
  return dataset.bucket_by_sequence_length(
      _length, boundaries, bucket_batch_sizes(boundaries, batch_size),
      # TensorShapes, not lists: a list's None is taken for a whole shape, which leaves
      # nothing for pad_to_bucket_boundary to fill.
      padded_shapes={name: tf.TensorShape([None]) for name in ("inputs", "targets")},
      pad_to_bucket_boundary=pad_to_bucket_boundary)


def eval_dataset(files: list[str], hparams, batch_size: int | None = None) -> tf.data.Dataset:
  """One pass over `files` in a deterministic order, token-bucketed."""
  dataset = batched(examples(files, hparams.max_length), batch_size or hparams.batch_size,
                    hparams.max_length, hparams.min_length_bucket, hparams.length_bucket_step)
  return dataset.prefetch(tf.data.AUTOTUNE)


def text_examples(files: list[str]) -> tf.data.Dataset:
  """(inputs ids, reference target text) of a dev/test split, in file order."""
  features = dict(_FEATURES, targets_text=tf.io.FixedLenFeature([], tf.string))

  def parse(serialized):
    parsed = tf.io.parse_single_example(serialized, features)
    return tf.cast(tf.sparse.to_dense(parsed["inputs"]), tf.int32), parsed["targets_text"]

  return tf.data.TFRecordDataset(files).map(parse)
