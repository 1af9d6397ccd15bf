"""Scores of translations (no TensorFlow needed)."""

from __future__ import annotations

import sacrebleu


def bleu(hypotheses: list[str], references: list[str]):
  """sacreBLEU corpus BLEU (13a tokenization, cased); `.score`, and the metric's signature."""
  metric = sacrebleu.BLEU()
  score = metric.corpus_score(hypotheses, [references])
  score.signature = str(metric.get_signature())
  return score
