"""Exports of a trained run for serving: a TensorFlow SavedModel and a CTranslate2 model.

An export is built in a temporary directory beside `export_dir` and renamed into place only
once complete, so a crash or kill leaves either no export or the previous one untouched.
Each export holds `t2t_lite_export.json`: what it was made from and its decoding settings.
"""

from __future__ import annotations

import contextlib
import json
import os

from t2t_lite.core import faults, files
from t2t_lite.core.errors import UsageError

FORMATS = ("saved_model", "ctranslate2")
INFO_FILE = "t2t_lite_export.json"
VOCAB_FILE = "sentencepiece.model"


def check_export_dir(export_dir: str, inputs: list[str], overwrite: bool) -> None:
  """Usage errors for an export_dir that overlaps an input or holds an export already."""
  for path in inputs:
    if path and files.overlap(export_dir, path):
      raise UsageError(f"--export_dir={export_dir} overlaps {path}, which the export reads; "
                       "choose a directory outside the run")
  if os.path.exists(export_dir):
    if not os.path.isdir(export_dir):
      raise UsageError(f"--export_dir={export_dir} is a file; choose a directory")
    present = set(os.listdir(export_dir))
    if present and not overwrite:
      raise UsageError(f"--export_dir={export_dir} is not empty; pass --overwrite to replace "
                       "it, or choose another directory")
    if present:
      _check_replaceable(export_dir, present)


def _check_replaceable(export_dir: str, present: set[str]) -> None:
  """--overwrite replaces an earlier export only: the directory holds its marker file and
  nothing the export did not write."""
  try:
    with open(os.path.join(export_dir, INFO_FILE)) as f:
      written = json.load(f).get("files")
  except (OSError, ValueError):
    raise UsageError(f"--export_dir={export_dir} holds files that no t2t-lite export wrote "
                     f"(no readable {INFO_FILE}), which --overwrite would delete; choose "
                     "an empty or new directory") from None
  others = sorted(present - set(written)) if written is not None else []
  if others:
    shown = ", ".join(others[:3]) + (f" and {len(others) - 3} more" if len(others) > 3 else "")
    raise UsageError(f"--export_dir={export_dir} holds an earlier export and files it did "
                     f"not write ({shown}), which --overwrite would delete; move them away "
                     "or choose another directory")


@contextlib.contextmanager
def atomic_directory(export_dir: str):
  """Yields an empty temporary directory beside `export_dir`, renamed into place on success
  (files.atomic_directory) with the tests' kill point just before the rename."""
  with files.atomic_directory(export_dir, faults.from_environment().export_written) as tmp:
    yield tmp


def write_info(directory: str, info: dict) -> None:
  """The export's marker: what it was made from, its settings and the files it wrote."""
  info = dict(info, files=sorted([*os.listdir(directory), INFO_FILE]))
  with open(os.path.join(directory, INFO_FILE), "w") as f:
    json.dump(info, f, indent=2, sort_keys=True)


def read_info(export_dir: str, expected_format: str) -> dict:
  """The export's t2t_lite_export.json; a usage error when it is not an export of that format."""
  path = os.path.join(export_dir, INFO_FILE)
  try:
    with open(path) as f:
      info = json.load(f)
  except (OSError, ValueError):
    raise UsageError(f"--export_dir={export_dir} is not a t2t-lite export (no readable "
                     f"{INFO_FILE}); create one with t2t-lite-exporter") from None
  if info.get("format") != expected_format:
    raise UsageError(f"--export_dir={export_dir} holds a {info.get('format')} export, not "
                     f"{expected_format}; export with --format={expected_format}")
  return info


def export_hparams(spec: str, export_format: str):
  """The decoding settings an export is built with (translator.DecodeOptions); every key
  given is used or refused: batching is the serving side's choice."""
  from t2t_lite.inference.translator import decode_options
  options, given = decode_options(
      spec, ("beam_size", "alpha", "extra_decode_length", "return_beams"))
  if "return_beams" in given and export_format != "saved_model":
    raise UsageError("--decode_hparams: return_beams is a SavedModel setting; CTranslate2 "
                     "returns n-best lists through its num_hypotheses option")
  return options


def export_run(output_dir: str, export_dir: str, export_format: str = "saved_model",
               checkpoint_path: str | None = None, data_dir: str | None = None,
               decode_hparams: str = "", quantization: str = "none",
               weights: str = "auto") -> None:
  """Exports a run's checkpoint (the newest unless given; its `weights`, see
  translator.restore) into export_dir, replacing what is there (t2t-lite-exporter refuses a
  non-empty export_dir without --overwrite first)."""
  from t2t_lite.inference import translator
  options = export_hparams(decode_hparams, export_format)
  # Resolved once: a save in the meantime must not make the record name another checkpoint.
  checkpoint = translator.newest_checkpoint(output_dir, checkpoint_path)
  run = translator.load(output_dir, checkpoint, data_dir=data_dir, weights=weights)
  model, vocab, hparams = run.model, run.vocab, run.hparams
  # The vocabulary is read too: an export_dir holding it is refused like one holding the run.
  check_export_dir(export_dir, [output_dir, os.path.dirname(vocab.model_file)], True)
  if export_format == "ctranslate2":
    from t2t_lite.inference.export import ctranslate2_model as exporter
  else:
    from t2t_lite.inference.export import saved_model as exporter
  exporter.check_expressible(hparams)
  info = {"format": export_format, "source": os.path.abspath(output_dir),
          "checkpoint": os.path.abspath(checkpoint), "weights": run.weights,
          "max_length": hparams.max_length,
          "beam_size": options.beam_size, "alpha": options.alpha,
          "extra_decode_length": options.extra_decode_length}
  with atomic_directory(export_dir) as tmp:
    if export_format == "ctranslate2":
      info.update(exporter.export(model, hparams, vocab.model_file, tmp, quantization))
    else:
      info["return_beams"] = options.return_beams
      exporter.export(model, hparams, vocab.model_file, tmp, options)
    write_info(tmp, info)
