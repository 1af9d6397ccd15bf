"""t2t-lite-avg-checkpoints: a checkpoint whose weights are the mean of the last N, or of
the best ones the trainer kept (--best: RUN/best, ranked by its evaluations).

Of each checkpoint it reads the moving average of the weights where the run keeps one, else
the raw weights (--weights chooses); the best checkpoints hold the weights their evaluations
read. What was averaged, and which weights, is recorded in averaged.json.

It never touches its inputs: an --avg_dir equal to, inside or containing --output_dir is
refused; the average is written into a temporary directory beside --avg_dir and renamed
into place, so a failed or killed run leaves the old --avg_dir (or none) as it was. A run
still training may delete checkpoints while they are read: its oldest ones, or with --best
one it evicts from best.json (rewritten first, the files deleted after). A checkpoint whose
files vanished and that is no longer listed means starting again with the ones listed now
(a few times at most); one still listed is named, to be restored.
"""

from __future__ import annotations

import errno
import glob
import json
import os
import re
import shutil

from absl import flags, logging

from t2t_lite.cli import common
from t2t_lite.core.errors import RunError, UsageError
from t2t_lite.core import files

flags.DEFINE_string("output_dir", None, "The training run directory (read only).")
common.define_count("num_last_checkpoints", 5, "How many of the newest checkpoints to "
                    "average.", minimum=1)
flags.DEFINE_bool("best", False, "Average the best evaluated checkpoints that the trainer kept "
                  "in OUTPUT_DIR/best (--keep_best_checkpoints), all of them, or the "
                  "--num_last_checkpoints best.")
common.define_weights("averaged")
flags.DEFINE_string("avg_dir", None, "Where the averaged checkpoint (and hparams.json) go: a "
                    "new directory, or one an earlier averaging wrote (it is replaced). Not "
                    "inside --output_dir.")
FLAGS = flags.FLAGS

MARKER = "averaged.json"  # what this program writes: an earlier average may be replaced
ATTEMPTS = 3


def check_dirs(output_dir: str, avg_dir: str) -> None:
  """Usage errors for an --avg_dir that overlaps the run or holds something else."""
  run, out = os.path.realpath(output_dir), os.path.realpath(avg_dir)
  if not os.path.isdir(run):
    raise UsageError(f"--output_dir={output_dir} is not a directory")
  where = files.overlap(avg_dir, output_dir)
  if where:
    raise UsageError(f"--avg_dir={avg_dir} {where} --output_dir={output_dir}; averaging "
                     f"never writes into the run it reads: use e.g. --avg_dir={run}_avg")
  if os.path.exists(out):
    if not os.path.isdir(out):
      raise UsageError(f"--avg_dir={avg_dir} exists and is not a directory")
    present = os.listdir(out)
    if present and not os.path.isfile(os.path.join(out, MARKER)):
      raise UsageError(f"--avg_dir={avg_dir} is not empty and was not written by "
                       "t2t-lite-avg-checkpoints; choose a new directory")
    others = sorted(name for name in present if not _written_by_average(name))
    if others:  # e.g. t2t-lite-translate-all's scores of the earlier average
      shown = ", ".join(others[:3]) + (f" and {len(others) - 3} more" if len(others) > 3
                                       else "")
      raise UsageError(f"--avg_dir={avg_dir} holds an earlier average and files it did not "
                       f"write ({shown}), which a new average would delete; move them away "
                       "or choose another --avg_dir")


def _written_by_average(name: str) -> bool:
  """What `average` writes into --avg_dir: its marker, the run's record, one checkpoint."""
  from t2t_lite.runs import rundir
  return (name in (MARKER, rundir.META_FILE, "checkpoint")
          or re.fullmatch(r"ckpt-\d+\.(index|data-\d+-of-\d+)", name) is not None)


def _read_weights(model, path: str, weights: str) -> str:
  from t2t_lite.inference import translator
  return translator.restore(model, path, weights)


def _best_checkpoints(output_dir: str, count: int | None) -> list[str]:
  """The `count` best (all if None) of the checkpoints the trainer kept in OUTPUT_DIR/best,
  oldest first."""
  from t2t_lite.training import best
  _, kept = best.read(os.path.join(output_dir, "best"))
  if not kept:
    raise UsageError(f"{output_dir}/best keeps no checkpoints (trained with "
                     "--keep_best_checkpoints=0); average the last ones instead (drop --best)")
  paths = kept[:count] if count else kept
  return sorted(paths, key=lambda p: int(p.rsplit("-", 1)[1]))


def _paths(output_dir: str, num_last: int, best_of: int | None) -> list[str]:
  """The checkpoints to average, oldest first: the newest num_last, or the best ones."""
  if best_of is not None:
    return _best_checkpoints(output_dir, best_of or None)
  from t2t_lite.runs.checkpoints import newest_first
  return list(reversed(newest_first(output_dir)[:num_last]))


def _missing_file(path: str) -> str | None:
  """A file of checkpoint `path` that is not there (its .index or a shard of its data), or
  None when all of them are."""
  if not os.path.isfile(path + ".index"):
    return path + ".index"
  shards = glob.glob(glob.escape(path) + ".data-*-of-*")
  count = int(shards[0].rsplit("-of-", 1)[1]) if shards else 1
  return next((name for name in (f"{path}.data-{i:05d}-of-{count:05d}" for i in range(count))
               if not os.path.isfile(name)), None)


def _not_whole(output_dir: str, best_of: int | None, path: str, missing: str) -> UsageError:
  """The error for checkpoint `path`, still listed, whose file `missing` is not there."""
  if best_of is not None:
    return UsageError(f"{output_dir}/best/best.json lists {os.path.basename(path)}, which is "
                      f"not there ({missing}); restore the folder, or average the last "
                      "checkpoints (drop --best)")
  return UsageError(f"checkpoint {path} is not whole ({missing} is not there); restore it, or "
                    f"move {path}.index away to average the checkpoints before it")


def _sum_of(model, paths: list[str], weights: str) -> tuple[list, set[str], int]:
  """The sums of the checkpoints' `weights` (float64, by variable of `model`), the weights
  read and the update of the newest (the last of `paths`); FileNotFoundError for a file of
  one of them that is not there."""
  for path in paths:
    missing = _missing_file(path)
    if missing:
      raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), missing)
  sums, read = None, set()
  for path in paths:
    read.add(_read_weights(model, path, weights))
    values = [v.numpy().astype("float64") for v in model.variables]
    sums = values if sums is None else [s + v for s, v in zip(sums, values)]
  return sums, read, _update_of(paths[-1])


def _mean_of(tf, model, output_dir: str, num_last: int, best_of: int | None,
             weights: str) -> tuple[list[str], str, int]:
  """Assigns to `model` the mean of the chosen checkpoints' `weights` (see
  translator.restore); their paths, the weights read ("ema" or "raw") and the update of the
  newest."""
  for _ in range(ATTEMPTS):
    paths = _paths(output_dir, num_last, best_of)
    if not paths:
      raise UsageError(f"no checkpoints in {output_dir}")
    try:
      sums, read, update = _sum_of(model, paths, weights)
    except (tf.errors.OpError, OSError, ValueError) as err:
      gone = [(path, missing) for path in paths if (missing := _missing_file(path))]
      if not gone:
        raise
      # Deleted by the run since they were listed (rotated away, or evicted from best.json,
      # which is rewritten first) when they are no longer listed: take the ones listed now.
      listed = _paths(output_dir, num_last, best_of)
      still = [(path, missing) for path, missing in gone if path in listed]
      if still:
        raise _not_whole(output_dir, best_of, *still[0]) from None
      logging.warning("checkpoint %s vanished while being read (%s); starting again",
                      gone[0][0], str(err).splitlines()[0][:120])
      continue
    if len(read) > 1:
      raise UsageError(f"of the checkpoints {', '.join(os.path.basename(p) for p in paths)}, "
                       "some hold a moving average of the weights and some do not; choose "
                       "--weights=raw")
    for variable, total in zip(model.variables, sums):
      variable.assign((total / len(paths)).astype("float32"))
    return paths, read.pop(), update
  raise RunError(f"the checkpoints of {output_dir} changed {ATTEMPTS} times while being "
                 "read; try again, or average a copy of the run")


def _update_of(path: str) -> int:
  from t2t_lite.runs.checkpoints import recorded_update
  update = recorded_update(path)
  if update is None:
    raise UsageError(f"checkpoint {path} records no update (Adam's step); average the "
                     "checkpoints of a training run")
  return update


def average(output_dir: str, num_last: int, avg_dir: str, best_of: int | None = None,
            weights: str = "auto") -> tuple[str, list[str]]:
  """Averages the model weights (`weights`, see translator.restore) of the newest `num_last`
  checkpoints, or with `best_of` of the best ones kept in OUTPUT_DIR/best (0: all of them),
  into `avg_dir`."""
  from t2t_lite.core import registry
  from t2t_lite.runs import rundir
  check_dirs(output_dir, avg_dir)
  tf = common.import_tensorflow()
  hparams, meta = rundir.model_from_run(output_dir)
  model = registry.model(hparams.model)(hparams, meta["vocab_size"])
  paths, read, newest_update = _mean_of(tf, model, output_dir, num_last, best_of, weights)
  # An earlier average is swapped out (or moved aside) only once the new one is complete.
  # The update of the newest checkpoint averaged, kept in the average (translate-all plots
  # it there); its micro-batch count N would be a wrong update with replicas or accumulation.
  update = tf.Variable(newest_update, dtype=tf.int64)
  with files.atomic_directory(os.path.realpath(avg_dir)) as tmp:
    manager = tf.train.CheckpointManager(tf.train.Checkpoint(model=model, update_step=update),
                                         tmp, max_to_keep=1)
    saved = manager.save(checkpoint_number=int(paths[-1].rsplit("-", 1)[1]))
    shutil.copyfile(os.path.join(output_dir, rundir.META_FILE),
                    os.path.join(tmp, rundir.META_FILE))
    files.write_atomic(os.path.join(tmp, MARKER), json.dumps(
        {"checkpoints": [os.path.abspath(p) for p in paths],
         "chosen": "best" if best_of is not None else "last",
         "weights": read}, indent=2))
  return os.path.join(avg_dir, os.path.basename(saved)), paths


def main() -> None:
  common.require(FLAGS.output_dir, "output_dir", "runs/multi30k")
  common.require(FLAGS.avg_dir, "avg_dir", "runs/multi30k_avg")
  check_dirs(FLAGS.output_dir, FLAGS.avg_dir)
  common.check_writable_dir(os.path.dirname(os.path.abspath(FLAGS.avg_dir)), "avg_dir")
  best_of = None
  if FLAGS.best:
    best_of = FLAGS.num_last_checkpoints if FLAGS["num_last_checkpoints"].present else 0
  saved, paths = average(FLAGS.output_dir, FLAGS.num_last_checkpoints, FLAGS.avg_dir,
                         best_of, FLAGS.weights)
  with open(os.path.join(FLAGS.avg_dir, MARKER)) as f:
    weights = json.load(f)["weights"]
  print(f"averaged {len(paths)} {'best ' if FLAGS.best else ''}checkpoints "
        f"({', '.join(os.path.basename(p) for p in paths)}; {weights} weights) -> {saved}")


def run() -> None:
  common.run(main, "t2t-lite-avg-checkpoints")


if __name__ == "__main__":
  run()
