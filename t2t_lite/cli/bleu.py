"""t2t-lite-bleu: sacreBLEU corpus BLEU (detokenized, cased) with its signature; with
--metrics also chrF, chrF++ and TER, each as sacreBLEU computes it, two lines each (the
score, the signature).

The tokenizer follows --target_lang: BLEU's zh and ja (MeCab) have sacreBLEU's own, others
13a; TER treats zh, ja and ko characters one by one (sacreBLEU's asian_support).
"""

from __future__ import annotations

import os

from absl import flags

from t2t_lite.cli import common
from t2t_lite.core.errors import UsageError

flags.DEFINE_string("translation", None, "Detokenized system output, one line per sentence.")
flags.DEFINE_string("reference", None, "Reference translations (.gz allowed).")
flags.DEFINE_string("target_lang", "", "Language of the translations: zh -> sacreBLEU's zh "
                    "tokenizer, ja -> ja-mecab, anything else (or empty) -> 13a.")
flags.DEFINE_list("metrics", ["bleu"], "Comma-separated: bleu, chrf, chrfpp (chrF++), ter.")
FLAGS = flags.FLAGS


def main() -> None:
  from t2t_lite.inference.metrics import DECODED, corpus_scores, scorer
  from t2t_lite.data.text import read_lines
  common.require(FLAGS.translation, "translation", "test.de.out")
  common.require(FLAGS.reference, "reference", "test.de")
  names = list(dict.fromkeys(FLAGS.metrics))
  for name in names:
    if name not in DECODED:
      raise UsageError(f"--metrics: unknown metric {name!r}; known: {', '.join(DECODED)}")
    scorer(name, FLAGS.target_lang)  # a missing tokenizer is reported before any reading
  if not names:
    raise UsageError("--metrics is empty; give e.g. --metrics=bleu,chrf,ter")
  for flag in ("translation", "reference"):
    if not os.path.isfile(FLAGS[flag].value):
      raise UsageError(f"--{flag}={FLAGS[flag].value} does not exist")
  hypotheses, references = read_lines(FLAGS.translation), read_lines(FLAGS.reference)
  if len(hypotheses) != len(references):
    raise UsageError(f"line counts differ: {FLAGS.translation} has {len(hypotheses)} lines, "
                     f"{FLAGS.reference} has {len(references)}")
  if names == ["bleu"]:  # sacreBLEU's own line, with its counts and brevity penalty
    from t2t_lite.inference.metrics import bleu
    score = bleu(hypotheses, references, FLAGS.target_lang)
    print(f"{score}\n{score.signature}")
    return
  for name, (score, signature) in corpus_scores(names, hypotheses, references,
                                                FLAGS.target_lang).items():
    print(f"{name} = {score:.2f}\n{signature}")


def run() -> None:
  common.run(main, "t2t-lite-bleu")


if __name__ == "__main__":
  run()
