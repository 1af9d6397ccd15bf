"""Two workers on localhost (TF_CONFIG), doing what real runs do: evaluate, stop early, warm
start, get signals, lose a worker, fail on one worker only."""

import json
import os

import numpy as np
import pytest
import tensorflow as tf

from conftest import TINY_FLAGS, TINY_HPARAMS, finish, start_workers, wait

PROGRAM = "t2t-lite-trainer"


def model_values(directory):
  path = tf.train.latest_checkpoint(directory)
  return {name: tf.train.load_checkpoint(path).get_tensor(name)
          for name, _ in tf.train.list_variables(path)
          if name.startswith("model/") and name.endswith("VARIABLE_VALUE")}


def relative_difference(a, b):
  assert a.keys() == b.keys() and len(a) > 20
  scale = max(float(np.abs(v).max()) for v in a.values())
  return max(float(np.abs(a[k] - b[k]).max()) for k in a) / scale


def flags_for(data_dir, output_dir, *extra):
  return [*TINY_FLAGS, f"--data_dir={data_dir}", f"--output_dir={output_dir}", *extra]


def test_evaluation_early_stopping_and_warm_start_on_two_workers(tiny_run, tmp_path):
  """Evaluations with BLEU of the moving average of the weights at updates 5 and 10, both kept
  in best/, which are not log (every 4) or save updates:
  every worker reads the window there (the crash was only the chief reading it). Dev loss
  cannot improve by 100, so early stopping ends the run at update 10 on both workers. Both
  started from the one checkpoint the chief resolved and end with equal weights. The
  schedule has a cooldown and the run a time budget: the pace is measured from update 4 and
  the chief's projection shared at update 8 (the budget allows more than --train_steps, so
  the end is 12). Update 3's loss spikes (micro-step 5 times 30 on both workers): noticed at
  the read of update 4, before any checkpoint, both roll back to the warm-started state the
  run began from and skip micro-batches 8-11 (update 3's on both workers), together."""
  output_dir = str(tmp_path / "run")
  source = tiny_run["output_dir"]
  schedule = "constant*linear_warmup*rsqrt_decay*rsqrt_hidden_size*linear_cooldown"
  workers = finish(start_workers(flags_for(
      tiny_run["data_dir"], output_dir, "--train_minutes=30",
      f"--hparams={TINY_HPARAMS},optimizer_multistep_accumulate_steps=2,"
      f"learning_rate_schedule={schedule},ema_decay=0.9,ema_reference_tokens=3000",
      "--keep_best_checkpoints=2", "--train_steps=12", "--local_eval_frequency=5",
      "--log_every=4", "--eval_steps=2", "--eval_bleu_sentences=8",
      "--save_checkpoints_steps=0", "--eval_early_stopping_steps=5",
      "--eval_early_stopping_metric_delta=100", f"--warm_start_from={source}"),
      {index: {"T2T_LITE_FAULT": "spike:5"} for index in range(2)}))
  chief, other = workers
  evaluations = [line for line in chief.lines if "eval at update" in line]
  assert [line.split("eval at update ")[1].split(" ")[0] for line in evaluations] == ["5", "10"]
  assert all("dev_loss" in line and "dev_perplexity" in line and "dev_bleu" in line
             for line in evaluations)
  assert not any("eval at update" in line for line in other.lines)  # the chief evaluates
  # the others leave before the chief, whose process holds the coordination service
  assert "coordination service" not in other.err, other.err[-2000:]
  assert "trained 10 updates (22 micro-steps)" in chief.out, chief.out
  assert "early stopping: dev_loss has not improved by more than 100 for 5 updates" in chief.out
  assert "trained 10 updates (22 micro-steps)" in other.out, other.out
  for worker in workers:
    assert ("Recovery 1 of 3: rolled back to the state the run started from (update 0); "
            "micro-batches 8-11 of the training stream (4) will be skipped") in worker.err
    assert "update 3: skipped micro-batches 8-11 of the training stream" in worker.err
    assert ("recovered from a divergence 1 time(s): update 3 (loss spike), batches 8-11 "
            "skipped") in worker.err
  spike = [line.split("diverged at ")[1] for line in chief.lines if "diverged at" in line]
  assert spike == [line.split("diverged at ")[1] for line in other.lines
                   if "diverged at" in line] and len(spike) == 1  # the same figures
  assert "early stopping, by the chief's evaluation" in other.out
  for worker in workers:
    assert [line.split("update ")[1].split("/")[0] for line in worker.lines
            if "/12 (micro-step" in line] == ["4", "8"]
    assert ("learning-rate cooldown: updates 10-12, falling to 0 after update 12 (the time "
            "budget's projection at update 8") in worker.err, worker.err[-3000:]
  newest = os.path.join(source, os.path.basename(tf.train.latest_checkpoint(source)))
  for worker in workers:
    assert f"warm start from {newest}: model weights; update 0" in worker.err
  with open(os.path.join(output_dir, "hparams.json")) as f:
    assert json.load(f)["warm_started_from"] == os.path.abspath(newest)
  with open(os.path.join(output_dir, "best", "best.json")) as f:
    best = json.load(f)
  assert best["metric"] == "dev_loss" and best["improved_at"] == 5 and best["update"] in (5, 10)
  # the chief evaluated the moving average (swapped in while the others waited) and kept
  # both evaluations
  assert best["weights"] == "ema" and sorted(e["update"] for e in best["kept"]) == [5, 10]
  assert all("moving average" in line for line in evaluations)
  for entry in best["kept"]:
    assert os.path.isfile(os.path.join(output_dir, "best", entry["checkpoint"] + ".index"))
  assert not os.path.exists(os.path.join(output_dir, "workers"))  # one run directory


def _corrupt_best(output_dir):
  os.makedirs(os.path.join(output_dir, "best"))
  with open(os.path.join(output_dir, "best", "best.json"), "w") as f:
    f.write("{not json")
  return "best.json is unreadable"


@pytest.mark.parametrize("case", ["before_joining", "best_json", "warm_start", "disk_full"])
def test_an_error_on_one_worker_stops_every_worker_with_one_line(tiny_run, tmp_path, case):
  """The worker that fails says why (exit 2 for a usage error, 1 for a failed run); the
  other says which worker stopped it and why (exit 1); no traceback, no hang."""
  output_dir = str(tmp_path / "run")
  flags = flags_for(tiny_run["data_dir"], output_dir, "--train_steps=4")
  env, failing, code, more = {}, 0, 2, {}
  if case == "before_joining":  # a flag of worker 1 alone, refused before TensorFlow starts
    failing, more = 1, {1: ["--local_eval_frequency=0", "--eval_beam_size=4"]}
    cause = "is read only with evaluations (--local_eval_frequency > 0)"
  elif case == "best_json":  # read by the chief alone, for evaluation
    cause = _corrupt_best(output_dir)
  elif case == "warm_start":  # resolved by the chief alone
    flags.append(f"--warm_start_from={tmp_path / 'no_such_run'}")
    cause = "is neither a run directory nor a checkpoint prefix"
  else:  # a full disk at worker 1's first save
    env, failing, code = {1: {"T2T_LITE_FAULT": "nospace:1"}}, 1, 1
    cause = "No space left on device"
  workers = wait(start_workers(flags, env, flags_by_worker=more))
  for index, worker in enumerate(workers):
    assert "Traceback" not in worker.err, worker.err[-3000:]
    last = worker.lines[-1]
    if index == failing:
      assert worker.process.returncode == code, worker.err[-3000:]
      assert last.startswith(f"{PROGRAM}: error: worker-{index}: ") and cause in last, last
    else:
      assert worker.process.returncode == 1, worker.err[-3000:]
      assert last.startswith(f"{PROGRAM}: error: worker-{index}: stopped because "
                             f"worker-{failing} failed: ") and cause in last, last
  assert abs(workers[0].ended - workers[1].ended) < 60
