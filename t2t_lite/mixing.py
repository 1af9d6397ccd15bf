"""A run's training stream, and on data of several corpora what the run keeps of them: their
position in the checkpoint, their weights by update, and the tokens each gave (t2t_lite.corpora
says how batches are drawn)."""

from __future__ import annotations

import numpy as np
import tensorflow as tf
from absl import logging

from t2t_lite import stream as stream_lib
from t2t_lite.corpora import HPARAM, Curriculum
from t2t_lite.errors import UsageError
from t2t_lite.problems.corpora import split_name

BATCHES, TOKENS = "corpus_batches", "corpus_tokens"  # their names in the checkpoint


def corpus_splits(corpus: dict, kinds: list[str]) -> list[str]:
  """The split names of `corpus` (a manifest entry) for the training split kinds `kinds`
  ("train" and/or "train_sampled"): the problem's own corpus's are the kinds themselves."""
  return [split_name(kind, corpus["name"], corpus["split"] == "train") for kind in kinds]


def open_stream(snapshot, hparams, kinds: list[str], batching, seed: int, replicas: int,
                local_replicas: list[int], strategy) -> tuple:
  """(this process's replicas' batches of the training stream, its CorpusMix or None): the
  training splits `kinds` (run_plan.training_splits) of the data in `snapshot`, of each of
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
  stream = stream_lib.MixedStream(stores, curriculum, batching, seed, replicas, local_replicas)
  return stream, CorpusMix(stream, strategy)


class CorpusMix:
  """The corpora of a run on data of several: the position of its MixedStream in the
  checkpoint (batches read per corpus and segmentation, target tokens per corpus), and
  their lines in the log and TensorBoard."""

  def __init__(self, stream: stream_lib.MixedStream, strategy):
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
    return learner.update_in_progress(self.curriculum.differ)

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
