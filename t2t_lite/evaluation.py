"""Evaluation during training: dev loss and perplexity, dev BLEU, the best model so far.

Dev loss is the plain negative log-likelihood per target token (no label smoothing, as
tensor2tensor evaluates), so it compares across label_smoothing values and with other
toolkits; dev perplexity is its exponential. Dev BLEU decodes the first dev sentences and
scores them with sacreBLEU (tokenizer by target language).

The model of the best evaluation is kept in `output_dir/best` (with `best.json`: metric,
value, update): best by dev BLEU, or by the early-stopping metric when early stopping is on.
Early stopping (tensor2tensor's eval_early_stopping_*) stops the run once the metric has not
improved by more than `delta` for `steps` updates; its state lives in `best.json`, so a
resumed run counts on.
"""

from __future__ import annotations

import json
import math
import os
import time

import tensorflow as tf
from absl import logging

from t2t_lite import data as data_lib
from t2t_lite import formats
from t2t_lite.decide import Evaluation, Stopping
from t2t_lite.errors import UsageError
from t2t_lite.files import write_atomic
from t2t_lite.formats import BEST_FILE

METRICS = ("dev_loss", "dev_bleu")  # what early stopping may watch
LOWER_IS_BETTER = {"dev_loss": True, "dev_bleu": False}


class Evaluator:
  """Runs the evaluations of one run (on the chief) and writes them to `output_dir/eval`."""

  def __init__(self, learner, hparams, vocab, dev_files, output_dir: str,
               evaluation: Evaluation, stopping: Stopping, target_lang: str = ""):
    self.learner, self.hparams, self.vocab = learner, hparams, vocab
    self.dev_files, self.output_dir = dev_files, output_dir
    self.options, self.stopping = evaluation, stopping
    self.target_lang = target_lang
    self.metric = stopping.early_stopping_metric if stopping.early_stopping_steps else "dev_bleu"
    if evaluation.bleu_sentences > 0:
      from t2t_lite import metrics
      try:  # checked before training, not at the first evaluation
        metrics.bleu_tokenizer(target_lang)
      except UsageError as err:
        raise UsageError(f"dev BLEU during training: {err}; or evaluate without BLEU "
                         "(--eval_bleu_sentences=0)") from None
    self.best = self._read_best()  # {"metric", "value", "update", "improved_at"} or None
    self._writer = None  # opened at the first evaluation: a refused run writes nothing
    self._bleu_inputs = None

  def dev_loss(self) -> float:
    """Negative log-likelihood per non-padding target token over the dev batches."""
    dataset = data_lib.eval_dataset(self.dev_files, self.hparams)
    if self.options.steps > 0:
      dataset = dataset.take(self.options.steps)
    loss = tokens = 0.0
    for batch in dataset:
      batch_loss, batch_tokens = self.learner.eval_fn(batch)
      loss += float(batch_loss)
      tokens += float(batch_tokens)
    return loss / max(tokens, 1.0)

  def dev_bleu(self) -> float:
    from t2t_lite import inference, metrics
    if self._bleu_inputs is None:  # read once; the compiled search is reused too
      pairs = list(data_lib.text_examples(self.dev_files)
                   .take(self.options.bleu_sentences).as_numpy_iterator())
      options = inference.DecodeOptions(beam_size=self.options.beam_size)
      run = inference.RunModel(self.learner.model, self.vocab, self.hparams, None, None, "")
      self._bleu_inputs = ([list(ids) for ids, _ in pairs],
                           [ref.decode("utf-8") for _, ref in pairs], run.translator(options))
    sources, references, translate = self._bleu_inputs
    return metrics.bleu(translate.best(sources), references, self.target_lang).score

  def evaluate(self, update: int) -> dict:
    start = time.time()
    loss = self.dev_loss()
    results = {"dev_loss": loss, "dev_perplexity": math.exp(min(loss, 700.0))}
    if self.options.bleu_sentences > 0:
      results["dev_bleu"] = self.dev_bleu()
    if self._writer is None:
      self._writer = tf.summary.create_file_writer(os.path.join(self.output_dir, "eval"))
    with self._writer.as_default(step=update):
      for name, value in results.items():
        tf.summary.scalar(name, value)
    if self.metric in results:
      self._record(results[self.metric], update)
    logging.info("eval at update %d: %s (%.1fs)", update,
                 ", ".join(f"{k} {v:.4f}" for k, v in results.items()), time.time() - start)
    return results

  def _better(self, value: float, than: float, by: float = 0.0) -> bool:
    return value < than - by if LOWER_IS_BETTER[self.metric] else value > than + by

  def _record(self, value: float, update: int) -> None:
    """The best model so far, and the update of the last improvement by more than delta."""
    best = self.best
    if best is not None and not self._better(value, best["value"]):
      return
    significant = best is None or self._better(value, best["value"],
                                               self.stopping.early_stopping_delta)
    self.best = {"metric": self.metric, "value": value, "update": update,
                 "improved_at": update if significant else best["improved_at"]}
    self._save_best(update)

  def early_stop(self, update: int) -> str | None:
    """Why to stop after this update's evaluation (early stopping), or None."""
    if not self.stopping.early_stopping_steps or self.best is None:
      return None
    since = update - self.best["improved_at"]
    if since < self.stopping.early_stopping_steps:
      return None
    return (f"early stopping: {self.metric} has not improved by more than "
            f"{self.stopping.early_stopping_delta:g} for {since} updates "
            f"(best {self.best['value']:.4f} "
            f"at update {self.best['update']}, kept in {os.path.join(self.output_dir, 'best')})")

  def flush(self) -> None:
    if self._writer is not None:
      self._writer.flush()

  # --- the best model ----------------------------------------------------------------
  def _read_best(self) -> dict | None:
    """The best evaluation of this run so far. One judged by another metric is refused, not
    replaced: saving a new best model would delete the one kept."""
    best_dir = os.path.join(self.output_dir, "best")
    best = formats.best_record(best_dir, _read_json)
    if best is None:
      return None
    if best.get("metric") != self.metric:
      how = ("--eval_early_stopping_steps=K --eval_early_stopping_metric=dev_loss"
             if best.get("metric") == "dev_loss" else
             "--eval_early_stopping_metric=dev_bleu (or no early stopping)")
      raise UsageError(f"{best_dir} holds the best model by {best.get('metric')} and this run "
                       f"judges by {self.metric}, which would replace it; resume with {how}, "
                       f"or move {best_dir} away to keep it")
    return best

  def _save_best(self, update: int) -> None:
    best_dir = os.path.join(self.output_dir, "best")
    os.makedirs(best_dir, exist_ok=True)
    manager = tf.train.CheckpointManager(tf.train.Checkpoint(model=self.learner.model),
                                         best_dir, max_to_keep=1)
    path = manager.save(checkpoint_number=update)
    write_atomic(os.path.join(best_dir, BEST_FILE),
                 json.dumps(dict(self.best, checkpoint=path), indent=2))


def _read_json(path: str) -> dict:
  try:
    with open(path) as f:
      value = json.load(f)
  except (OSError, ValueError) as err:
    raise UsageError(f"{path} is unreadable ({str(err).splitlines()[0][:120]}); restore it, "
                     f"or move {os.path.dirname(path)} away to start a new best model") from None
  if not isinstance(value, dict):
    raise UsageError(f"{path} is not a JSON object; restore it, or move "
                     f"{os.path.dirname(path)} away to start a new best model")
  return value
