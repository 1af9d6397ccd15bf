"""t2t-lite-decoder: translates a file, one output line per input line, in order."""

from __future__ import annotations

import os
import sys

from absl import flags, logging

from t2t_lite.cli import common
from t2t_lite.errors import UsageError
from t2t_lite.files import write_atomic

flags.DEFINE_string("problem", None, "Registered problem (default: the run's).")
flags.DEFINE_string("hparams_set", None, "Hparams set (default: the run's hparams.json).")
flags.DEFINE_string("hparams", "", "Overrides for --hparams_set.")
flags.DEFINE_string("data_dir", None, "Datagen directory with the vocabulary (default: the run's).")
flags.DEFINE_string("output_dir", None, "The training (or averaged) run directory.")
flags.DEFINE_string("checkpoint_path", None, "A checkpoint (default: the newest in output_dir).")
flags.DEFINE_string("decode_hparams", "", "beam_size, alpha, batch_size, extra_decode_length.")
flags.DEFINE_string("decode_from_file", None, "Source text, one sentence a line (.gz allowed).")
flags.DEFINE_string("decode_to_file", None, "Where the translations go.")
FLAGS = flags.FLAGS


def decode_hparams(spec: str):
  from t2t_lite.hparams import HParams
  hparams = HParams(beam_size=4, alpha=0.6, batch_size=32, extra_decode_length=50,
                    use_cache=True)
  hparams.parse(spec)
  if hparams.beam_size < 1 or hparams.batch_size < 1:
    raise UsageError("--decode_hparams: beam_size and batch_size must be at least 1")
  return hparams


def load_model(output_dir, checkpoint_path, hparams_set, overrides, problem_name, data_dir):
  """(model, vocab, hparams) restored from a run directory or checkpoint."""
  from t2t_lite import registry, rundir
  # The run's recorded values, under its set or another one; --hparams may change them.
  hparams, meta, _ = rundir.resolve(hparams_set, overrides, output_dir, allow_change=True)
  if not hparams_set and meta is None:
    raise UsageError("give --output_dir of a training run (with its hparams.json) or "
                     "--hparams_set")
  problem = registry.problem(problem_name or (meta or {}).get("problem") or "")
  data_dir = data_dir or (meta or {}).get("data_dir")
  common.require(data_dir, "data_dir", "data/multi30k_ende")
  vocab = problem.get_vocab(data_dir)
  tf = common.import_tensorflow()
  path = checkpoint_path or (tf.train.latest_checkpoint(output_dir) if output_dir else None)
  if not path:
    raise UsageError(f"no checkpoint found in {output_dir}; pass --checkpoint_path")
  model = registry.model(hparams.model)(hparams, vocab.size)
  try:
    tf.train.Checkpoint(model=model).restore(path).expect_partial().assert_existing_objects_matched()
  except (tf.errors.OpError, ValueError, AssertionError) as err:
    raise UsageError(f"cannot restore {path}: {str(err).splitlines()[0][:200]}") from None
  logging.info("restored %s", path)
  return model, vocab, hparams


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
  model, vocab, hparams = load_model(FLAGS.output_dir, FLAGS.checkpoint_path, FLAGS.hparams_set,
                                     FLAGS.hparams, FLAGS.problem, FLAGS.data_dir)
  sources, positions = [], []
  for index, line in enumerate(lines):
    if line.strip():  # an empty line translates to an empty line
      ids = vocab.encode(line.strip())
      if len(ids) > hparams.max_length:
        logging.warning("line %d has %d tokens; only the first %d are translated", index + 1,
                        len(ids), hparams.max_length)
      sources.append(ids)
      positions.append(index)
  from t2t_lite import decode
  decoder = decode.Decoder(model, hparams.max_length, options.extra_decode_length)
  outputs = decoder.translate_ids(sources, options.beam_size, options.alpha, options.batch_size,
                                  options.use_cache)
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
