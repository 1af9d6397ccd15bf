"""The training stream: batches planned from the examples' lengths, read by index.

The stream of a training split is a pure function of the seed, the examples' lengths and
the batching hparams, so every worker computes the same plan from the lengths alone (a
small array datagen writes) and reads only the examples of its own batches from the
split's store (problems.store). Epoch e of a split:
  1. the examples no longer than max_length, in a seeded random order (seed, split, e): a
     global shuffle, not a window;
  2. sorted (stably) by length: the longer of source and target, then the target's;
  3. cut, in that order, into batches of at most batch_size tokens counting padding (rows x
     the longest row, tensor2tensor's measure), as fairseq's batch_by_size does; with
     `pad_to_bucket_boundary` (--xla_compile: one shape per bucket, but for each bucket's
     last batch of an epoch) into tensor2tensor's length buckets of a fixed row count each,
     padded to the bucket's boundary;
  4. the batches in a seeded random order.
Sorting leaves the same lengths in the same places whatever the shuffle, so every epoch has
the same number of batches K, and batch g of the endless stream is batch g mod K of epoch
g div K. The data position is therefore the number of batches done (the micro-step counter
times the replicas, in the checkpoint) plus, with subword sampling, where the sampled split
began: integers, on any layout and any number of workers.

Why the cut by tokens (Multi30k, transformer_multi30k_cpu, measured in docs/performance.md):
its batches hold as many target tokens as the tf.data buckets on a shuffled stream that
this replaced (3,790 against 3,841 an update), with less padding (5.6% of the slots against
7.0%); the buckets sorted within pad least (5.0%) but leave each bucket's last batch of an
epoch part-empty, which on a small corpus cuts the tokens per update by 14% and changes
what recipes were tuned with.
"""

from __future__ import annotations

import concurrent.futures
import threading
from dataclasses import dataclass

import numpy as np

from t2t_lite.data.eval_input import bucket_batch_sizes, bucket_boundaries
from t2t_lite.core.errors import UsageError
from t2t_lite.data.store import ExampleStore


@dataclass(frozen=True)
class Batching:
  """The hparams that shape the batches (hparams: batch_size, max_length,
  min_length_bucket, length_bucket_step) and whether batches are padded to their bucket."""
  batch_size: int
  max_length: int
  min_length_bucket: int = 8
  length_bucket_step: float = 1.1
  pad_to_bucket_boundary: bool = False

  @classmethod
  def of(cls, hparams, pad_to_bucket_boundary: bool = False) -> "Batching":
    return cls(hparams.batch_size, hparams.max_length, hparams.min_length_bucket,
               hparams.length_bucket_step, pad_to_bucket_boundary)


def cut_by_tokens(longest: np.ndarray, batch_size: int) -> np.ndarray:
  """Where the batches of examples sorted by `longest` (ascending) start, and the end: each
  batch as many rows as fit rows x its longest <= batch_size."""
  starts, start, count = [0], 0, len(longest)
  while start < count:
    low, high = start + 1, min(start + max(batch_size // int(longest[start]), 1), count)
    while low < high:  # the most rows that fit: (rows) x longest[start + rows - 1]
      middle = (low + high + 1) // 2
      if (middle - start) * int(longest[middle - 1]) <= batch_size:
        low = middle
      else:
        high = middle - 1
    start = low
    starts.append(start)
  return np.asarray(starts, np.int64)


def cut_by_buckets(longest: np.ndarray, batching: Batching) -> tuple[np.ndarray, np.ndarray]:
  """(where the batches of examples sorted by `longest` start, and the end; each batch's
  bucket boundary - 1, the length it may be padded to): each bucket's examples in batches
  of its row count, the last of a bucket shorter."""
  boundaries = bucket_boundaries(batching.max_length, batching.min_length_bucket,
                                 batching.length_bucket_step)
  rows = bucket_batch_sizes(boundaries, batching.batch_size)
  bucket = np.searchsorted(boundaries, longest, side="right")
  starts, widths = [0], []
  for index in np.unique(bucket).tolist():
    first, last = (int(i) for i in np.searchsorted(bucket, [index, index + 1]))
    for start in range(first, last, rows[index]):
      starts.append(min(start + rows[index], last))
      widths.append(boundaries[index] - 1)
  return np.asarray(starts, np.int64), np.asarray(widths, np.int32)


class SplitPlan:
  """The batches of one split's epochs (see the module docstring), planned from `lengths`
  [n, 2] (source, target). Holds the kept indices, their sort keys and the order of the two
  epochs asked for last (4 bytes an example each): the training thread and the reader
  thread may ask for both at once, when one micro-step's replicas straddle the end of an
  epoch. Each epoch is planned once while it is held, by the first thread to ask; the others
  wait for it."""

  EPOCHS_HELD = 2

  def __init__(self, lengths: np.ndarray, batching: Batching, seed: int, split_number: int):
    self.batching, self.seed, self.split_number = batching, seed, split_number
    longest = lengths.max(axis=1)
    self.kept = np.flatnonzero(longest <= batching.max_length).astype(np.int32)
    if not len(self.kept):
      raise UsageError(f"no training example is within max_length={batching.max_length} "
                       f"(the shortest is {int(longest.min(initial=0))} ids long); raise "
                       "max_length")
    # One sort key: the longer side, then the target's length (int64 for lengths whose
    # square passes int32).
    key_type = np.int32 if (batching.max_length + 1) ** 2 < 2 ** 31 else np.int64
    self._key = (longest[self.kept].astype(key_type) * (batching.max_length + 1)
                 + lengths[self.kept, 1].astype(key_type))
    sorted_longest = np.sort(self._key) // (batching.max_length + 1)
    if batching.pad_to_bucket_boundary:
      self.starts, self.widths = cut_by_buckets(sorted_longest, batching)
    else:
      self.starts = cut_by_tokens(sorted_longest, batching.batch_size)
      self.widths = np.zeros(self.batches_per_epoch, np.int32)
    # epoch -> Future of (examples in sorted order, batch order); the last asked for, last
    self._epochs: dict[int, concurrent.futures.Future] = {}
    self._lock = threading.Lock()

  @property
  def batches_per_epoch(self) -> int:
    return len(self.starts) - 1

  @property
  def nbytes(self) -> int:
    """The memory the plan holds: its indices and sort keys, and the epochs' orders it
    holds."""
    with self._lock:
      held = [future.result() for future in self._epochs.values()
              if future.done() and not future.exception()]
    arrays = [self.kept, self._key, self.starts, self.widths, *(a for order in held for a in order)]
    return sum(array.nbytes for array in arrays)

  def _plan_epoch(self, epoch: int) -> tuple[np.ndarray, np.ndarray]:
    """(the kept examples of `epoch` in sorted order, the order of its batches)."""
    rng = np.random.default_rng([self.seed, self.split_number, epoch])
    shuffled = rng.permutation(len(self.kept)).astype(np.int32)
    examples = self.kept[shuffled[np.argsort(self._key[shuffled], kind="stable")]]
    return examples, rng.permutation(self.batches_per_epoch).astype(np.int32)

  def _order(self, epoch: int) -> tuple[np.ndarray, np.ndarray]:
    """`_plan_epoch(epoch)`, planned once while it is among the EPOCHS_HELD asked for last."""
    with self._lock:
      future = self._epochs.pop(epoch, None)
      planning = future is None
      if planning:
        future = concurrent.futures.Future()
      self._epochs[epoch] = future  # (moved to the end: the oldest asked for goes first)
      while len(self._epochs) > self.EPOCHS_HELD:
        del self._epochs[next(iter(self._epochs))]
    if planning:  # outside the lock: a thread that asks for the other epoch does not wait
      try:
        future.set_result(self._plan_epoch(epoch))
      except BaseException as err:
        future.set_exception(err)
        with self._lock:  # asked for again, it is planned again
          if self._epochs.get(epoch) is future:
            del self._epochs[epoch]
        raise
    return future.result()

  def batch(self, number: int) -> tuple[np.ndarray, int]:
    """(the example indices of batch `number` of the stream, the length to pad them to; 0:
    each side to its own longest)."""
    epoch, within = divmod(number, self.batches_per_epoch)
    examples, batch_order = self._order(epoch)
    index = int(batch_order[within])
    rows = examples[self.starts[index]:self.starts[index + 1]]
    return rows, int(self.widths[index])


class TrainingStream:
  """The micro-batches of this process's replicas: micro-step m of replica r trains on batch
  m x replicas + r of the stream (+ `shift`, see read_from). With two splits (the one best,
  then the sampled segmentations), batches before `sampled_from` come from the first split
  and the others from the second, counted from there. Reads one micro-step ahead in a
  thread."""

  def __init__(self, stores: list[ExampleStore], batching: Batching, seed: int,
               replicas: int, local_replicas: list[int], split_numbers: list[int] | None = None):
    """`split_numbers`: each store's number in the seed of its plan (default: its place)."""
    self.stores, self.seed = stores, seed
    self.plans = [SplitPlan(store.lengths, batching, seed, number) for store, number in
                  zip(stores, split_numbers or range(len(stores)), strict=True)]
    self.replicas, self.local_replicas = replicas, local_replicas
    # batches between where the micro-step counter points and where the run reads: not 0
    # once a resume re-planned the stream (training.resume.replan_stream)
    self.shift = 0
    self.examples_read = self.batches_read = 0  # this process's, since it started
    self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="t2t-lite-input")
    self._ahead = None  # (keys, future) of the next micro-step's batches

  def read_from(self, shift: int) -> None:
    """Micro-step m of replica r reads batch m x replicas + r + `shift` from here on (a
    re-planned stream; one of a single split)."""
    if shift and len(self.plans) > 1:
      raise ValueError("only a stream of one split is read with a shift")
    self.shift = shift
    self._ahead = None

  def _keys(self, micro_step: int, sampled_from: int) -> tuple[tuple[int, int], ...]:
    """(split, batch of that split) of each local replica's batch at `micro_step`."""
    keys = []
    for replica in self.local_replicas:
      number = micro_step * self.replicas + replica + self.shift
      if len(self.stores) > 1 and 0 <= sampled_from <= number:
        keys.append((1, number - sampled_from))
      else:
        keys.append((0, number))
    return tuple(keys)

  def _read(self, keys) -> list[dict[str, np.ndarray]]:
    batches = []
    for split, number in keys:
      rows, pad_to = self.plans[split].batch(number)
      batches.append(self.stores[split].batch(rows, pad_to))
    return batches

  # The keys of a micro-step as it is taken, and as it is read ahead: here the same pure
  # function of the micro-step; a stream with a position of its own (corpora.MixedStream)
  # advances it as a micro-step is taken.
  def _take(self, micro_step: int, sampled_from: int, update: int):
    return self._keys(micro_step, sampled_from)

  def _peek(self, micro_step: int, sampled_from: int, update: int):
    return self._keys(micro_step, sampled_from)

  def micro_batches(self, micro_step: int, sampled_from: int = -1, update: int = 1) -> list:
    """The local replicas' batches of `micro_step` (numpy int32 arrays), in the order of
    `local_replicas`, of update `update` (1-based; it picks a mixed stream's weights); the
    next micro-step's are read meanwhile (on the same split choice and update: a decision
    taken in between reads them again)."""
    keys = self._take(micro_step, sampled_from, update)
    if self._ahead is not None and self._ahead[0] == keys:
      batches = self._ahead[1].result()
    else:
      batches = self._read(keys)
    following = self._peek(micro_step + 1, sampled_from, update)
    self._ahead = (following, self._pool.submit(self._read, following))
    self.batches_read += len(batches)
    self.examples_read += sum(len(batch["targets"]) for batch in batches)
    return batches

  def skip_to(self, micro_step: int, sampled_from: int, update: int) -> None:
    """The run goes on at `micro_step`, past the micro-batches before it (a recovery's
    skip): here a pure function of the micro-step, so only the batches read ahead go."""
    self._ahead = None

  def close(self) -> None:
    self._pool.shutdown(wait=True, cancel_futures=True)
