"""A run's training stream opened, and on data of several corpora the stream that mixes them
(`MixedStream`: each batch's corpus drawn as data.curriculum says) and what the run keeps of
them (`CorpusMix`): their position in the checkpoint, their weights by update, and the
tokens each gave."""

from __future__ import annotations

import numpy as np
import tensorflow as tf
from absl import logging

from t2t_lite.data import stream as stream_lib
from t2t_lite.data.curriculum import HPARAM, Curriculum, batch_corpora
from t2t_lite.core.errors import UsageError
from t2t_lite.data.corpora import split_name

BATCHES, TOKENS = "corpus_batches", "corpus_tokens"  # their names in the checkpoint


def corpus_splits(corpus: dict, kinds: list[str]) -> list[str]:
  """The split names of `corpus` (a manifest entry) for the training split kinds `kinds`
  ("train" and/or "train_sampled"): the problem's own corpus's are the kinds themselves."""
  return [split_name(kind, corpus["name"], corpus["split"] == "train") for kind in kinds]


def open_stream(snapshot, hparams, kinds: list[str], batching, seed: int, replicas: int,
                local_replicas: list[int], strategy) -> tuple:
  """(this process's replicas' batches of the training stream, its CorpusMix or None): the
  training splits `kinds` (milestones.training_splits) of the data in `snapshot`, of each of
  its corpora where it has several."""
  if not snapshot.corpora:
    if hparams.corpus_weights.strip():
      raise UsageError(f"{HPARAM}={hparams.corpus_weights!r}: {snapshot.data_dir} holds one "
                       "training corpus; make data of several with t2t-lite-datagen --corpus, "
                       f"or drop {HPARAM}")
    stores = [snapshot.store(split) for split in kinds]
    return stream_lib.TrainingStream(stores, batching, seed, replicas, local_replicas), None
  curriculum = Curriculum.of(hparams.corpus_weights, snapshot.corpora)
  stores = [[snapshot.store(split) for split in corpus_splits(corpus, kinds)]
            for corpus in snapshot.corpora]
  stream = MixedStream(stores, curriculum, batching, seed, replicas, local_replicas)
  return stream, CorpusMix(stream, strategy)


class MixedStream(stream_lib.TrainingStream):
  """The training stream over several corpora (data.curriculum): `corpora` holds,
  for each corpus, its stores in the order of TrainingStream's (one segmentation, or the one
  best then the sampled ones from `sampled_from`)."""

  def __init__(self, corpora, curriculum: Curriculum, batching, seed: int, replicas: int,
               local_replicas: list[int]):
    stores, self._slots, numbers = [], [], []
    for index, corpus_stores in enumerate(corpora):
      self._slots.append(list(range(len(stores), len(stores) + len(corpus_stores))))
      numbers += [2 * index + slot for slot in range(len(corpus_stores))]
      stores += corpus_stores
    super().__init__(stores, batching, seed, replicas, local_replicas, numbers)
    self.curriculum = curriculum
    self.taken = np.zeros((len(corpora), 2), np.int64)  # batches read, by segmentation
    self.tokens = np.zeros(len(corpora), np.int64)  # target tokens read
    self.at = 0  # the micro-step the counts stand at
    self._peeked = None  # ((micro-step, sampled_from, update), its _plan) read ahead

  def resume(self, micro_step: int, taken: np.ndarray, tokens: np.ndarray) -> None:
    """The position recorded in a checkpoint at `micro_step` (of this run's layout)."""
    taken, tokens = np.asarray(taken, np.int64), np.asarray(tokens, np.int64)
    if int(taken.sum()) != micro_step * self.replicas:
      raise UsageError(f"the checkpoint's corpus positions count {int(taken.sum())} batches, "
                       f"its micro-step counter {micro_step * self.replicas}: it was not "
                       "written by this run; resume from another checkpoint")
    self.taken, self.tokens, self.at = taken.copy(), tokens.copy(), micro_step
    self._ahead = self._peeked = None

  def _plan(self, micro_step: int, sampled_from: int, update: int, taken, tokens):
    """The keys of every replica's batch at `micro_step` from position (`taken`, `tokens`)
    at its start, and the position after it."""
    numbers = micro_step * self.replicas + np.arange(self.replicas)
    chosen = batch_corpora(self.seed, numbers, self.curriculum.weights_at(update))
    taken, tokens, keys = taken.copy(), tokens.copy(), []
    for number, corpus in zip(numbers.tolist(), chosen.tolist()):
      slots = self._slots[corpus]
      slot = 1 if len(slots) == 2 and 0 <= sampled_from <= number else 0
      key = (slots[slot], int(taken[corpus, slot]))
      taken[corpus, slot] += 1
      rows, _ = self.plans[key[0]].batch(key[1])
      tokens[corpus] += int(self.stores[key[0]].lengths[rows, 1].sum())
      keys.append(key)
    return tuple(keys[r] for r in self.local_replicas), taken, tokens

  def _take(self, micro_step: int, sampled_from: int, update: int):
    if micro_step != self.at:
      raise RuntimeError(f"the mixed stream stands at micro-step {self.at}, not {micro_step}")
    peeked = self._peeked  # (planned when it was read ahead, from this position)
    if peeked is not None and peeked[0] == (micro_step, sampled_from, update):
      keys, *self._after = peeked[1]
    else:
      keys, *self._after = self._plan(micro_step, sampled_from, update, self.taken,
                                      self.tokens)
    return keys

  def _peek(self, micro_step: int, sampled_from: int, update: int):
    planned = self._plan(micro_step, sampled_from, update, *self._after)
    self._peeked = ((micro_step, sampled_from, update), planned)
    return planned[0]

  def skip_to(self, micro_step: int, sampled_from: int, update: int) -> None:
    """The position moves past the micro-steps before `micro_step` as if they were read
    (each drawn by the weights of update `update`), without reading them."""
    taken, tokens = self.taken, self.tokens
    for skipped in range(self.at, micro_step):
      _, taken, tokens = self._plan(skipped, sampled_from, update, taken, tokens)
    self.taken, self.tokens, self.at = taken, tokens, micro_step
    self._ahead = self._peeked = None

  def micro_batches(self, micro_step: int, sampled_from: int = -1, update: int = 1) -> list:
    """As TrainingStream's; the position moves past `micro_step` once its batches are read."""
    batches = super().micro_batches(micro_step, sampled_from, update)
    self.taken, self.tokens = self._after
    self.at += 1
    return batches


class CorpusMix:
  """The corpora of a run on data of several: the position of its MixedStream in the
  checkpoint (batches read per corpus and segmentation, target tokens per corpus), and
  their lines in the log and TensorBoard."""

  def __init__(self, stream: MixedStream, strategy):
    self.stream, self.curriculum = stream, stream.curriculum
    count = len(self.curriculum.names)
    with strategy.scope():
      self.batches = tf.Variable(np.zeros((count, 2), np.int64), name=BATCHES, trainable=False,
                                 aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)
      self.tokens = tf.Variable(np.zeros(count, np.int64), name=TOKENS, trainable=False,
                                aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)
    self._logged = np.zeros(count, np.int64)  # the tokens at the last log line

  def trackables(self) -> dict:
    return {BATCHES: self.batches, TOKENS: self.tokens}

  def update(self, learner) -> int:
    """The update in progress, whose weights the next batches are drawn with."""
    if len(self.curriculum.phases) == 1:
      return 1  # (one set of weights: the update does not matter)
    return learner.host.update_in_progress(self.curriculum.differ)

  def before_save(self, micro_step: int) -> None:
    """The stream's position into the checkpoint's variables; it must stand at
    `micro_step`, the learner's."""
    if self.stream.at != micro_step:
      raise RuntimeError(f"the corpus positions stand at micro-step {self.stream.at}, the "
                         f"run at {micro_step}")
    self.batches.assign(self.stream.taken)
    self.tokens.assign(self.stream.tokens)

  def resume(self, micro_step: int) -> None:
    """The stream continues from the position restored (zeros for a new run)."""
    self.stream.resume(micro_step, self.batches.numpy(), self.tokens.numpy())
    self._logged = self.stream.tokens.copy()

  def start_lines(self) -> list[str]:
    return self.curriculum.lines()

  def log(self, update: int, writer) -> None:
    """Target tokens read per corpus: since the last line and over the run; a scalar each in
    TensorBoard (corpus/<name>/tokens, and the share of the tokens since the last line)."""
    tokens = self.stream.tokens
    recent = tokens - self._logged
    self._logged = tokens.copy()
    shares = recent / max(int(recent.sum()), 1)
    logging.info("update %d: target tokens per corpus since the last line: %s; over the run: "
                 "%s", update,
                 ", ".join(f"{name} {100 * share:.1f}%" for name, share
                           in zip(self.curriculum.names, shares.tolist())),
                 ", ".join(f"{name} {count:,}" for name, count
                           in zip(self.curriculum.names, tokens.tolist())))
    with writer.as_default(step=update):
      for name, count, share in zip(self.curriculum.names, tokens.tolist(), shares.tolist()):
        tf.summary.scalar(f"corpus/{name}/tokens", count)
        tf.summary.scalar(f"corpus/{name}/share", share)
