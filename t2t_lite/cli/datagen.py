"""t2t-lite-datagen: raw parallel text -> sentencepiece vocabulary + TFRecord shards."""

from __future__ import annotations

from absl import flags

from t2t_lite.cli import common

flags.DEFINE_string("problem", None, "Registered problem, e.g. translate_ende_multi30k.")
flags.DEFINE_string("data_dir", None, "Where the vocabulary, shards and manifest go.")
flags.DEFINE_string("tmp_dir", None, "Where the raw corpus is (or is downloaded to).")
flags.DEFINE_string("source_lang", "", "translate_folder: source file suffix, e.g. en.")
flags.DEFINE_string("target_lang", "", "translate_folder: target file suffix, e.g. de.")
flags.DEFINE_bool("overwrite", False, "Replace data in --data_dir made from other inputs or "
                  "settings (runs that recorded its vocabulary then refuse the new one).")
common.define_count("vocab_size", 0, "Vocabulary size (0: the problem's own; 8000 for "
                    "translate_folder, 32000 for translate_ende_wmt14).")
common.define_count("subword_sampling_copies", 0, "Subword regularization: write this many "
                    "sampled segmentations of every training pair (0: none), as a split of their "
                    "own beside the one best (which dev and test always get); the trainer's "
                    "subword_sampling_start says from which update it reads them.")
flags.DEFINE_float("subword_sampling_alpha", 0.0, "The sampling's alpha (0 < alpha <= 1; 1: the "
                   "vocabulary's own probabilities, lower: more varied segmentations); needs "
                   "--subword_sampling_copies.", lower_bound=0.0)
flags.DEFINE_multi_string("corpus", [], "Several training corpora, sampled by weight in "
                          "training: NAME:WEIGHT:DIR adds the corpus in DIR (its train.<source> "
                          "and train.<target>, plain or .gz); NAME:WEIGHT without DIR names and "
                          "weighs the problem's own training split (else main:1). Repeat the "
                          "flag for each; the trainer's corpus_weights hparam may change the "
                          "weights.")
flags.DEFINE_list("back_translated", [], "Corpora of --corpus (by name, comma-separated) "
                  "whose sources are back-translated: each source begins with the piece "
                  "<BT>, which the vocabulary holds and decoding never writes (tagged "
                  "back-translation).")
FLAGS = flags.FLAGS


def main() -> None:
  from t2t_lite.core import registry
  from t2t_lite.data.problems.base import SAMPLED
  common.require(FLAGS.problem, "problem", "translate_ende_multi30k")
  problem = registry.problem(FLAGS.problem)
  common.require(FLAGS.data_dir, "data_dir", "data/multi30k_ende")
  common.require(FLAGS.tmp_dir, "tmp_dir", "raw/multi30k")
  common.check_writable_dir(FLAGS.data_dir, "data_dir")
  problem.configure(source_lang=FLAGS.source_lang, target_lang=FLAGS.target_lang,
                    vocab_size=FLAGS.vocab_size, sampling_copies=FLAGS.subword_sampling_copies,
                    sampling_alpha=FLAGS.subword_sampling_alpha, corpora=FLAGS.corpus,
                    back_translated=FLAGS.back_translated)
  manifest = problem.generate_data(FLAGS.data_dir, FLAGS.tmp_dir, FLAGS.overwrite)
  if manifest["skipped"]:
    print(f"{problem.name}: data in {FLAGS.data_dir} is up to date with its inputs; "
          "nothing to do")
    return
  if manifest.get("stores_added"):
    print(f"{problem.name}: data in {FLAGS.data_dir} is up to date with its inputs; added the "
          f"store that training reads of {', '.join(manifest['stores_added'])}")
    return
  sampling = manifest["settings"]["subword_sampling"]
  for split, info in manifest["splits"].items():
    dropped = ", ".join(f"{n} {why}" for why, n in info["dropped"].items()) or "none"
    copies = (f", {sampling['copies']} sampled segmentations each (alpha {sampling['alpha']:g})"
              if sampling and split.partition(".")[0] == SAMPLED else "")
    print(f"{problem.name} {split}: {info['read']} pairs read, {info['kept']} kept "
          f"(dropped: {dropped}){copies} -> {len(info['files'])} file(s)")
  if manifest.get("corpora"):
    total = sum(corpus["weight"] for corpus in manifest["corpora"])
    print("training corpora, by weight: " + ", ".join(
        f"{c['name']} {c['weight']:g} ({100 * c['weight'] / total:.1f}% of the batches; "
        f"{manifest['splits'][c['split']]['kept']} pairs"
        f"{', back-translated: sources tagged <BT>' if c.get('back_translated') else ''})"
        for c in manifest["corpora"]))
  print(f"vocabulary: {manifest['vocab']['file']} ({manifest['vocab']['size']} pieces, "
        f"sha256 {manifest['vocab']['sha256'][:12]})")
  print(f"manifest: {problem.manifest_file(FLAGS.data_dir)}")


def run() -> None:
  common.run(main, "t2t-lite-datagen")


if __name__ == "__main__":
  run()
