"""t2t-lite-avg-checkpoints: a checkpoint whose weights are the mean of the last N."""

from __future__ import annotations

import os
import shutil

from absl import flags

from t2t_lite.cli import common
from t2t_lite.errors import UsageError

flags.DEFINE_string("output_dir", None, "The training run directory.")
common.define_count("num_last_checkpoints", 5, "How many of the newest checkpoints to "
                    "average.", minimum=1)
flags.DEFINE_string("avg_dir", None, "Where the averaged checkpoint (and hparams.json) go.")
FLAGS = flags.FLAGS


def average(output_dir: str, num_last: int, avg_dir: str) -> tuple[str, list[str]]:
  """Averages the model weights of the newest `num_last` checkpoints into `avg_dir`."""
  from t2t_lite import registry, rundir
  tf = common.import_tensorflow()
  hparams, meta = rundir.model_from_run(output_dir)
  state = tf.train.get_checkpoint_state(output_dir)
  paths = list(state.all_model_checkpoint_paths)[-num_last:] if state else []
  if not paths:
    raise UsageError(f"no checkpoints in {output_dir}")
  model = registry.model(hparams.model)(hparams, meta["vocab_size"])
  checkpoint = tf.train.Checkpoint(model=model)
  sums = None
  for path in paths:
    checkpoint.restore(path).expect_partial().assert_existing_objects_matched()
    values = [v.numpy().astype("float64") for v in model.variables]
    sums = values if sums is None else [s + v for s, v in zip(sums, values)]
  for variable, total in zip(model.variables, sums):
    variable.assign((total / len(paths)).astype("float32"))
  os.makedirs(avg_dir, exist_ok=True)
  manager = tf.train.CheckpointManager(checkpoint, avg_dir, max_to_keep=1)
  saved = manager.save(checkpoint_number=int(paths[-1].rsplit("-", 1)[1]))
  shutil.copyfile(os.path.join(output_dir, rundir.META_FILE),
                  os.path.join(avg_dir, rundir.META_FILE))
  return saved, paths


def main() -> None:
  common.require(FLAGS.output_dir, "output_dir", "runs/multi30k")
  common.require(FLAGS.avg_dir, "avg_dir", "runs/multi30k/avg")
  common.check_writable_dir(FLAGS.avg_dir, "avg_dir")
  saved, paths = average(FLAGS.output_dir, FLAGS.num_last_checkpoints, FLAGS.avg_dir)
  print(f"averaged {len(paths)} checkpoints ({', '.join(os.path.basename(p) for p in paths)}) "
        f"-> {saved}")


def run() -> None:
  common.run(main, "t2t-lite-avg-checkpoints")


if __name__ == "__main__":
  run()
