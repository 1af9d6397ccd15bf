"""Ragged micro-batches and the comparison the accumulation contract is judged by.

Shared by the tests and `make bench`: n micro-batches of different shapes and token counts,
the one batch that holds the same sentences, and the relative parameter difference
max |a - b| / max |b| between two learners.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf


def ragged_batches(count: int, vocab: int = 60, seed: int = 0) -> list[dict]:
  """Micro-batches with different shapes and different numbers of target tokens."""
  rng = np.random.RandomState(seed)
  batches = []
  for _ in range(count):
    rows, src_len, tgt_len = rng.randint(2, 5), rng.randint(3, 12), rng.randint(3, 12)
    inputs = rng.randint(3, vocab, size=(rows, src_len)).astype(np.int32)
    targets = rng.randint(3, vocab, size=(rows, tgt_len)).astype(np.int32)
    for row in range(rows):
      inputs[row, rng.randint(1, src_len + 1):] = 0
      targets[row, rng.randint(1, tgt_len + 1):] = 0
    inputs[0, :], targets[0, :] = np.maximum(inputs[0], 3), np.maximum(targets[0], 3)
    batches.append({"inputs": tf.constant(inputs), "targets": tf.constant(targets)})
  return batches


def concat(batches: list[dict]) -> dict:
  """One batch holding the same sentences, padded to the longest."""
  out = {}
  for name in ("inputs", "targets"):
    width = max(b[name].shape[1] for b in batches)
    out[name] = tf.concat([tf.pad(b[name], [[0, 0], [0, width - b[name].shape[1]]])
                           for b in batches], axis=0)
  return out


def relative_difference(a, b) -> float:
  """max |a - b| / max |b| over the trainable variables of two learners."""
  scale = max(float(tf.reduce_max(tf.abs(v))) for v in b.variables)
  return max(float(tf.reduce_max(tf.abs(x - y))) for x, y in zip(a.variables, b.variables)) / scale
