"""t2t-lite-decoder: translates a file, one output line per input line, in order; or stdin
line by line (--decode_interactive); or scores given translations (--score_file).

With return_beams=true each output line holds the beam_size hypotheses and their scores,
tab-separated and best first: `hyp1<TAB>score1<TAB>hyp2<TAB>score2...`.
"""

from __future__ import annotations

import dataclasses
import os
import sys

from absl import flags

from t2t_lite.inference import translator
from t2t_lite.cli import common
from t2t_lite.core.errors import UsageError
from t2t_lite.core.files import write_atomic

flags.DEFINE_string("problem", None, "Registered problem (default: the run's).")
flags.DEFINE_string("hparams_set", None, "Hparams set (default: the run's hparams.json).")
flags.DEFINE_string("hparams", "", "Overrides for --hparams_set.")
flags.DEFINE_string("data_dir", None, "Datagen directory with the vocabulary (default: the run's).")
flags.DEFINE_string("output_dir", None, "The training (or averaged) run directory.")
flags.DEFINE_string("checkpoint_path", None, "A checkpoint (default: the newest in output_dir).")
flags.DEFINE_string("decode_hparams", "", "beam_size (4), alpha (0.6), extra_decode_length (50) "
                    "(with --engine=ctranslate2, the export's unless given here); batch_size "
                    "(sentences per batch, 0: no limit) and batch_tokens (source tokens per "
                    "batch, padding included, 0: no limit; with neither given, "
                    f"{translator.DEFAULT_BATCH_TOKENS}); return_beams (write the beam_size "
                    "best with their scores, tab-separated); sampling_method=random (draw each "
                    "token from the model's distribution instead of searching) with "
                    "sampling_temp (1.0; 0: argmax), sampling_keep_top_k (-1: every token), "
                    "sampling_keep_top_p (nucleus; 1.0: every token), sampling_seed (1) and "
                    "samples_per_input (1; more with return_beams=true).")
flags.DEFINE_string("decode_from_file", None, "Source text, one sentence a line (.gz allowed).")
flags.DEFINE_string("decode_to_file", None, "Where the translations (or the --score_file "
                    "scores) go.")
flags.DEFINE_bool("decode_interactive", False, "Translate standard input line by line, each "
                  "translation printed (and flushed) as soon as it is decoded; works in a pipe.")
flags.DEFINE_string("score_file", None, "Forced decoding: a file of `source<TAB>target` lines; "
                    "writes log p(target | source) of each line (summed over the target's "
                    "tokens and EOS, no length penalty) to --decode_to_file.")
flags.DEFINE_enum("engine", "tensorflow", ["tensorflow", "ctranslate2"],
                  "Who decodes: t2t-lite's own search over a checkpoint (tensorflow), or a "
                  "t2t-lite-exporter --format=ctranslate2 export (ctranslate2, --export_dir).")
common.define_weights("decoded")
flags.DEFINE_string("export_dir", None, "The CTranslate2 export, with --engine=ctranslate2.")
flags.DEFINE_list("ensemble", [], "More models decoded together with --output_dir's (or "
                  "--checkpoint_path's), comma-separated: run directories (their newest "
                  "checkpoint) or checkpoint prefixes, all on the same vocabulary; each step "
                  "takes the mean of their log-probabilities.")
FLAGS = flags.FLAGS


def ctranslate2_engine(options, given_keys: set[str]):
  """(decoder, vocab, max_length, options) of --export_dir; the checkpoint flags are
  refused. The export's own beam_size, alpha and extra_decode_length apply unless
  --decode_hparams gives them."""
  common.require(FLAGS.export_dir, "export_dir", "exports/ende_ct2")
  given = [name for name in ("output_dir", "checkpoint_path", "hparams_set", "hparams",
                             "problem", "data_dir") if getattr(FLAGS, name)]
  if FLAGS["weights"].present:
    given.append("weights")
  if given:
    raise UsageError(f"--{given[0]} is not read with --engine=ctranslate2: the export holds "
                     "the model and its vocabulary; drop it")
  from t2t_lite.inference.export import read_info
  from t2t_lite.inference.export.ctranslate2_decoder import Ctranslate2Decoder
  from t2t_lite.data.vocab import SubwordVocab
  info = read_info(FLAGS.export_dir, "ctranslate2")
  options = dataclasses.replace(options, **{
      key: info[key] for key in ("beam_size", "alpha", "extra_decode_length")
      if key not in given_keys})
  decoder = Ctranslate2Decoder(FLAGS.export_dir, options.extra_decode_length)
  return decoder, SubwordVocab(decoder.vocab_file), decoder.max_length, options


def _mode() -> str:
  """translate, interactive or score; their flags are checked before anything loads."""
  given = [name for name in ("decode_from_file", "score_file") if getattr(FLAGS, name)]
  if FLAGS.decode_interactive:
    given.insert(0, "decode_interactive")
  if len(given) > 1:
    raise UsageError(f"--{given[0]} and --{given[1]} are different modes; give one")
  if not given:
    raise UsageError("--decode_from_file is required, e.g. --decode_from_file=test.en (or "
                     "--decode_interactive, or --score_file)")
  if given[0] == "decode_interactive":
    if FLAGS.decode_to_file:
      raise UsageError("--decode_to_file is not written with --decode_interactive (the "
                       "translations go to standard output); drop it")
    return "interactive"
  common.require(FLAGS.decode_to_file, "decode_to_file",
                 "test.de.out" if given[0] == "decode_from_file" else "scores.txt")
  path = getattr(FLAGS, given[0])
  if not os.path.isfile(path):
    raise UsageError(f"--{given[0]}={path} does not exist")
  if os.path.realpath(FLAGS.decode_to_file) == os.path.realpath(path):
    raise UsageError(f"--decode_to_file={FLAGS.decode_to_file} is --{given[0]}, which it "
                     "would overwrite; write the output to another file")
  return "translate" if given[0] == "decode_from_file" else "score"


def _engine(options, given_keys: set[str]):
  """(decoder, vocab, max_length, options) of the chosen engine."""
  if FLAGS.engine == "ctranslate2":
    if FLAGS.ensemble:
      raise UsageError("--ensemble decodes with --engine=tensorflow (checkpoints); drop "
                       "--engine=ctranslate2, or --ensemble")
    return ctranslate2_engine(options, given_keys)
  if FLAGS.export_dir:
    raise UsageError("--export_dir is read by --engine=ctranslate2 only; pass that, or "
                     "--output_dir alone for the tensorflow engine")
  run = translator.load(FLAGS.output_dir, FLAGS.checkpoint_path, FLAGS.hparams_set,
                       FLAGS.hparams, FLAGS.problem, FLAGS.data_dir, FLAGS.weights)
  print(f"weights: {run.weights_read}", file=sys.stderr)
  if not FLAGS.ensemble:
    return run.decoder(options), run.vocab, run.hparams.max_length, options
  from t2t_lite.inference import decode
  members = [run.model] + [_member(name, run) for name in FLAGS.ensemble]
  print(f"an ensemble of {len(members)} models: the mean of their log-probabilities",
        file=sys.stderr)
  decoder = decode.Decoder(decode.Ensemble(members), run.hparams.max_length,
                           options.extra_decode_length, never=run.vocab.reserved_ids())
  return decoder, run.vocab, run.hparams.max_length, options


def _member(name: str, main):
  """The model of --ensemble's `name` (a run directory or a checkpoint prefix), refused in one
  line when its vocabulary is not `main`'s (a translator.RunModel)."""
  from t2t_lite.data.text import file_sha256
  is_run = os.path.isdir(name)
  directory = name if is_run else os.path.dirname(name) or "."
  member = translator.build(directory, what=name)
  ours, theirs = (file_sha256(run.vocab.model_file) for run in (main, member))
  if ours != theirs:
    raise UsageError(f"--ensemble={name} has another vocabulary than the first model's "
                     f"(sha256 {theirs[:12]}, not {ours[:12]}); an ensemble decodes one "
                     "vocabulary")
  path = translator.newest_checkpoint(directory, None if is_run else name)
  try:
    member.restore(path, FLAGS.weights)
  except (ValueError, AssertionError) as err:
    raise UsageError(f"--ensemble={name}: cannot restore {path}: "
                     f"{str(err).splitlines()[0][:200]}") from None
  print(f"ensemble member {name}: weights: {member.weights_read}", file=sys.stderr)
  return member.model


def _score_pairs() -> list[tuple[str, str]]:
  """The (source, target) lines of --score_file, checked before anything is built."""
  from t2t_lite.data.text import read_lines
  lines = read_lines(FLAGS.score_file)
  if not lines:
    raise UsageError(f"--score_file={FLAGS.score_file} is empty; nothing to score")
  pairs = []
  for number, line in enumerate(lines, 1):
    if line.count("\t") != 1:
      raise UsageError(f"--score_file={FLAGS.score_file} line {number} has "
                       f"{line.count(chr(9))} tabs; each line is source<TAB>target")
    source, target = line.split("\t")
    pairs.append((source.strip(), target.strip()))
  return pairs


def _score(translator, pairs) -> None:
  scores = translator.score(pairs)
  write_atomic(FLAGS.decode_to_file, "".join(f"{score:.6f}\n" for score in scores))
  print(f"scored {len(scores)} lines -> {FLAGS.decode_to_file}", file=sys.stderr)


def main() -> None:
  from t2t_lite.data.text import read_lines
  mode = _mode()
  options, given_keys = translator.decode_options(FLAGS.decode_hparams)
  if mode == "score":
    for key in sorted(given_keys - {"batch_size", "batch_tokens"}):
      raise UsageError(f"--decode_hparams: {key} is not read with --score_file (forced "
                       "decoding searches nothing); only batch_size and batch_tokens are")
  pairs = _score_pairs() if mode == "score" else []
  lines = read_lines(FLAGS.decode_from_file) if mode == "translate" else []
  if mode == "translate" and not lines:
    raise UsageError(f"--decode_from_file={FLAGS.decode_from_file} is empty; nothing to decode")
  decoder, vocab, max_length, options = _engine(options, given_keys)
  translate = translator.Translator(decoder, vocab, max_length, options)
  if mode == "score":
    _score(translate, pairs)
    return
  if mode == "interactive":
    print("reading sentences from standard input, one a line; end with Ctrl-D",
          file=sys.stderr, flush=True)
    for number, line in enumerate(sys.stdin, 1):
      print(translate([line.rstrip("\n")], number)[0], flush=True)
    return
  translations = translate(lines)
  write_atomic(FLAGS.decode_to_file, "".join(t + "\n" for t in translations))
  empty = sum(not line.strip() for line in lines)
  print(f"translated {len(lines) - empty} lines ({empty} empty) -> "
        f"{FLAGS.decode_to_file}", file=sys.stderr)


def run() -> None:
  common.run(main, "t2t-lite-decoder")


if __name__ == "__main__":
  run()
