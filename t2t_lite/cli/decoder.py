"""t2t-lite-decoder: translates a file, one output line per input line, in order."""

from __future__ import annotations

import os
import sys

from absl import flags, logging

from t2t_lite.cli import common
from t2t_lite.errors import UsageError
from t2t_lite.files import write_atomic
from t2t_lite.restore import load_model

flags.DEFINE_string("problem", None, "Registered problem (default: the run's).")
flags.DEFINE_string("hparams_set", None, "Hparams set (default: the run's hparams.json).")
flags.DEFINE_string("hparams", "", "Overrides for --hparams_set.")
flags.DEFINE_string("data_dir", None, "Datagen directory with the vocabulary (default: the run's).")
flags.DEFINE_string("output_dir", None, "The training (or averaged) run directory.")
flags.DEFINE_string("checkpoint_path", None, "A checkpoint (default: the newest in output_dir).")
flags.DEFINE_string("decode_hparams", "", "beam_size, alpha, batch_size (source tokens), "
                    "extra_decode_length "
                    "(with --engine=ctranslate2, the export's unless given here).")
flags.DEFINE_string("decode_from_file", None, "Source text, one sentence a line (.gz allowed).")
flags.DEFINE_string("decode_to_file", None, "Where the translations go.")
flags.DEFINE_enum("engine", "tensorflow", ["tensorflow", "ctranslate2"],
                  "Who decodes: t2t-lite's own search over a checkpoint (tensorflow), or a "
                  "t2t-lite-exporter --format=ctranslate2 export (ctranslate2, --export_dir).")
flags.DEFINE_string("export_dir", None, "The CTranslate2 export, with --engine=ctranslate2.")
FLAGS = flags.FLAGS


def decode_hparams(spec: str):
  from t2t_lite.hparams import HParams
  # batch_size counts source tokens, padding included (rows x longest row), as training's
  # does: 1024 holds about 64 test_2016_flickr sentences, more short ones, fewer long ones.
  hparams = HParams(beam_size=4, alpha=0.6, batch_size=1024, extra_decode_length=50,
                    use_cache=True)
  hparams.parse(spec)
  if hparams.beam_size < 1 or hparams.batch_size < 1:
    raise UsageError("--decode_hparams: beam_size and batch_size must be at least 1")
  return hparams


def ctranslate2_engine(options):
  """(decoder, vocab, max_length) of --export_dir; the checkpoint flags are refused."""
  common.require(FLAGS.export_dir, "export_dir", "exports/ende_ct2")
  given = [name for name in ("output_dir", "checkpoint_path", "hparams_set", "hparams",
                             "problem", "data_dir") if getattr(FLAGS, name)]
  if given:
    raise UsageError(f"--{given[0]} is not read with --engine=ctranslate2: the export holds "
                     "the model and its vocabulary; drop it")
  from t2t_lite.export import read_info
  from t2t_lite.export.ctranslate2_decoder import Ctranslate2Decoder
  from t2t_lite.problems.vocab import SubwordVocab
  # The export's own beam_size, alpha and extra_decode_length unless --decode_hparams sets them.
  given_keys = {entry.split("=")[0].strip() for entry in FLAGS.decode_hparams.split(",")}
  info = read_info(FLAGS.export_dir, "ctranslate2")
  for key in ("beam_size", "alpha", "extra_decode_length"):
    if key not in given_keys:
      options.set_hparam(key, info[key])
  decoder = Ctranslate2Decoder(FLAGS.export_dir, options.extra_decode_length)
  return decoder, SubwordVocab(decoder.vocab_file), decoder.max_length


def main() -> None:
  from t2t_lite.problems.base import read_lines
  common.require(FLAGS.decode_from_file, "decode_from_file", "test.en")
  common.require(FLAGS.decode_to_file, "decode_to_file", "test.de.out")
  if not os.path.isfile(FLAGS.decode_from_file):
    raise UsageError(f"--decode_from_file={FLAGS.decode_from_file} does not exist")
  lines = read_lines(FLAGS.decode_from_file)
  if not lines:
    raise UsageError(f"--decode_from_file={FLAGS.decode_from_file} is empty; nothing to decode")
  options = decode_hparams(FLAGS.decode_hparams)
  if FLAGS.engine == "ctranslate2":
    decoder, vocab, max_length = ctranslate2_engine(options)
  else:
    if FLAGS.export_dir:
      raise UsageError("--export_dir is read by --engine=ctranslate2 only; pass that, or "
                       "--output_dir alone for the tensorflow engine")
    model, vocab, hparams = load_model(FLAGS.output_dir, FLAGS.checkpoint_path,
                                       FLAGS.hparams_set, FLAGS.hparams, FLAGS.problem,
                                       FLAGS.data_dir)
    max_length = hparams.max_length
    from t2t_lite import decode
    decoder = decode.Decoder(model, max_length, options.extra_decode_length)
  sources, positions = [], []
  for index, line in enumerate(lines):
    if line.strip():  # an empty line translates to an empty line
      ids = vocab.encode(line.strip())
      if len(ids) > max_length:
        logging.warning("line %d has %d tokens; only the first %d are translated", index + 1,
                        len(ids), max_length)
      sources.append(ids)
      positions.append(index)
  outputs = decoder.translate_ids(sources, options.beam_size, options.alpha, batch_size=0,
                                  use_cache=options.use_cache, batch_tokens=options.batch_size)
  translations = [""] * len(lines)
  for index, ids in zip(positions, outputs):
    translations[index] = vocab.decode(ids)
  write_atomic(FLAGS.decode_to_file, "".join(t.replace("\n", " ") + "\n" for t in translations))
  print(f"translated {len(sources)} lines ({len(lines) - len(sources)} empty) -> "
        f"{FLAGS.decode_to_file}", file=sys.stderr)


def run() -> None:
  common.run(main, "t2t-lite-decoder")


if __name__ == "__main__":
  run()
