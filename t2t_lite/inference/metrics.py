"""Scores of translations (no TensorFlow needed)."""

from __future__ import annotations

import dataclasses

import sacrebleu

from t2t_lite.core.errors import UsageError


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


@dataclasses.dataclass(frozen=True)
class Bleu:
  """A corpus BLEU: `score`, sacreBLEU's line (`str()`), and the metric's signature."""
  score: float
  line: str
  signature: str

  def __str__(self) -> str:
    return self.line


def bleu(hypotheses: list[str], references: list[str], target_lang: str = "") -> Bleu:
  """sacreBLEU corpus BLEU (cased; tokenizer by target language, 13a by default)."""
  metric = scorer("bleu", target_lang)
  score = metric.corpus_score(hypotheses, [references])
  return Bleu(score.score, str(score), str(metric.get_signature()))


# Target languages whose characters sacreBLEU's TER treats one by one (its asian_support).
ASIAN_TER = ("zh", "ja", "ko")
# The decoded metrics: name -> (what it is, whether lower is better).
DECODED = {"bleu": ("sacreBLEU corpus BLEU", False),
           "chrf": ("chrF (character 6-grams, beta 2)", False),
           "chrfpp": ("chrF++ (chrF with word 1-2-grams)", False),
           "ter": ("TER (translation edit rate, %)", True)}


def _language(target_lang: str) -> str:
  return (target_lang or "").strip().lower().split("-")[0].split("_")[0]


def scorer(name: str, target_lang: str = ""):
  """sacreBLEU's metric object for a DECODED name, with the target language's settings: BLEU's
  tokenizer (see bleu_tokenizer), TER's character handling for zh/ja/ko; chrF and chrF++ work
  on characters and take none."""
  if name == "bleu":
    return sacrebleu.BLEU(tokenize=bleu_tokenizer(target_lang))
  if name == "chrf":
    return sacrebleu.CHRF()
  if name == "chrfpp":
    return sacrebleu.CHRF(word_order=2)
  if name == "ter":
    return sacrebleu.TER(asian_support=_language(target_lang) in ASIAN_TER)
  raise UsageError(f"unknown metric {name!r}; known: {', '.join(DECODED)}")


def corpus_scores(names, hypotheses: list[str], references: list[str],
                  target_lang: str = "") -> dict:
  """{name: (score, signature)} of the DECODED metrics `names` on one set of translations."""
  out = {}
  for name in names:
    metric = scorer(name, target_lang)
    out[name] = (metric.corpus_score(hypotheses, [references]).score,
                 str(metric.get_signature()))
  return out


# --- the dev figures of the evaluations during training (t2t_lite.training.evaluation) ----------
# What the evaluation can measure, and whether lower is better.
LOWER_IS_BETTER = {"dev_loss": True, "dev_perplexity": True, "dev_bleu": False,
                   "dev_chrf": False, "dev_chrfpp": False, "dev_ter": True}
DEV_METRICS = tuple(LOWER_IS_BETTER)
DEV_DECODED = ("dev_bleu", "dev_chrf", "dev_chrfpp", "dev_ter")
DEV_DEFAULT = ("dev_loss", "dev_perplexity", "dev_bleu", "dev_chrf", "dev_ter")


def parse_metrics(spec: str, decoded_sentences: int) -> tuple[str, ...]:
  """The metrics of an `--eval_metrics` list ("" : DEV_DEFAULT, without the decoded ones
  when no sentences are decoded); a usage error for an unknown one or a decoded one without
  sentences to decode."""
  if not spec.strip():
    return tuple(m for m in DEV_DEFAULT if decoded_sentences or m not in DEV_DECODED)
  names = tuple(dict.fromkeys(dev_name(name.strip()) for name in spec.split(",")
                              if name.strip()))
  for name in names:
    if name not in LOWER_IS_BETTER:
      raise UsageError(f"--eval_metrics: unknown metric {name!r}; known: {', '.join(DEV_METRICS)}")
    if name in DEV_DECODED and not decoded_sentences:
      raise UsageError(f"--eval_metrics: {name} decodes dev sentences, and "
                       "--eval_bleu_sentences=0 decodes none; set it above 0 or drop "
                       f"{name}")
  return names


def dev_name(name: str) -> str:
  """A dev metric's name: `dev_bleu` as given, or `bleu` as t2t-lite-bleu --metrics spells it
  (and `loss` as tensor2tensor's eval_early_stopping_metric does)."""
  return f"dev_{name}" if f"dev_{name}" in LOWER_IS_BETTER else name


def judged_by(spec: str, metrics: tuple[str, ...], early_stopping: bool) -> str:
  """The metric that ranks the evaluations (--eval_early_stopping_metric): `spec`, or by
  default dev_loss with early stopping (tensor2tensor's default, "loss"), and without it
  dev_bleu where it is measured, else dev_loss; a usage error if it is not measured."""
  metric = dev_name(spec) if spec else ("dev_bleu" if "dev_bleu" in metrics and
                                        not early_stopping else "dev_loss")
  if metric not in LOWER_IS_BETTER:
    raise UsageError(f"--eval_early_stopping_metric={metric}: choose one of "
                     f"{', '.join(DEV_METRICS)}")
  if metric not in metrics:
    raise UsageError(f"--eval_early_stopping_metric={metric} is not among --eval_metrics="
                     f"{','.join(metrics)}; add it there")
  return metric
