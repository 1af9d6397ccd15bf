"""t2t-lite-bleu: sacreBLEU corpus BLEU (detokenized, cased) with its signature.

The tokenizer follows --target_lang: zh and ja (MeCab) have sacreBLEU's own, others 13a.
"""

from __future__ import annotations

import os

from absl import flags

from t2t_lite.cli import common
from t2t_lite.errors import UsageError

flags.DEFINE_string("translation", None, "Detokenized system output, one line per sentence.")
flags.DEFINE_string("reference", None, "Reference translations (.gz allowed).")
flags.DEFINE_string("target_lang", "", "Language of the translations: zh -> sacreBLEU's zh "
                    "tokenizer, ja -> ja-mecab, anything else (or empty) -> 13a.")
FLAGS = flags.FLAGS


def main() -> None:
  from t2t_lite.metrics import bleu, bleu_tokenizer
  from t2t_lite.problems.base import read_lines
  common.require(FLAGS.translation, "translation", "test.de.out")
  common.require(FLAGS.reference, "reference", "test.de")
  bleu_tokenizer(FLAGS.target_lang)  # a missing tokenizer is reported before any reading
  for flag in ("translation", "reference"):
    if not os.path.isfile(FLAGS[flag].value):
      raise UsageError(f"--{flag}={FLAGS[flag].value} does not exist")
  hypotheses, references = read_lines(FLAGS.translation), read_lines(FLAGS.reference)
  if len(hypotheses) != len(references):
    raise UsageError(f"line counts differ: {FLAGS.translation} has {len(hypotheses)} lines, "
                     f"{FLAGS.reference} has {len(references)}")
  score = bleu(hypotheses, references, FLAGS.target_lang)
  print(f"{score}\n{score.signature}")


def run() -> None:
  common.run(main, "t2t-lite-bleu")


if __name__ == "__main__":
  run()
