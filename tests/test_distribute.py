"""tf.distribute: replica-local accumulation is exact; multi-worker matches one process."""

import json
import os
import socket
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from conftest import BIN, REPO, TINY_FLAGS, cli
from t2t_lite import registry
from t2t_lite.errors import UsageError
from t2t_lite.steps import plan

TESTS = os.path.join(REPO, "tests")


def test_two_mirrored_replicas_equal_one_replica_with_double_batches():
  result = subprocess.run([sys.executable, os.path.join(TESTS, "mirrored_check.py"), TESTS],
                          capture_output=True, text=True, timeout=300)
  assert result.returncode == 0, result.stderr[-3000:]
  figures = json.loads(result.stdout.strip().splitlines()[-1])
  assert figures["replicas"] == 2 and figures["updates"] == 3
  assert figures["relative_difference"] < 1e-5, figures


def _free_ports(count):
  sockets = [socket.socket() for _ in range(count)]
  for s in sockets:
    s.bind(("127.0.0.1", 0))
  ports = [s.getsockname()[1] for s in sockets]
  for s in sockets:
    s.close()
  return ports


def _final_values(output_dir):
  reader = tf.train.load_checkpoint(tf.train.latest_checkpoint(output_dir))
  return {name: reader.get_tensor(name) for name, _ in tf.train.list_variables(
      tf.train.latest_checkpoint(output_dir))
          if name.startswith("model/") and name.endswith("VARIABLE_VALUE")}


def test_two_workers_match_two_mirrored_replicas(multi30k_data, tmp_path):
  flags = TINY_FLAGS + [f"--data_dir={multi30k_data}", "--train_steps=2",
                        "--local_eval_frequency=0"]
  mirrored_dir = str(tmp_path / "mirrored")
  cli("t2t-lite-trainer", *flags, "--strategy=mirrored", "--cpu_replicas=2",
      f"--output_dir={mirrored_dir}", check=True)

  workers_dir = str(tmp_path / "workers")
  ports = _free_ports(2)
  cluster = {"worker": [f"127.0.0.1:{p}" for p in ports]}
  processes = []
  for index in range(2):
    env = dict(os.environ, TF_CONFIG=json.dumps(
        {"cluster": cluster, "task": {"type": "worker", "index": index}}))
    processes.append(subprocess.Popen(
        [os.path.join(BIN, "t2t-lite-trainer"), *flags, "--strategy=multi_worker",
         f"--output_dir={workers_dir}"], env=env, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True))
  outputs = [p.communicate(timeout=240) for p in processes]
  for process, (out, err) in zip(processes, outputs):
    assert process.returncode == 0, err[-3000:]
  assert "replicas: 2" in outputs[0][0]

  mirrored, workers = _final_values(mirrored_dir), _final_values(workers_dir)
  assert mirrored.keys() == workers.keys() and len(mirrored) > 20
  scale = max(np.abs(v).max() for v in mirrored.values())
  worst = max(np.abs(mirrored[k] - workers[k]).max() for k in mirrored) / scale
  assert worst < 1e-5, worst
  written = sorted(os.listdir(workers_dir))
  assert "ckpt-4.index" in written and "hparams.json" in written
  # the other worker keeps its own checkpoints (its data iterator) apart from the chief's
  assert sorted(os.listdir(os.path.join(workers_dir, "workers"))) == ["worker-1"]
  assert not os.path.exists(os.path.join(workers_dir, "workers", "worker-1", "train"))

  # Resume both workers for one more update: they continue from their own checkpoints.
  cluster = {"worker": [f"127.0.0.1:{p}" for p in _free_ports(2)]}
  processes = []
  for index in range(2):
    env = dict(os.environ, TF_CONFIG=json.dumps(
        {"cluster": cluster, "task": {"type": "worker", "index": index}}))
    processes.append(subprocess.Popen(
        [os.path.join(BIN, "t2t-lite-trainer"), *flags[:-2], "--train_steps=3",
         "--local_eval_frequency=0", "--strategy=multi_worker", f"--output_dir={workers_dir}"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
  outputs = [p.communicate(timeout=240) for p in processes]
  for process, (out, err) in zip(processes, outputs):
    assert process.returncode == 0, err[-3000:]
    assert "update 2, micro-step 4" in err and "update 3/3 (micro-step 6)" in err


def test_effective_batch_tokens_derives_accumulate_steps():
  hparams = registry.hparams("transformer_base")
  hparams.effective_batch_tokens = 32768
  one_gpu = plan(hparams, replicas=1, train_steps=10)
  assert one_gpu.accumulate_steps == 8 and one_gpu.tokens_per_update == 32768
  assert "derived from effective_batch_tokens=32768" in "\n".join(one_gpu.lines())
  assert plan(hparams, replicas=8, train_steps=10).accumulate_steps == 1
  assert plan(hparams, replicas=4, train_steps=10).accumulate_steps == 2
  hparams.effective_batch_tokens = 20000
  with pytest.raises(UsageError, match="effective_batch_tokens=20000 is not a multiple of "
                     r"batch_size x replicas = 4096 x 1 = 4096; use 16384 or 20480"):
    plan(hparams, replicas=1, train_steps=10)
  hparams.effective_batch_tokens = 2048
  with pytest.raises(UsageError, match="use 4096 or 8192"):
    plan(hparams, replicas=1, train_steps=10)


def test_effective_batch_in_the_dry_run():
  out = cli("t2t-lite-trainer", "--hparams_set=transformer_base",
            "--hparams=effective_batch_tokens=32768", "--train_steps=10", "--dry_run",
            check=True).stdout
  assert "accumulate steps (micro-steps per update): 8" in out
  assert "derived from effective_batch_tokens=32768 / (4096 x 1 replicas)" in out
  assert "tokens per update: 32768 (= 4096 x 8 x 1)" in out
