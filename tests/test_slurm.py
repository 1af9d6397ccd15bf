"""The repository's sbatch script on a real Slurm cluster (one host, two tasks): training,
a stop by `scancel --signal=TERM`, and a resubmission that resumes exactly.

`make test` run as root starts the cluster first (data_scripts/slurm_local_up.sh) and then
expects it, as CI (.ci/run) does: with T2T_LITE_SLURM_EXPECTED set, a Slurm that cannot be
reached fails the test. Elsewhere (a contributor's laptop) the test skips, saying how to
start one.
"""

import os
import re
import shutil
import socket
import subprocess
import time

import numpy as np
import pytest
import tensorflow as tf

from conftest import BIN, NO_EVAL_FLAGS, REPO, TINY_HPARAMS, cli

SCRIPT = os.path.join(REPO, "data_scripts", "slurm_transformer_base.sbatch")


EXPECTED = "T2T_LITE_SLURM_EXPECTED"


def _missing(why: str):
  """A Slurm that is expected (see the module docstring) fails the test; otherwise it skips."""
  message = f"{why}: start a one-host Slurm with `sudo bash data_scripts/slurm_local_up.sh`"
  if os.environ.get(EXPECTED):
    pytest.fail(f"{message} ({EXPECTED} is set: a cluster was expected)")
  pytest.skip(message)


@pytest.fixture(scope="module")
def slurm():
  """The environment to submit jobs with (see _missing when there is no cluster)."""
  if shutil.which("sbatch") is None:
    _missing("sbatch is not installed")
  states = ""
  for _ in range(30):
    result = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True)
    states = result.stdout.split()
    if "idle" in states or "mixed" in states:
      break
    time.sleep(1)
  else:
    _missing(f"no Slurm node is idle (sinfo: {states or result.stderr.strip()})")
  # The job inherits this environment: the installed programs first on its PATH.
  return dict(os.environ, PATH=BIN + os.pathsep + os.environ["PATH"])


def _port_pair() -> int:
  for _ in range(100):
    with socket.socket() as s:
      s.bind(("127.0.0.1", 0))
      port = s.getsockname()[1]
    try:
      with socket.socket() as s:
        s.bind(("127.0.0.1", port + 1))
      return port
    except OSError:
      continue
  raise AssertionError("no two consecutive free ports")


def _submit(slurm, log, data_dir, output_dir, *flags, wait=False):
  """sbatch of the repository's script on 2 tasks of this node, its GPU request overridden
  (this cluster has none); the job's id."""
  args = ["sbatch", "--parsable", "--gres=none", "--nodes=1", "--ntasks=2",
          "--ntasks-per-node=2", f"--output={log}", "--time=10", SCRIPT, data_dir, output_dir,
          *NO_EVAL_FLAGS, f"--slurm_port_base={_port_pair()}", *flags]
  result = subprocess.run(args, capture_output=True, text=True, env=slurm, timeout=60)
  assert result.returncode == 0, result.stderr
  job = result.stdout.strip().split(";")[0]
  if wait:  # as sbatch --wait, which polls only every few seconds
    _wait_for(job)
    state = subprocess.run(["scontrol", "show", "job", job], capture_output=True,
                           text=True).stdout
    with open(log) as f:
      assert "JobState=COMPLETED" in state or "Invalid job id" in state, f.read()[-3000:]
  return job


def _wait_for(job, timeout=240):
  deadline = time.monotonic() + timeout
  while subprocess.run(["squeue", "-h", "-j", job], capture_output=True,
                       text=True).stdout.strip():
    assert time.monotonic() < deadline, f"job {job} did not end"
    time.sleep(0.2)


def _model_values(directory):
  path = tf.train.latest_checkpoint(directory)
  return {name: tf.train.load_checkpoint(path).get_tensor(name)
          for name, _ in tf.train.list_variables(path)
          if name.startswith("model/") and name.endswith("VARIABLE_VALUE")}


def test_sbatch_trains_stops_on_scancel_and_resumes_exactly(slurm, multi30k_data, tmp_path):
  output_dir, log = str(tmp_path / "run"), str(tmp_path / "first.log")
  job = _submit(slurm, log, multi30k_data, output_dir, "--train_steps=100000",
                "--save_checkpoints_steps=2")
  deadline = time.monotonic() + 180
  while not os.path.exists(os.path.join(output_dir, "checkpoint")):
    assert time.monotonic() < deadline, open(log).read()[-3000:] if os.path.exists(log) else ""
    time.sleep(0.2)
  subprocess.run(["scancel", "--signal=TERM", job], check=True)
  _wait_for(job)
  with open(log) as f:
    first = f.read()
  # both tasks stop at the same update (a task whose SIGTERM came a moment after the other's
  # may already be stopping on the other's)
  stopped = re.findall(r"trained (\d+) updates \((\d+) micro-steps\) in \S+: (signal 15|a "
                       r"stop signal on another worker)", first)
  assert len(stopped) == 2 and stopped[0][:2] == stopped[1][:2], first[-3000:]
  assert "signal 15" in {reason for _, _, reason in stopped}
  updates = int(stopped[0][0])
  assert 2 <= updates < 100000
  assert "Traceback" not in first
  # only the chief writes the run: checkpoints and summaries, in one run directory
  assert os.path.basename(tf.train.latest_checkpoint(output_dir)) == f"ckpt-{updates * 4}"
  assert "workers" not in os.listdir(output_dir)

  _submit(slurm, str(tmp_path / "second.log"), multi30k_data, output_dir,
          f"--train_steps={updates + 2}", wait=True)
  with open(tmp_path / "second.log") as f:
    second = f.read()
  assert second.count("resumed from ") == 2, second[-3000:]
  assert second.count(f"trained {updates + 2} updates") == 2, second[-3000:]

  # The unbroken run: one process reading the same stream, 2 x 2 micro-batches an update
  # (2 tasks x n = 2 read batches 4u..4u+3 of update u, as one replica with n = 4 does)
  unbroken = str(tmp_path / "unbroken")
  one_process = [f"--hparams={TINY_HPARAMS},optimizer_multistep_accumulate_steps=4"
                 if flag.startswith("--hparams=") else flag for flag in NO_EVAL_FLAGS]
  cli("t2t-lite-trainer", *one_process, f"--data_dir={multi30k_data}",
      f"--output_dir={unbroken}", f"--train_steps={updates + 2}", check=True)
  expected, got = _model_values(unbroken), _model_values(output_dir)
  assert expected.keys() == got.keys() and len(got) > 20
  scale = max(float(np.abs(v).max()) for v in expected.values())
  assert max(float(np.abs(expected[k] - got[k]).max()) for k in expected) / scale < 1e-5
