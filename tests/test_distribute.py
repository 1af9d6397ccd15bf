"""tf.distribute: replica-local accumulation is exact; multi-worker matches one process."""

import json
import os
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

import forkserver
from conftest import (BIN, NO_EVAL_FLAGS, REPO, cli, popen, corpus_state, finish, free_ports,
                      start_workers, wait)
from t2t_lite.core import registry
from t2t_lite.core.errors import UsageError
from t2t_lite.training.steps import run_steps

TESTS = os.path.join(REPO, "tests")


def test_two_mirrored_replicas_equal_one_replica_with_double_batches():
  """2 replicas x n=2, 1 x n=4 and 1 x n=1 with 4 times the batch: the same weights and the
  same moving average of them."""
  result = forkserver.run([sys.executable, os.path.join(TESTS, "mirrored_check.py"), TESTS],
                          timeout=300)
  assert result.returncode == 0, result.stderr[-3000:]
  figures = json.loads(result.stdout.strip().splitlines()[-1])
  assert figures["replicas"] == 2 and figures["updates"] == [3, 3, 3], figures
  keys = ("average_two_n2", "average_four", "weights_two_n2", "weights_four")
  assert max(figures[key] for key in keys) < 1e-5, figures
  # and not trivially: the average is far from the weights
  assert figures["average_from_weights"] > 10 * max(figures[key] for key in keys), figures
  # Adam runs on both devices, each on its own copy: one fused kernel per variable each.
  devices = sorted(figures["apply_ops"])
  assert [d.rsplit(":", 2)[-2:] for d in devices] == [["CPU", "0"], ["CPU", "1"]], figures
  assert set(figures["apply_ops"].values()) == {figures["variables"]}, figures


def _final_values(output_dir, name=None):
  """The model's values and their moving average in checkpoint `name` of `output_dir`
  (default: the newest)."""
  path = os.path.join(output_dir, name) if name else tf.train.latest_checkpoint(output_dir)
  reader = tf.train.load_checkpoint(path)
  return {name: reader.get_tensor(name) for name, _ in tf.train.list_variables(path)
          if name.startswith(("model/", "ema/")) and name.endswith("VARIABLE_VALUE")}


def _trainer(*args, env=None):
  return popen([os.path.join(BIN, "t2t-lite-trainer"), *args], env=env,
               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _finish(processes):
  outputs = [p.communicate(timeout=240) for p in processes]
  for process, (_, err) in zip(processes, outputs):
    assert process.returncode == 0, err[-3000:]
  return outputs


CURRICULUM = "flickr:3/other:1;flickr:1/other:3@1"


def _flags(data_dir, corpora=True):
  """On data with sampled segmentations, read from update 3 on (micro-step 4 at n = 2), with
  a moving average of the weights; with `corpora`, of two corpora (conftest's mixed_data)
  weighed 3:1 in update 1 and 1:3 after."""
  weights = f",corpus_weights={CURRICULUM}" if corpora else ""
  return [f"{flag},subword_sampling_start=2,ema_decay=0.9,ema_reference_tokens=3000{weights}"
          if flag.startswith("--hparams=") else flag
          for flag in NO_EVAL_FLAGS] + [f"--data_dir={data_dir}"]


@pytest.fixture(scope="module")
def two_worker_run(mixed_data, tmp_path_factory):
  """3 updates (n=2) by 2 worker processes over TF_CONFIG, saving after each (ckpt-4, 8 and
  12, named by the micro-batches of both), and 4 by one process with 2 mirrored replicas
  (saving after each too: the unbroken run of the moves below), run side by side; the third
  update reads the sampled segmentations, the second on the corpora's other weights (see
  _flags)."""
  sampled_data = mixed_data
  root = tmp_path_factory.mktemp("two_workers")
  mirrored_dir, workers_dir = str(root / "mirrored"), str(root / "workers")
  flags = _flags(sampled_data)
  cluster = {"worker": [f"127.0.0.1:{p}" for p in free_ports(2)]}
  processes = [_trainer(*flags, "--train_steps=4", "--strategy=mirrored", "--cpu_replicas=2",
                        "--save_checkpoints_steps=1", f"--output_dir={mirrored_dir}")]
  for index in range(2):
    env = dict(os.environ, TF_CONFIG=json.dumps(
        {"cluster": cluster, "task": {"type": "worker", "index": index}}))
    processes.append(_trainer(*flags, "--train_steps=3", "--strategy=multi_worker",
                              "--save_checkpoints_steps=1", f"--output_dir={workers_dir}",
                              env=env))
  outputs = _finish(processes)
  return {"mirrored_dir": mirrored_dir, "workers_dir": workers_dir, "outputs": outputs,
          "data_dir": sampled_data}


def test_two_workers_match_two_mirrored_replicas(two_worker_run):
  mirrored_out, chief_out = two_worker_run["outputs"][0][0], two_worker_run["outputs"][1][0]
  assert "replicas: 2" in mirrored_out and "replicas: 2" in chief_out
  # one packed all-reduce per update, not one per variable (30 here: one layer a stack)
  for _, err in two_worker_run["outputs"][1:]:
    assert "cross-replica sum per update: 33 tensors in 1 collective all-reduce op(s)" in err
  for out, err in two_worker_run["outputs"]:  # and all read the sampled ones from update 3
    assert "training segmentations: the one best in updates 1-2, sampled ones after" in out
    assert err.count("update 3: training reads the sampled segmentations from here on") == 1
  workers_dir = two_worker_run["workers_dir"]
  mirrored = _final_values(two_worker_run["mirrored_dir"], "ckpt-12")
  workers = _final_values(workers_dir)
  assert mirrored.keys() == workers.keys() and len(mirrored) > 20
  assert sum(k.startswith("ema/average_of/") for k in mirrored) == sum(
      k.startswith("model/") for k in mirrored)
  scale = max(np.abs(v).max() for v in mirrored.values())
  worst = max(np.abs(mirrored[k] - workers[k]).max() for k in mirrored) / scale
  assert worst < 1e-5, worst
  assert corpus_state(workers_dir) == corpus_state(two_worker_run["mirrored_dir"], "ckpt-12")
  written = sorted(os.listdir(workers_dir))
  assert {"ckpt-8.index", "ckpt-12.index", "hparams.json", "train"} <= set(written)
  assert "eval" not in written  # no evaluation asked for, no empty summaries
  # one run directory: the other worker keeps no checkpoints of its own, nor a marker
  assert "workers" not in written and not [n for n in written if n.startswith(".t2t-lite")]
  # each worker read only its own 6 of the stream's 12 micro-batches: together the examples
  # of those 12 (the mirrored process read 16, in 4 updates)
  counts = [_examples_read(err) for _, err in two_worker_run["outputs"]]
  assert counts[0][1:] == (16, 2) and counts[1][1:] == counts[2][1:] == (6, 1), counts
  assert counts[1][0] + counts[2][0] == _stream_examples(two_worker_run["data_dir"], 12)
  assert min(counts[1][0], counts[2][0]) > 0


def _stream_examples(data_dir, batches):
  """The examples in the first `batches` micro-batches of _flags's training stream."""
  from conftest import tiny_hparams
  from t2t_lite.data.curriculum import Curriculum
  from t2t_lite.data.mixing import corpus_splits
  from t2t_lite.data.stream import Batching
  from t2t_lite.data.mixing import MixedStream
  snapshot = registry.problem("translate_ende_multi30k").snapshot(data_dir)
  stores = [[snapshot.store(split) for split in corpus_splits(c, ["train", "train_sampled"])]
            for c in snapshot.corpora]
  stream = MixedStream(stores, Curriculum.of(CURRICULUM, snapshot.corpora),
                       Batching.of(tiny_hparams()), 7, 1, [0])
  for micro_step in range(batches):  # the sampled split from update 3: micro-batch 8
    stream.micro_batches(micro_step, sampled_from=8, update=micro_step // 4 + 1)
  stream.close()
  return stream.examples_read


def _examples_read(err):
  """(examples, micro-batches, local replicas) of the trainer's closing input line."""
  found = re.search(r"input: this process read (\d+) examples in (\d+) micro-batches of the "
                    r"training stream \(its (\d+) of \d+ replicas\)", err)
  assert found, err[-2000:]
  return tuple(int(x) for x in found.groups())


def _two_workers(data_dir, output_dir, train_steps):
  cluster = {"worker": [f"127.0.0.1:{p}" for p in free_ports(2)]}
  processes = []
  for index in range(2):
    env = dict(os.environ, TF_CONFIG=json.dumps(
        {"cluster": cluster, "task": {"type": "worker", "index": index}}))
    processes.append(_trainer(*_flags(data_dir), f"--train_steps={train_steps}",
                              "--strategy=multi_worker", f"--output_dir={output_dir}", env=env))
  return [(p, *p.communicate(timeout=240)) for p in processes]


def _remove_checkpoint(directory, name, state_too=False):
  for file in os.listdir(directory):
    if file.startswith(name + ".") or (state_too and file == "checkpoint"):
      os.remove(os.path.join(directory, file))


def test_workers_that_differ_or_share_no_output_dir_are_refused(sampled_data,
                                                                 multi30k_data, tmp_path):
  """A worker with another --train_steps and another vocabulary: both workers stop before
  training with one line naming both; a worker whose --output_dir is not the chief's (no
  shared filesystem) likewise."""
  output_dir = str(tmp_path / "run")
  flags = [flag for flag in _flags(sampled_data, corpora=False)
           if not flag.startswith("--data_dir")]
  other = {1: [f"--data_dir={multi30k_data}", "--train_steps=4"]}
  for worker in wait(start_workers([*flags, f"--output_dir={output_dir}"],
                                   flags_by_worker={0: [f"--data_dir={sampled_data}",
                                                        "--train_steps=3"], **other})):
    assert worker.process.returncode == 2, worker.err[-3000:]
    assert "Traceback" not in worker.err
    assert re.fullmatch(r"t2t-lite-trainer: error: worker-\d: the workers differ in --train_steps, "
                        r"the data \(its manifest\) \(this worker: --train_steps=\d; the data "
                        r"\(its manifest\)=[0-9a-f]{64}\); start every worker with the same "
                        r"flags, hparams, data and program", worker.lines[-1]), worker.lines[-1]
  assert not os.path.exists(os.path.join(output_dir, "hparams.json"))
  elsewhere = {1: [f"--output_dir={tmp_path / 'elsewhere'}"]}
  for index, worker in enumerate(wait(start_workers(
      [*flags, f"--data_dir={sampled_data}", "--train_steps=3"],
      flags_by_worker={0: [f"--output_dir={output_dir}"], **elsewhere}))):
    assert worker.process.returncode == 2, worker.err[-3000:]
    assert worker.lines[-1] == (
        f"t2t-lite-trainer: error: worker-{index}: "
        f"{'this' if index else 'another'} worker cannot see the files the chief writes in "
        f"--output_dir={output_dir if index == 0 else tmp_path / 'elsewhere'}; every worker "
        "resumes from the chief's checkpoints, so --output_dir must be on a filesystem all "
        "workers share"), worker.lines[-1]


def test_a_signal_to_one_worker_the_loss_of_another_and_moves_to_4_workers_and_1_process(
    two_worker_run, mixed_data, tmp_path):
  """SIGTERM reaches worker 1 only (in update 1): both stop together after update 2 and
  save. Resumed, worker 1 is SIGKILLed in update 3: worker 0 exits with one line naming it,
  within 60 s. The run then moves, with the same tokens per update, to 4 workers (n = 1)
  for update 3 (a stale workers/ folder of an earlier version beside it, which neither rolls
  it back nor is touched) and to one process (n = 4) for update 4, and ends where a run of 2
  mirrored replicas never stopped or moved ends; each of the 4 workers read 1 of the
  update's 4 micro-batches."""
  output_dir = str(tmp_path / "run")
  flags = [*_flags(mixed_data), "--train_steps=3", "--save_checkpoints_steps=1",
           f"--output_dir={output_dir}"]
  chief, other = finish(start_workers(flags, {1: {"T2T_LITE_FAULT": "signal:1"}}))
  for worker in (chief, other):
    assert "trained 2 updates (4 micro-steps)" in worker.out, worker.out
  assert "a stop signal on another worker" in chief.out and "signal 15" in other.out
  assert os.path.basename(tf.train.latest_checkpoint(output_dir)) == "ckpt-8"

  chief, other = wait(start_workers(flags, {1: {"T2T_LITE_FAULT": "micro:5"}}))
  assert other.process.returncode == -9
  assert chief.process.returncode == 1, chief.err[-3000:]
  assert "Traceback" not in chief.err
  assert chief.lines[-1].startswith("t2t-lite-trainer: error: worker-0: stopped because "
                                    "worker-1 went away"), chief.lines[-1]
  assert chief.ended - other.ended < 60

  # A run of an earlier version kept the other workers' checkpoints in workers/<task>: an
  # old one there (ckpt-4) does not pull the run back, and the folder is left as it was.
  stale = os.path.join(output_dir, "workers", "worker-1")
  os.makedirs(stale)
  for name in os.listdir(output_dir):
    if name.startswith("ckpt-4."):
      shutil.copy(os.path.join(output_dir, name), stale)
  before = sorted(os.listdir(stale))
  one_step = [f"{flag},optimizer_multistep_accumulate_steps=1" if flag.startswith("--hparams=")
              else flag for flag in flags]
  for worker in finish(start_workers(one_step, count=4)):
    assert f"resumed from {output_dir}/ckpt-8: update 2" in worker.err, worker.err[-3000:]
    assert "resumed on another layout: from 2 replicas x 2 micro-steps per update to 4 " \
           "replicas x 1 micro-step per update" in worker.err
    assert _examples_read(worker.err)[1:] == (1, 1)
  assert sorted(os.listdir(stale)) == before
  four_steps = [f"{flag},optimizer_multistep_accumulate_steps=4"
                if flag.startswith("--hparams=") else flag for flag in flags
                if not flag.startswith("--train_steps")]
  cli("t2t-lite-trainer", *four_steps, "--train_steps=4", check=True)
  expected, got = _final_values(two_worker_run["mirrored_dir"]), _final_values(output_dir)
  scale = max(float(np.abs(v).max()) for v in expected.values())
  assert max(float(np.abs(expected[k] - got[k]).max()) for k in expected) / scale < 1e-5
  assert corpus_state(output_dir) == corpus_state(two_worker_run["mirrored_dir"])


def test_dry_run_replicas_under_slurm_are_tasks_times_gpus_per_task(monkeypatch):
  from t2t_lite.cluster import distribute
  monkeypatch.delenv("TF_CONFIG", raising=False)
  monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
  monkeypatch.setattr(tf.config, "list_physical_devices",
                      lambda kind=None: ["gpu"] * 8 if kind == "GPU" else [])
  monkeypatch.setenv("SLURM_JOB_ID", "7")
  for tasks, per_node, replicas in (("2", "1(x2)", 16), ("8", "4(x2)", 16), ("16", "8(x2)", 16),
                                    ("3", "2,1", 12)):
    monkeypatch.setenv("SLURM_NTASKS", tasks)
    monkeypatch.setenv("SLURM_TASKS_PER_NODE", per_node)
    assert distribute.planned_replicas("multi_worker") == replicas, (tasks, per_node)
  monkeypatch.setattr(tf.config, "list_physical_devices", lambda kind=None: [])
  assert distribute.planned_replicas("multi_worker") == 3  # CPU nodes: one replica a task


def _slurm_step(monkeypatch, **extra):
  from t2t_lite.cluster import distribute
  monkeypatch.delenv("TF_CONFIG", raising=False)
  monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
  for name, value in dict(SLURM_JOB_ID="7", SLURM_PROCID="1", SLURM_STEP_NUM_TASKS="4",
                          SLURM_STEP_NODELIST="node[01-02]",
                          SLURM_STEP_TASKS_PER_NODE="2(x2)", **extra).items():
    monkeypatch.setenv(name, value)
  distribute.cluster_resolver.cache_clear()
  return distribute


def test_slurm_step_resolves_to_workers_on_cpu_nodes(monkeypatch):
  distribute = _slurm_step(monkeypatch)
  monkeypatch.setattr(distribute.shutil, "which", lambda name: None)  # no nvidia-smi
  resolver = distribute.cluster_resolver(9000)
  assert resolver.cluster_spec().as_dict() == {"worker": [
      "node01:9000", "node01:9001", "node02:9000", "node02:9001"]}
  assert (resolver.task_type, resolver.task_id) == ("worker", 1)
  assert "CUDA_VISIBLE_DEVICES" not in os.environ
  distribute.cluster_resolver.cache_clear()


def test_slurm_tasks_of_a_node_split_its_gpus(monkeypatch):
  distribute = _slurm_step(monkeypatch, CUDA_VISIBLE_DEVICES="0,1,2,3")
  distribute.cluster_resolver(9000)
  assert os.environ["CUDA_VISIBLE_DEVICES"] == "2,3"  # task 1 of node01
  monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")  # two tasks, one GPU
  distribute.cluster_resolver.cache_clear()
  with pytest.raises(UsageError, match="cannot split this node's 1 GPU"):
    distribute.cluster_resolver(9000)
  distribute.cluster_resolver.cache_clear()


@pytest.mark.parametrize("missing", ["SLURM_PROCID", "SLURM_STEP_NODELIST"])
def test_slurm_outside_a_job_step_is_a_usage_error(monkeypatch, missing):
  distribute = _slurm_step(monkeypatch)
  monkeypatch.delenv(missing)
  with pytest.raises(UsageError, match=f"needs {missing}: start the trainer with srun"):
    distribute.cluster_resolver(9000)
  distribute.cluster_resolver.cache_clear()


def test_effective_batch_tokens_derives_accumulate_steps():
  hparams = registry.hparams("transformer_base")
  hparams.effective_batch_tokens = 32768
  one_gpu = run_steps(hparams, replicas=1, train_steps=10)
  assert one_gpu.accumulate_steps == 8 and one_gpu.tokens_per_update == 32768
  assert "derived from effective_batch_tokens=32768" in "\n".join(one_gpu.lines())
  assert run_steps(hparams, replicas=8, train_steps=10).accumulate_steps == 1
  assert run_steps(hparams, replicas=4, train_steps=10).accumulate_steps == 2
  hparams.effective_batch_tokens = 20000
  with pytest.raises(UsageError, match="effective_batch_tokens=20000 is not a multiple of "
                     r"batch_size x replicas = 4096 x 1 = 4096; use 16384 or 20480"):
    run_steps(hparams, replicas=1, train_steps=10)
  hparams.effective_batch_tokens = 2048
  with pytest.raises(UsageError, match="use 4096 or 8192"):
    run_steps(hparams, replicas=1, train_steps=10)


def test_effective_batch_in_the_dry_run():
  out = cli("t2t-lite-trainer", "--hparams_set=transformer_base",
            "--hparams=effective_batch_tokens=32768", "--train_steps=10", "--dry_run",
            check=True).stdout
  assert "accumulate steps (micro-steps per update): 8" in out
  assert "derived from effective_batch_tokens=32768 / (4096 x 1 replicas)" in out
  assert "tokens per update: 32768 (= 4096 x 8 x 1)" in out
