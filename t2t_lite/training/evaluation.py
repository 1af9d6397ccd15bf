"""Evaluation during training: the dev figures, the best checkpoints, early stopping.

The figures (`--eval_metrics`, any of metrics.DEV_METRICS):
- `dev_loss`, the plain negative log-likelihood per target token (no label smoothing, as
  tensor2tensor evaluates), so it compares across label_smoothing values and with other
  toolkits; `dev_perplexity`, its exponential;
- the decoded ones, from one decode of the first `--eval_bleu_sentences` dev sentences,
  scored by sacreBLEU (see t2t_lite.inference.metrics): `dev_bleu` (tokenizer by target language),
  `dev_chrf`, `dev_chrfpp` (chrF++) and `dev_ter`.
Each is a TensorBoard scalar (eval/) and in the eval log line.

With a moving average of the weights (ema_decay > 0) the evaluation reads the average (see
WeightAverage.swap_with) unless --eval_weights=raw. The K best evaluations by the metric the
run judges by are kept in `output_dir/best` with early stopping's state (t2t_lite.training.best).
"""

from __future__ import annotations

import contextlib
import math
import os
import time

import tensorflow as tf
from absl import logging

from t2t_lite.data import eval_input as data_lib
from t2t_lite.runs import ema as ema_lib
from t2t_lite.training.best import BestCheckpoints
from t2t_lite.training.options import Evaluation, Stopping
from t2t_lite.core.errors import UsageError

from t2t_lite.inference.metrics import DEV_DECODED as DECODED
from t2t_lite.inference.metrics import LOWER_IS_BETTER, judged_by


class Evaluator:
  """Runs the evaluations of one run (on the chief) and writes them to `output_dir/eval`."""

  def __init__(self, learner, hparams, vocab, dev_files, output_dir: str,
               evaluation: Evaluation, stopping: Stopping, target_lang: str = ""):
    self.learner, self.hparams, self.vocab = learner, hparams, vocab
    self.dev_files, self.output_dir = dev_files, output_dir
    self.options, self.stopping = evaluation, stopping
    self.target_lang = target_lang
    # (without decoded sentences the decoded metrics are not measured; the CLI refuses them)
    self.metrics = tuple(m for m in evaluation.metrics
                         if evaluation.bleu_sentences or m not in DECODED)
    self.metric = judged_by(stopping.early_stopping_metric, self.metrics,
                            stopping.early_stopping_steps > 0)
    self.decoded = [name[len("dev_"):] for name in self.metrics if name in DECODED]
    from t2t_lite.inference import metrics
    for name in self.decoded:  # checked before training, not at the first evaluation
      try:
        metrics.scorer(name, target_lang)
      except UsageError as err:
        raise UsageError(f"dev_{name} during training: {err}; or evaluate without it "
                         f"(--eval_metrics without dev_{name})") from None
    self.weights = _evaluated_weights(learner, evaluation.weights)
    self.best = BestCheckpoints(os.path.join(output_dir, "best"), self.metric,
                                LOWER_IS_BETTER[self.metric], evaluation.keep_best,
                                stopping.early_stopping_delta, self.weights)
    self._writer = None  # opened at the first evaluation: a refused run writes nothing
    self._decode_inputs = None

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

  def decoded_scores(self) -> dict:
    """{dev_<metric>: score} of the decoded metrics, from one decode of the dev sentences."""
    from t2t_lite.inference import translator, metrics
    if self._decode_inputs is None:  # read once; the compiled search is reused too
      pairs = list(data_lib.text_examples(self.dev_files)
                   .take(self.options.bleu_sentences).as_numpy_iterator())
      options = translator.DecodeOptions(beam_size=self.options.beam_size)
      run = translator.RunModel(self.learner.model, self.vocab, self.hparams, None, None, "")
      self._decode_inputs = ([list(ids) for ids, _ in pairs],
                             [ref.decode("utf-8") for _, ref in pairs], run.translator(options))
    sources, references, translate = self._decode_inputs
    scores = metrics.corpus_scores(self.decoded, translate.best(sources), references,
                                   self.target_lang)
    return {f"dev_{name}": score for name, (score, _) in scores.items()}

  @contextlib.contextmanager
  def _evaluated(self):
    """The model holds the weights evaluated: the moving average, swapped in and back."""
    average = self.learner.average
    swap = self.weights == ema_lib.EMA and average.holds_updates()
    if swap:
      average.swap_with(self.learner.variables)
    try:
      yield
    finally:
      if swap:
        average.swap_with(self.learner.variables)

  def evaluate(self, update: int) -> dict:
    start = time.time()
    with self._evaluated():
      loss = self.dev_loss()
      figures = {"dev_loss": loss, "dev_perplexity": math.exp(min(loss, 700.0))}
      if self.decoded:
        figures.update(self.decoded_scores())
      figures = {name: figures[name] for name in self.metrics}
      self.best.record(update, figures, self.learner.model)
    if self._writer is None:
      self._writer = tf.summary.create_file_writer(os.path.join(self.output_dir, "eval"))
    with self._writer.as_default(step=update):
      for name, value in figures.items():
        tf.summary.scalar(name, value)
    logging.info("eval at update %d%s: %s (%.1fs)", update,
                 " (moving average)" if self.weights == ema_lib.EMA else "",
                 ", ".join(f"{k} {v:.4f}" for k, v in figures.items()), time.time() - start)
    return figures

  def owed(self, update: int) -> bool:
    """Whether `update`, an evaluation's update that the run resumed at, was saved but not
    evaluated (the process stopped in between; before the first evaluation, best.json
    does not exist yet)."""
    if self.best.state is None:
      return True
    last = self.best.evaluated_at()
    return last is not None and last < update

  def early_stop(self, update: int) -> str | None:
    """Why to stop after this update's evaluation (early stopping), or None."""
    return self.best.stop_reason(update, self.stopping.early_stopping_steps)

  def flush(self) -> None:
    if self._writer is not None:
      self._writer.flush()


class ChiefEvaluations:
  """The evaluations as every worker of a run takes part in them: the chief evaluates (its
  Evaluator; None on the others and when the run does not evaluate) while the others wait
  for its verdict, shared by `from_chief(values)` (the chief's values on every worker)."""

  def __init__(self, evaluator: Evaluator | None, frequency: int, from_chief, faults):
    self.evaluator, self.frequency = evaluator, frequency
    self.from_chief, self.faults = from_chief, faults

  def stopped_early(self, update: int) -> bool:
    """Whether early stopping had stopped the run at `update` (a resumed run stays stopped);
    no collective: the caller shares it."""
    return self.evaluator is not None and self.evaluator.early_stop(update) is not None

  def evaluate(self, update: int) -> bool:
    """Evaluates `update` (saved already); whether early stopping says to stop."""
    early = False
    if self.evaluator is not None:
      self.faults.evaluating()
      self.evaluator.evaluate(update)
      early = self.evaluator.early_stop(update) is not None
    return self.from_chief([float(early)])[0] > 0

  def owed(self, update: int) -> bool:
    """Whether the run resumed at an evaluation's update that was saved but not evaluated
    (the process stopped in between): the chief's answer, on every worker."""
    if not (self.frequency and update and update % self.frequency == 0):
      return False
    owed = self.evaluator is not None and self.evaluator.owed(update)
    if owed:
      logging.info("update %d was saved but not evaluated before the run stopped: evaluating "
                   "it now", update)
    return self.from_chief([float(owed)])[0] > 0

  def stop_reason(self, update: int) -> str:
    return (self.evaluator.early_stop(update) if self.evaluator is not None
            else "early stopping, by the chief's evaluation")

  def flush(self) -> None:
    if self.evaluator is not None:
      self.evaluator.flush()


def _evaluated_weights(learner, choice: str) -> str:
  """ema or raw: which weights the evaluations read (--eval_weights)."""
  if choice == ema_lib.RAW or getattr(learner, "average", None) is None:
    if choice == ema_lib.EMA:
      raise UsageError("--eval_weights=ema: this run keeps no moving average of the weights; "
                       "set --hparams=ema_decay=... or use --eval_weights=raw")
    return ema_lib.RAW
  return ema_lib.EMA
