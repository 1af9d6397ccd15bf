"""Two workers on localhost (TF_CONFIG), doing what real runs do: evaluate, stop early, warm
start, get signals, lose a worker, fail on one worker only."""

import json
import os
import signal
import subprocess
import time

import numpy as np
import pytest
import tensorflow as tf

from conftest import BIN, TINY_FLAGS, cli

PROGRAM = "t2t-lite-trainer"


def _free_ports(count):
  import socket
  sockets = [socket.socket() for _ in range(count)]
  for s in sockets:
    s.bind(("127.0.0.1", 0))
  ports = [s.getsockname()[1] for s in sockets]
  for s in sockets:
    s.close()
  return ports


class Worker:
  def __init__(self, process):
    self.process, self.ended = process, None
    self.out = self.err = ""

  @property
  def lines(self):
    return [line for line in self.err.splitlines() if line.strip()]


def start_workers(flags, env_by_worker=None, count=2):
  """`count` trainer processes forming one cluster over TF_CONFIG on 127.0.0.1."""
  cluster = {"worker": [f"127.0.0.1:{p}" for p in _free_ports(count)]}
  workers = []
  for index in range(count):
    env = dict(os.environ, TF_CONFIG=json.dumps(
        {"cluster": cluster, "task": {"type": "worker", "index": index}}))
    env.pop("T2T_LITE_FAULT", None)
    env.update((env_by_worker or {}).get(index, {}))
    workers.append(Worker(subprocess.Popen(
        [os.path.join(BIN, PROGRAM), "--strategy=multi_worker", *flags], env=env,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)))
  return workers


def wait(workers, timeout=240):
  """Waits for every worker; records when each ended (time.monotonic)."""
  deadline = time.monotonic() + timeout
  pending = list(workers)
  while pending:
    for worker in list(pending):
      if worker.process.poll() is not None:
        worker.ended = time.monotonic()
        pending.remove(worker)
    if time.monotonic() > deadline:
      for worker in pending:
        worker.process.kill()
      raise AssertionError("workers did not finish in time")
    time.sleep(0.1)
  for worker in workers:
    worker.out, worker.err = worker.process.communicate()
  return workers


def finish(workers):
  for index, worker in enumerate(wait(workers)):
    assert worker.process.returncode == 0, f"worker {index}:\n{worker.err[-3000:]}"
  return workers


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
  """Evaluations with BLEU at updates 5 and 10, which are not log (every 4) or save updates:
  every worker reads the window there (the crash was only the chief reading it). Dev loss
  cannot improve by 100, so early stopping ends the run at update 10 on both workers. Both
  started from the one checkpoint the chief resolved and end with equal weights."""
  output_dir = str(tmp_path / "run")
  source = tiny_run["output_dir"]
  workers = finish(start_workers(flags_for(
      tiny_run["data_dir"], output_dir, "--train_steps=12", "--local_eval_frequency=5",
      "--log_every=4", "--eval_steps=2", "--eval_bleu_sentences=8",
      "--save_checkpoints_steps=0", "--eval_early_stopping_steps=5",
      "--eval_early_stopping_metric_delta=100", f"--warm_start_from={source}")))
  chief, other = workers
  evaluations = [line for line in chief.lines if "eval at update" in line]
  assert [line.split("eval at update ")[1].split(":")[0] for line in evaluations] == ["5", "10"]
  assert all("dev_loss" in line and "dev_perplexity" in line and "dev_bleu" in line
             for line in evaluations)
  assert not any("eval at update" in line for line in other.lines)  # the chief evaluates
  # the others leave before the chief, whose process holds the coordination service
  assert "coordination service" not in other.err, other.err[-2000:]
  assert "trained 10 updates (20 micro-steps)" in chief.out, chief.out
  assert "early stopping: dev_loss has not improved by more than 100 for 5 updates" in chief.out
  assert "trained 10 updates (20 micro-steps)" in other.out, other.out
  assert "early stopping, by the chief's evaluation" in other.out
  for worker in workers:
    assert [line.split("update ")[1].split("/")[0] for line in worker.lines
            if "/12 (micro-step" in line] == ["4", "8"]
  newest = os.path.join(source, os.path.basename(tf.train.latest_checkpoint(source)))
  for worker in workers:
    assert f"warm start from {newest}: model weights; update 0" in worker.err
  with open(os.path.join(output_dir, "hparams.json")) as f:
    assert json.load(f)["warm_started_from"] == os.path.abspath(newest)
  with open(os.path.join(output_dir, "best", "best.json")) as f:
    best = json.load(f)
  assert best["metric"] == "dev_loss" and best["improved_at"] == 5 and best["update"] in (5, 10)
  assert relative_difference(model_values(output_dir), model_values(
      os.path.join(output_dir, "workers", "worker-1"))) == 0.0


@pytest.fixture(scope="module")
def unbroken(tiny_run, tmp_path_factory):
  """4 updates by 2 mirrored replicas in one process: what the pair below must end with."""
  output_dir = str(tmp_path_factory.mktemp("unbroken") / "run")
  cli(PROGRAM, *flags_for(tiny_run["data_dir"], output_dir, "--train_steps=4",
                          "--local_eval_frequency=0", "--strategy=mirrored",
                          "--cpu_replicas=2"), check=True)
  return model_values(output_dir)


def test_a_signal_to_one_worker_and_the_loss_of_another(tiny_run, unbroken, tmp_path):
  """SIGTERM reaches worker 1 only (in update 2): both stop together after update 3 and
  save. Resumed, worker 1 is SIGKILLed in update 4: worker 0 exits with one line naming it,
  within 60 s. Resumed again, the pair ends where an unbroken run ends."""
  output_dir = str(tmp_path / "run")
  flags = flags_for(tiny_run["data_dir"], output_dir, "--train_steps=4",
                    "--local_eval_frequency=0")
  chief, other = finish(start_workers(flags, {1: {"T2T_LITE_FAULT": "signal:3"}}))
  for worker in (chief, other):
    assert "trained 3 updates (6 micro-steps)" in worker.out, worker.out
  assert "a stop signal on another worker" in chief.out and "signal 15" in other.out
  assert os.path.basename(tf.train.latest_checkpoint(output_dir)) == "ckpt-12"

  chief, other = wait(start_workers(flags, {1: {"T2T_LITE_FAULT": "micro:7"}}))
  assert other.process.returncode == -signal.SIGKILL
  assert chief.process.returncode == 1, chief.err[-3000:]
  assert "Traceback" not in chief.err
  assert chief.lines[-1].startswith(f"{PROGRAM}: error: worker-0: stopped because worker-1 "
                                    "went away"), chief.lines[-1]
  assert chief.ended - other.ended < 60

  finish(start_workers(flags))
  assert relative_difference(model_values(output_dir), unbroken) < 1e-5


def _corrupt_best(output_dir):
  os.makedirs(os.path.join(output_dir, "best"))
  with open(os.path.join(output_dir, "best", "best.json"), "w") as f:
    f.write("{not json")
  return "best.json is unreadable"


@pytest.mark.parametrize("case", ["best_json", "warm_start", "disk_full"])
def test_an_error_on_one_worker_stops_every_worker_with_one_line(tiny_run, tmp_path, case):
  """The worker that fails says why (exit 2 for a usage error, 1 for a failed run); the
  other says which worker stopped it and why (exit 1); no traceback, no hang."""
  output_dir = str(tmp_path / "run")
  flags = flags_for(tiny_run["data_dir"], output_dir, "--train_steps=4")
  env, failing, code = {}, 0, 2
  if case == "best_json":  # read by the chief alone, for evaluation
    cause = _corrupt_best(output_dir)
  elif case == "warm_start":  # resolved by the chief alone
    flags.append(f"--warm_start_from={tmp_path / 'no_such_run'}")
    cause = "is neither a run directory nor a checkpoint prefix"
  else:  # a full disk at worker 1's first save
    env, failing, code = {1: {"T2T_LITE_FAULT": "nospace:1"}}, 1, 1
    cause = "No space left on device"
  workers = wait(start_workers(flags, env))
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
