"""Ragged micro-batches and the comparison the accumulation contract is judged by.

What a check of the contract needs: n micro-batches of different shapes and token counts,
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
  return tensors_relative_difference(a.variables, b.variables)


def tensors_relative_difference(xs, ys) -> float:
  """max |x - y| / max |y| over two lists of tensors of the same shapes."""
  scale = max(float(tf.reduce_max(tf.abs(y))) for y in ys)
  return max(float(tf.reduce_max(tf.abs(x - y))) for x, y in zip(xs, ys)) / scale


def apply_ops_by_device(concrete) -> dict:
  """{device: fused Adam kernels} in a traced step (`concrete`: a ConcreteFunction; its cond
  branches included). Under MirroredStrategy every device applies the update to its own copy
  of each variable, so each device appears with one kernel per variable."""
  graph = concrete.graph.as_graph_def()
  counts = {}
  for node in [*graph.node, *(n for f in graph.library.function for n in f.node_def)]:
    if node.op == "ResourceApplyAdam":
      counts[node.device] = counts.get(node.device, 0) + 1
  return counts


def mirrored_against_single(hparams, accumulate_steps: int = 2, updates: int = 3,
                            vocab: int = 60) -> dict:
  """2 mirrored replicas x b x n against 1 replica x 2b x n on ragged batches (dropout off):
  the parameters' relative difference, and the devices of the update's fused Adam kernels
  (one per variable on each device when every device updates its own copy). Needs two
  logical CPU devices (distribute.split_cpu(2) before TensorFlow starts)."""
  from t2t_lite.training.learner import Learner
  micro = ragged_batches(2 * accumulate_steps * updates, vocab, seed=8)
  devices = [d.name for d in tf.config.list_logical_devices("CPU")]
  strategy = tf.distribute.MirroredStrategy(devices)
  two = Learner(hparams, vocab, accumulate_steps, seed=4, strategy=strategy)
  one = Learner(hparams, vocab, accumulate_steps, seed=4)
  for step in range(accumulate_steps * updates):
    pair = micro[2 * step:2 * step + 2]
    two.step(strategy.experimental_distribute_values_from_function(
        lambda context, pair=pair: pair[context.replica_id_in_sync_group]))
    one.step(concat(pair))
  return {"replicas": two.replicas, "updates": int(two.update_step.numpy()),
          "relative_difference": relative_difference(two, one),
          "variables": len(two.variables),
          "apply_ops": apply_ops_by_device(two.update_fn.get_concrete_function())}


def average_on_three_layouts(hparams, updates: int = 3, vocab: int = 60) -> dict:
  """The weights and their moving average (hparams with ema_decay > 0) after one stream of
  ragged micro-batches on 2 mirrored replicas x n=2, 1 replica x n=4 and 1 replica x n=1 on
  the batch of the same 4: their relative differences to the last, how far the average is
  from the weights, and the devices of the mirrored update's fused Adam kernels. Needs two
  logical CPU devices."""
  from t2t_lite.training.learner import Learner
  micro = ragged_batches(4 * updates, vocab, seed=9)
  devices = [d.name for d in tf.config.list_logical_devices("CPU")]
  strategy = tf.distribute.MirroredStrategy(devices)
  two = Learner(hparams, vocab, 2, seed=4, strategy=strategy)
  four = Learner(hparams, vocab, 4, seed=4)
  one = Learner(hparams, vocab, 1, seed=4)
  for update in range(updates):
    group = micro[4 * update:4 * update + 4]
    for step in range(2):  # micro-step m of replica r reads batch 2m + r of the update
      pair = group[2 * step:2 * step + 2]
      two.step(strategy.experimental_distribute_values_from_function(
          lambda context, pair=pair: pair[context.replica_id_in_sync_group]))
    for batch in group:
      four.step(batch)
    one.step(concat(group))
  averages = lambda learner: learner.average.averages  # noqa: E731
  return {"updates": [int(x.update_step.numpy()) for x in (two, four, one)],
          "replicas": two.replicas, "variables": len(two.variables),
          "apply_ops": apply_ops_by_device(two.update_fn.get_concrete_function()),
          "average_two_n2": tensors_relative_difference(averages(two), averages(one)),
          "average_four": tensors_relative_difference(averages(four), averages(one)),
          "weights_two_n2": relative_difference(two, one),
          "weights_four": relative_difference(four, one),
          "average_from_weights": tensors_relative_difference(averages(one), one.variables)}
