"""t2t-lite-translate-all: the BLEU of every checkpoint of a run, as one TensorBoard curve.

Each checkpoint `ckpt-N` of --output_dir (N: micro-batches trained on) translates
--decode_from_file as t2t-lite-decoder does (the same Translator, --decode_hparams and
vocabulary) and is scored against --reference as t2t-lite-bleu does (the same sacreBLEU
function and --target_lang).
The score goes to OUTPUT_DIR/eval_bleu as the scalar `bleu` at the checkpoint's update (the
Adam step it holds, the step of the trainer's train/ and eval/ summaries), so TensorBoard
draws it beside them; stdout gets `ckpt-N (update U): BLEU X.XX`. A checkpoint saved in the
middle of an update shares its update with the one before it.

The model and its compiled search are built once; each checkpoint is restored into them.
The run is only read. What was scored is recorded in OUTPUT_DIR/eval_bleu/scored.json
(with the decoding settings and a digest of the two files), so a second run, or a restarted
watch, decodes only new checkpoints; other settings on the same run are refused rather than
mixed into one curve. A checkpoint that vanishes (rotated away by the trainer) or cannot be
read is reported in a warning and skipped, and tried again by a later run.

--wait_minutes=0 scores the checkpoints there now and exits; more keeps watching the run and
exits once that many minutes have passed without a new checkpoint.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys
import time

from absl import flags, logging

from t2t_lite.core import files
from t2t_lite.inference import translator
from t2t_lite.cli import bleu as bleu_cli  # noqa: F401  (its --reference and --target_lang
from t2t_lite.cli import common
from t2t_lite.cli import decoder as decoder_cli  # noqa: F401  (its flags, shared
from t2t_lite.core.errors import RunError, UsageError

# The decoder's and the scorer's flags, with their meaning: --output_dir, --data_dir,
# --problem, --hparams_set, --hparams, --decode_hparams, --decode_from_file; --reference,
# --target_lang. Defining them again would clash when the modules share a process.
SHARED_FLAGS = ("output_dir", "data_dir", "problem", "hparams_set", "hparams", "decode_hparams",
                "decode_from_file", "weights", "reference", "target_lang")
for _name in SHARED_FLAGS:
  flags.declare_key_flag(_name)  # listed by --help (when this module is the main one)
common.define_count("min_steps", 0, "Skip the checkpoints of updates before this one (updates, "
                    "as --train_steps and TensorBoard count them, not the N of ckpt-N; 0: none "
                    "skipped).")
flags.DEFINE_float("wait_minutes", 0.0, "0: score the checkpoints there now and exit. More: "
                   "keep watching --output_dir for new checkpoints, and exit after this many "
                   "minutes without one.")
flags.register_validator("wait_minutes", lambda value: value >= 0, message="must be at least 0")
flags.DEFINE_string("translations_dir", None, "Also keep each checkpoint's translations, as "
                    "DIR/ckpt-N.txt (default: not kept). Not the run directory.")
FLAGS = flags.FLAGS

PROGRAM = "t2t-lite-translate-all"
EVAL_DIR = "eval_bleu"
RECORD = "scored.json"
POLL_SECONDS = 10.0
CHECKPOINT = re.compile(r"^ckpt-(\d+)\.index$")
# Read by t2t-lite-decoder or t2t-lite-bleu only: this program decodes every checkpoint, with
# its own search, into its own files.
NOT_READ = {"checkpoint_path": "every checkpoint is decoded, --min_steps skips the early ones",
            "decode_to_file": "translations are kept with --translations_dir",
            "decode_interactive": "the source is --decode_from_file",
            "score_file": "forced decoding is not scored here",
            "engine": "checkpoints are decoded by t2t-lite's own search",
            "export_dir": "checkpoints are decoded, not exports",
            "translation": "the translations are this program's own"}


def checkpoint_files(output_dir: str) -> list[tuple[int, str]]:
  """(N, path) of the checkpoints ckpt-N on disk in the run directory itself, oldest first:
  the kept ones and those keep_checkpoint_every_n_hours preserved (the `best/` model is not
  one of the run's checkpoints)."""
  if not os.path.isdir(output_dir):
    return []
  found = [(int(match.group(1)), os.path.join(output_dir, f"ckpt-{match.group(1)}"))
           for match in map(CHECKPOINT.match, os.listdir(output_dir)) if match]
  return sorted(found)


def _digest(lines: list[str]) -> str:
  return hashlib.sha256("\n".join(lines).encode("utf-8")).hexdigest()[:16]


class Record:
  """OUTPUT_DIR/eval_bleu/scored.json: the settings of the curve and its scored checkpoints."""

  def __init__(self, eval_dir: str, settings: dict):
    self.path = os.path.join(eval_dir, RECORD)
    self.settings = settings
    self.scored: dict[str, dict] = {}
    self.scored_against: dict = {}  # the problem, vocabulary and hparams (see Scorer)
    if not os.path.isfile(self.path):
      return
    try:
      with open(self.path) as f:
        saved = json.load(f)
      old, self.scored = saved["settings"], saved["checkpoints"]
      old.setdefault("weights", "auto")  # recorded before runs had a moving average
    except (ValueError, KeyError, TypeError) as err:
      raise UsageError(f"{self.path} is not a record of {PROGRAM} ({err}); move it away to "
                       "score the checkpoints again") from None
    changed = [f"{key} {old.get(key)!r} -> {value!r}" for key, value in settings.items()
               if old.get(key) != value]
    if changed:
      raise UsageError(f"{self.path} holds BLEU decoded with other settings "
                       f"({'; '.join(changed)}); pass the same --decode_from_file, --reference, "
                       f"--target_lang and --decode_hparams, or move {eval_dir} away to start "
                       "a new curve")

  def scoring_against(self, scored_against: dict) -> None:
    """What the checkpoints are decoded with from here on (Scorer.scored_against)."""
    self.scored_against = scored_against

  def add(self, name: str, entry: dict) -> None:
    self.scored[name] = entry
    os.makedirs(os.path.dirname(self.path), exist_ok=True)
    files.write_atomic(self.path, json.dumps({"settings": self.settings,
                                              "scored_against": self.scored_against,
                                              "checkpoints": self.scored}, indent=2))


def _check_translations_dir(path: str, output_dir: str) -> None:
  """Translations never go among checkpoints: not the run, nor above it, nor a directory of
  it that holds checkpoints (best/); a fresh subdirectory of the run is fine."""
  where = files.overlap(path, output_dir)
  holds_checkpoints = os.path.isdir(path) and any(
      name == "checkpoint" or name.endswith(".index") for name in os.listdir(path))
  if where in ("is", "contains") or (where == "is inside" and holds_checkpoints):
    raise UsageError(f"--translations_dir={path} {where} --output_dir={output_dir}"
                     f"{' and holds checkpoints' if where == 'is inside' else ''}; the run's "
                     "checkpoint files are only read: use e.g. "
                     f"--translations_dir={os.path.join(output_dir, EVAL_DIR, 'translations')}")
  common.check_writable_dir(path, "translations_dir")


def check_flags():
  """All usage errors, before TensorFlow starts: (options, sources, references, record)."""
  from t2t_lite.inference.metrics import bleu_tokenizer
  from t2t_lite.data.text import read_lines
  common.require(FLAGS.output_dir, "output_dir", "runs/multi30k")
  for name, why in NOT_READ.items():
    if FLAGS[name].present:
      raise UsageError(f"--{name} is not read by {PROGRAM}: {why}; drop it")
  common.require(FLAGS.decode_from_file, "decode_from_file", "test.en")
  common.require(FLAGS.reference, "reference", "test.de")
  for name in ("decode_from_file", "reference"):
    if not os.path.isfile(FLAGS[name].value):
      raise UsageError(f"--{name}={FLAGS[name].value} does not exist")
  sources, references = read_lines(FLAGS.decode_from_file), read_lines(FLAGS.reference)
  if not sources:
    raise UsageError(f"--decode_from_file={FLAGS.decode_from_file} is empty; nothing to decode")
  if len(sources) != len(references):
    raise UsageError(f"line counts differ: {FLAGS.decode_from_file} has {len(sources)} lines, "
                     f"{FLAGS.reference} has {len(references)}")
  scored_one = "BLEU scores the best hypothesis"
  options, _ = translator.decode_options(FLAGS.decode_hparams, not_read={
      "return_beams": scored_one, "samples_per_input": scored_one})
  bleu_tokenizer(FLAGS.target_lang)  # a missing tokenizer is reported before any decoding
  output_dir = FLAGS.output_dir
  if os.path.exists(output_dir) and not os.path.isdir(output_dir):
    raise UsageError(f"--output_dir={output_dir} is not a directory")
  if not FLAGS.wait_minutes:  # a watched run may not have started yet
    if not os.path.isdir(output_dir):
      raise UsageError(f"--output_dir={output_dir} does not exist")
    from t2t_lite.runs import rundir
    if rundir.read_meta(output_dir) is None:
      raise UsageError(f"--output_dir={output_dir} holds no {rundir.META_FILE}; pass the "
                       "directory of a training run")
    if not checkpoint_files(output_dir):
      raise UsageError(f"--output_dir={output_dir} holds no checkpoints (ckpt-N.index); "
                       "pass --wait_minutes to wait for the trainer's first one")
  eval_dir = os.path.join(output_dir, EVAL_DIR)
  common.check_writable_dir(eval_dir, "output_dir")
  if FLAGS.translations_dir:
    _check_translations_dir(FLAGS.translations_dir, output_dir)
  settings = {"decode_from_file": _digest(sources), "reference": _digest(references),
              "lines": len(sources), "target_lang": FLAGS.target_lang,
              "beam_size": options.beam_size, "alpha": options.alpha,
              "extra_decode_length": options.extra_decode_length, "weights": FLAGS.weights}
  if options.sampling_method == "random":  # (a record of beam search has none of these)
    settings.update({name: getattr(options, name) for name in
                     ("sampling_method", *translator.SAMPLING_KEYS)})
  return options, sources, references, Record(eval_dir, settings)


class Scorer:
  """Translates with one checkpoint after another: the model, its compiled search and the
  vocabulary are built once and each checkpoint's weights are restored into them, so the
  search is traced once."""

  def __init__(self, output_dir: str, options):
    from t2t_lite.runs import rundir
    if rundir.read_meta(output_dir) is None:
      raise UsageError(f"--output_dir={output_dir} holds no {rundir.META_FILE}; pass the "
                       "directory of a training run")
    self.run = translator.build(output_dir, FLAGS.hparams_set, FLAGS.hparams, FLAGS.problem,
                               FLAGS.data_dir)
    self.translate = self.run.translator(options)
    # what the curve decoded with, recorded beside it
    self.scored_against = {"problem": self.run.problem.name,
                           "data_dir": os.path.abspath(self.run.data_dir),
                           "vocab_sha256": rundir.data_record_of(self.run.meta)
                           .get("vocab_sha256"),
                           "hparams_set": self.run.meta.get("hparams_set"),
                           "hparams": self.run.hparams.values()}

  def update_of(self, path: str) -> int:
    """The update a checkpoint records: Adam's step (skipped non-finite updates do not
    count), or for an average, the update of the newest checkpoint averaged."""
    from t2t_lite.runs.checkpoints import update_of
    return update_of(path)

  def restore(self, path: str) -> str:
    return translator.restore(self.run.model, path, FLAGS.weights)


class Curve:
  """Scores the run's unscored checkpoints into OUTPUT_DIR/eval_bleu."""

  def __init__(self, options, sources: list[str], references: list[str], record: Record):
    self.options, self.sources, self.references, self.record = (options, sources, references,
                                                                record)
    self.output_dir = FLAGS.output_dir
    self.eval_dir = os.path.join(self.output_dir, EVAL_DIR)
    self.tf = self.scorer = self.writer = None
    self.seen: set[str] = set()  # reported in this process (skipped or warned about)
    self.scored = self.skipped = self.failed = 0

  def _pending(self) -> list[tuple[int, str]]:
    """Unscored checkpoints that are complete: none newer than the one the trainer's
    checkpoint state names last (its files are all written by then)."""
    pending = [(n, p) for n, p in checkpoint_files(self.output_dir)
               if os.path.basename(p) not in self.record.scored]
    if not pending:
      return []
    if self.tf is None:
      self.tf = common.import_tensorflow()
    state = self.tf.train.get_checkpoint_state(self.output_dir)
    if state is not None and state.model_checkpoint_path:
      newest = int(state.model_checkpoint_path.rsplit("-", 1)[1])
      pending = [(n, p) for n, p in pending if n <= newest]
    return pending

  def _warn(self, name: str, err: Exception) -> None:
    if name not in self.seen:
      self.failed += 1
      reason = str(err).strip().splitlines()[0][:200] if str(err).strip() else type(err).__name__
      logging.warning("%s vanished or is unreadable (%s); skipped", name, reason)
    self.seen.add(name)

  def score_new(self) -> int:
    """Scores what is new; how many checkpoints this process had not seen before."""
    new = 0
    for micro_step, path in self._pending():
      name = os.path.basename(path)
      new += name not in self.seen
      if self.scorer is None:  # built for the first checkpoint (the run has started by then)
        self.scorer = Scorer(self.output_dir, self.options)
        self.record.scoring_against(self.scorer.scored_against)
      # Only reading the checkpoint is guarded: a file deleted or cut short surfaces as many
      # error types (NotFoundError, DataLossError, IndexError, ...).
      try:
        update = self.scorer.update_of(path)
        if update >= FLAGS.min_steps:
          weights = self.scorer.restore(path)
      except UsageError:  # --weights=ema on a checkpoint without an average
        raise
      except Exception as err:  # noqa: BLE001
        self._warn(name, err)
        continue
      if update < FLAGS.min_steps:
        if name not in self.seen:
          self.skipped += 1
          print(f"{name} (update {update}): skipped, before --min_steps={FLAGS.min_steps}",
                file=sys.stderr)
      else:
        self._score(name, micro_step, update, weights)
      self.seen.add(name)
    return new

  def _score(self, name: str, micro_step: int, update: int, weights: str) -> None:
    from t2t_lite.inference.metrics import bleu
    start = time.time()
    translations = self.scorer.translate(self.sources)
    score = bleu(translations, self.references, FLAGS.target_lang)
    if FLAGS.translations_dir:
      os.makedirs(FLAGS.translations_dir, exist_ok=True)
      files.write_atomic(os.path.join(FLAGS.translations_dir, f"{name}.txt"),
                         "".join(line + "\n" for line in translations))
    if self.writer is None:  # no event file until there is a point to write
      self.writer = self.tf.summary.create_file_writer(self.eval_dir)
    with self.writer.as_default():
      self.tf.summary.scalar("bleu", score.score, step=update)
    self.writer.flush()
    # Recorded after the point is on disk: a kill in between costs one repeated point, never
    # a missing one.
    self.record.add(name, {"micro_step": micro_step, "update": update, "bleu": score.score,
                           "signature": score.signature, "weights": weights})
    self.scored += 1
    print(f"{name} (update {update}): BLEU {score.score:.2f}", flush=True)
    logging.info("%s: %s (%.1fs)", name, score, time.time() - start)

  def close(self) -> None:
    if self.writer is not None:
      self.writer.close()


def main() -> None:
  options, sources, references, record = check_flags()
  curve = Curve(options, sources, references, record)
  wait = FLAGS.wait_minutes * 60
  if wait:
    print(f"watching {FLAGS.output_dir} for new checkpoints; exits after "
          f"{FLAGS.wait_minutes:g} minutes without one", file=sys.stderr, flush=True)
  idle_since = time.time()
  try:
    while True:
      if curve.score_new():
        idle_since = time.time()
      left = idle_since + wait - time.time()
      if left <= 0:
        break
      time.sleep(min(POLL_SECONDS, max(0.5, wait / 10), left))
  finally:
    curve.close()
  already = len(record.scored) - curve.scored
  if not record.scored and curve.failed:
    raise RunError(f"no checkpoint of {FLAGS.output_dir} could be scored ({curve.failed} "
                   "unreadable; see the warnings above)")
  print(f"scored {curve.scored} checkpoint{'' if curve.scored == 1 else 's'} ({already} "
        f"scored before"
        f"{f', {curve.skipped} before --min_steps' if curve.skipped else ''}) -> "
        f"{os.path.join(FLAGS.output_dir, EVAL_DIR)}", file=sys.stderr)


def run() -> None:
  common.run(main, PROGRAM)


if __name__ == "__main__":
  run()
