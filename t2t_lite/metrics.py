"""Scores of translations (no TensorFlow needed)."""

from __future__ import annotations

import sacrebleu

from t2t_lite.errors import UsageError


def bleu_tokenizer(target_lang: str = "") -> str:
  """sacreBLEU's tokenizer for a target language: zh and ja have their own, the rest 13a.

  Japanese needs MeCab (`pip install "sacrebleu[ja]"`); without it this is a usage error
  rather than a score computed with the wrong tokenizer.
  """
  lang = (target_lang or "").strip().lower().split("-")[0].split("_")[0]
  if lang == "zh":
    return "zh"
  if lang == "ja":
    try:
      import MeCab  # noqa: F401
      import ipadic  # noqa: F401
    except ImportError:
      raise UsageError("BLEU for Japanese targets needs sacreBLEU's ja-mecab tokenizer: "
                       "pip install 'sacrebleu[ja]' (mecab-python3 and ipadic)") from None
    return "ja-mecab"
  return "13a"


def bleu(hypotheses: list[str], references: list[str], target_lang: str = ""):
  """sacreBLEU corpus BLEU (cased; tokenizer by target language, 13a by default); `.score`,
  and the metric's signature as `.signature`."""
  metric = sacrebleu.BLEU(tokenize=bleu_tokenizer(target_lang))
  score = metric.corpus_score(hypotheses, [references])
  score.signature = str(metric.get_signature())
  return score
