"""t2t-lite-exporter: a trained (or averaged) run as a SavedModel or a CTranslate2 model."""

from __future__ import annotations

import glob
import os
import sys

from absl import flags, logging

from t2t_lite.cli import common
from t2t_lite.core.errors import UsageError

flags.DEFINE_string("output_dir", None, "The training (or averaged) run directory.")
flags.DEFINE_string("checkpoint_path", None, "A checkpoint (default: the newest in output_dir).")
flags.DEFINE_string("data_dir", None, "Datagen directory with the vocabulary (default: the run's).")
flags.DEFINE_string("export_dir", None, "Where the export goes (written whole or not at all).")
flags.DEFINE_string("format", "saved_model", "saved_model or ctranslate2.")
flags.DEFINE_string("decode_hparams", "",
                    "beam_size, alpha, return_beams (saved_model), extra_decode_length.")
flags.DEFINE_string("quantization", "none",
                    "CTranslate2 weights: none (float32), int8, int16 or float16.")
common.define_weights("exported")
flags.DEFINE_bool("overwrite", False, "Replace an existing export in --export_dir.")
FLAGS = flags.FLAGS


def check_flags() -> None:
  """Usage errors that need no TensorFlow: flags, formats, the export directory."""
  from t2t_lite.inference.export import FORMATS, check_export_dir, export_hparams
  from t2t_lite.inference.export.ctranslate2_model import QUANTIZATIONS
  if not FLAGS.output_dir:  # also with --checkpoint_path: its hparams.json names the model
    raise UsageError("--output_dir is required, e.g. --output_dir=runs/ende_avg")
  common.require(FLAGS.export_dir, "export_dir", "exports/ende")
  if FLAGS.format not in FORMATS:
    raise UsageError(f"--format={FLAGS.format} is unknown; supported: {', '.join(FORMATS)}")
  if FLAGS.quantization not in QUANTIZATIONS:
    raise UsageError(f"--quantization={FLAGS.quantization} is unknown; supported: "
                     f"{', '.join(QUANTIZATIONS)}")
  if FLAGS.quantization != "none" and FLAGS.format != "ctranslate2":
    raise UsageError(f"--quantization={FLAGS.quantization} applies to --format=ctranslate2 "
                     "only; a SavedModel keeps the float32 weights")
  if not os.path.isdir(FLAGS.output_dir):
    raise UsageError(f"--output_dir={FLAGS.output_dir} is not a directory")
  if not FLAGS.checkpoint_path and not glob.glob(os.path.join(FLAGS.output_dir, "*.index")):
    raise UsageError(f"no checkpoint found in {FLAGS.output_dir}; pass --checkpoint_path")
  checkpoint_files = []
  if FLAGS.checkpoint_path:
    checkpoint_files = [FLAGS.checkpoint_path, os.path.dirname(FLAGS.checkpoint_path) or "."]
  check_export_dir(FLAGS.export_dir, [FLAGS.output_dir, *checkpoint_files], FLAGS.overwrite)
  common.check_writable_dir(os.path.dirname(os.path.abspath(FLAGS.export_dir)), "export_dir")
  export_hparams(FLAGS.decode_hparams, FLAGS.format)


def main() -> None:
  check_flags()
  from t2t_lite.inference import export
  export.export_run(FLAGS.output_dir, FLAGS.export_dir, FLAGS.format, FLAGS.checkpoint_path,
                    FLAGS.data_dir, FLAGS.decode_hparams, FLAGS.quantization, FLAGS.weights)
  logging.info("exported %s", FLAGS.export_dir)
  print(f"exported {FLAGS.format} -> {FLAGS.export_dir}", file=sys.stderr)


def run() -> None:
  common.run(main, "t2t-lite-exporter")


if __name__ == "__main__":
  run()
