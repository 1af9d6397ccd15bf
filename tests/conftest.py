"""Shared fixtures: the Multi30k data, prepared once per test run, and CLI helpers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

# The suite runs a test process a core, and most tests start trainer processes beside it: one
# thread each for TensorFlow's kernels keeps them from spinning against each other (about a
# tenth of the suite's time on 2 cores). Set before TensorFlow starts, here and in every
# process the tests start; a value given from outside wins.
os.environ.setdefault("TF_NUM_INTRAOP_THREADS", "1")

import forkserver  # noqa: E402
import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402

# Ampere and newer GPUs run float32 matmuls as TF32 (10-bit mantissa) by default; the
# exactness tests compare float32 paths to 1e-5, so they run in full float32 on any GPU.
tf.config.experimental.enable_tensor_float_32_execution(False)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.dirname(sys.executable)


def multi30k_dir() -> str:
  path = os.environ.get("MULTI30K_DIR") or os.path.join(REPO, "..", "shared", "data", "multi30k")
  if not os.path.isfile(os.path.join(path, "train.en.gz")):
    pytest.fail(f"Multi30k raw files not found in {path}; set MULTI30K_DIR")
  return os.path.abspath(path)


def cli(name: str, *args: str, env: dict | None = None, timeout: int = 300,
        check: bool = False, fresh: bool = False) -> subprocess.CompletedProcess:
  """Runs one of the installed command-line programs; returns the completed process. A
  program of t2t-lite's is forked from a process with TensorFlow imported (tests/forkserver.py)
  unless `fresh`: then it starts as its executable does, which a test of start-up needs."""
  full_env = dict(os.environ, **(env or {}))
  argv = [os.path.join(BIN, name), *args]
  if fresh or name not in forkserver.PROGRAMS:
    result = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=full_env)
  else:
    result = forkserver.run(argv, env=full_env, timeout=timeout)
  if check and result.returncode != 0:
    raise AssertionError(f"{name} {' '.join(args)} exited {result.returncode}:\n"
                         f"{result.stdout}\n{result.stderr[-3000:]}")
  return result


def popen(args, **kwargs):
  """subprocess.Popen(args, **kwargs), forked from the fork server when args[0] is one of
  t2t-lite's programs (see cli)."""
  if os.path.basename(args[0]) in forkserver.PROGRAMS:
    return forkserver.ForkedProcess(args, **kwargs)
  return subprocess.Popen(args, **kwargs)


def shared(tmp_path_factory, name: str, build):
  """What `build(folder)` returns (JSON), built once for the whole test run: pytest-xdist
  runs the tests in several processes, and the first to ask builds it in a folder of the
  run's temporary root that all of them share, while the others wait for it, then read
  it. Tests read what it holds and copy before they change anything."""
  import fcntl
  root = tmp_path_factory.getbasetemp()
  if os.environ.get("PYTEST_XDIST_WORKER"):
    root = root.parent  # (each process's base is a folder of the run's)
  done = root / f"shared-{name}.json"
  with open(root / f"shared-{name}.lock", "w") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    if not done.exists():
      import shutil
      folder = root / f"shared-{name}"
      shutil.rmtree(folder, ignore_errors=True)  # what a failed build left: built again
      folder.mkdir()
      done.write_text(json.dumps(build(folder)))
  return json.loads(done.read_text())


@pytest.fixture(scope="session")
def multi30k_data(tmp_path_factory) -> str:
  """Full Multi30k en-de through t2t-lite-datagen (about 10 s), shared by the test run."""
  def build(folder):
    cli("t2t-lite-datagen", "--problem=translate_ende_multi30k", f"--data_dir={folder}",
        f"--tmp_dir={multi30k_dir()}", check=True)
    return str(folder)
  return shared(tmp_path_factory, "multi30k_ende", build)


@pytest.fixture(scope="session")
def sampled_data(tmp_path_factory) -> str:
  """Multi30k en-de cut to its first 3,000 training pairs (dev and test: 300; the raw
  files in data_dir/raw), through t2t-lite-datagen with 2 sampled segmentations of every
  training pair (SAMPLED_DATAGEN; a few seconds)."""
  import gzip

  def build(folder):
    data_dir = str(folder)
    raw = os.path.join(data_dir, "raw")
    os.makedirs(raw)
    for split, keep in (("train", 3000), ("val", 300), ("test_2016_flickr", 300)):
      for lang in ("en", "de"):
        with gzip.open(os.path.join(multi30k_dir(), f"{split}.{lang}.gz"), "rb") as f:
          lines = f.read().splitlines(keepends=True)[:keep]
        with gzip.open(os.path.join(raw, f"{split}.{lang}.gz"), "wb") as f:
          f.writelines(lines)
    cli("t2t-lite-datagen", *SAMPLED_DATAGEN, f"--data_dir={data_dir}", f"--tmp_dir={raw}",
        check=True)
    return data_dir
  return shared(tmp_path_factory, "sampled_data", build)


@pytest.fixture(scope="session")
def mixed_data(tmp_path_factory) -> str:
  """Two training corpora (MIXED_DATAGEN): Multi30k en-de's first 3,000 pairs as its own
  corpus, "flickr" (weight 3), and pairs 20,000-20,999 as "other" (weight 1, a folder:
  root/other), with 2 sampled segmentations of every pair (dev and test: 200 lines; the raw
  files in root/raw, the data in root/data)."""
  def build(root):
    raw, other = root / "raw", root / "other"
    multi30k_subset(raw, 3000, 200, other, (20000, 21000))
    data_dir = str(root / "data")
    result = cli("t2t-lite-datagen", *MIXED_DATAGEN, f"--corpus=other:1:{other}",
                 f"--data_dir={data_dir}", f"--tmp_dir={raw}", check=True)
    assert ("training corpora, by weight: flickr 3 (75.0% of the batches; 3000 pairs), other "
            "1 (25.0% of the batches; 1000 pairs)") in result.stdout, result.stdout
    return data_dir
  return shared(tmp_path_factory, "mixed_data", build)


def multi30k_subset(raw, train: int, held_out: int, other=None, other_lines=(0, 0)) -> None:
  """Raw Multi30k en-de cut to its first `train` training pairs and `held_out` dev and test
  lines, in folder `raw`; with `other`, training pairs other_lines[0]:other_lines[1] as a
  corpus of its own in that folder (train.en, train.de)."""
  import gzip
  for folder in (raw, other):
    if folder is not None:
      folder.mkdir()
  for split, keep in (("train", train), ("val", held_out), ("test_2016_flickr", held_out)):
    for lang in ("en", "de"):
      with gzip.open(os.path.join(multi30k_dir(), f"{split}.{lang}.gz"), "rb") as f:
        lines = f.read().splitlines(keepends=True)
      with gzip.open(raw / f"{split}.{lang}.gz", "wb") as f:
        f.writelines(lines[:keep])
      if split == "train" and other is not None:
        (other / f"train.{lang}").write_bytes(b"".join(lines[slice(*other_lines)]))


def corpus_state(output_dir: str, name: str | None = None) -> list:
  """[batches read per corpus and segmentation, target tokens per corpus] (nested lists) in
  checkpoint `name` of `output_dir` (default: the newest)."""
  import tensorflow as tf
  path = os.path.join(output_dir, name) if name else tf.train.latest_checkpoint(output_dir)
  reader = tf.train.load_checkpoint(path)
  return [reader.get_tensor(f"{variable}/.ATTRIBUTES/VARIABLE_VALUE").tolist()
          for variable in ("corpus_batches", "corpus_tokens")]


MIXED_DATAGEN = ("--problem=translate_ende_multi30k", "--vocab_size=2000",
                 "--subword_sampling_copies=2", "--subword_sampling_alpha=0.3",
                 "--corpus=flickr:3")
SAMPLED_DATAGEN = ("--problem=translate_ende_multi30k", "--vocab_size=2000",
                   "--subword_sampling_copies=2", "--subword_sampling_alpha=0.3")


def vocab_path(data_dir) -> str:
  """The vocabulary file of Multi30k en-de data in `data_dir`, as its manifest places it."""
  from t2t_lite.core import registry
  return registry.problem("translate_ende_multi30k").vocab_file(str(data_dir))


# transformer_tiny with one layer a stack (a third less start-up per trainer process: the
# suite starts over a hundred) and test-friendly batches.
TINY_HPARAMS = "batch_size=512,max_length=64,num_encoder_layers=1,num_decoder_layers=1"


def tiny_hparams(**overrides):
  """transformer_tiny as TINY_HPARAMS sets it; pass dropout etc. as overrides."""
  from t2t_lite.core import registry
  hparams = registry.hparams("transformer_tiny")
  hparams.parse(TINY_HPARAMS)
  for name, value in overrides.items():
    hparams.set_hparam(name, value)
  return hparams


TINY_FLAGS = ["--problem=translate_ende_multi30k", "--hparams_set=transformer_tiny",
              f"--hparams={TINY_HPARAMS},optimizer_multistep_accumulate_steps=2",
              "--save_checkpoints_steps=2", "--log_every=1", "--local_eval_frequency=4",
              "--eval_steps=2", "--eval_bleu_sentences=16", "--random_seed=7"]
# The same without evaluation (whose flags are refused when there is none).
NO_EVAL_FLAGS = [flag for flag in TINY_FLAGS
                 if not flag.startswith(("--local_eval_frequency", "--eval_"))
                 ] + ["--local_eval_frequency=0"]


@pytest.fixture(scope="session")
def tiny_run(multi30k_data, tmp_path_factory) -> dict:
  """transformer_tiny trained by the real CLI for 4 updates (8 micro-steps), n = 2; "first"
  is what the trainer printed (a CompletedProcess)."""
  def build(folder):
    output_dir = str(folder / "run")
    result = cli("t2t-lite-trainer", *TINY_FLAGS, f"--data_dir={multi30k_data}",
                 f"--output_dir={output_dir}", "--train_steps=4", check=True)
    return {"output_dir": output_dir, "data_dir": multi30k_data,
            "first": [result.args, result.returncode, result.stdout, result.stderr]}
  run = shared(tmp_path_factory, "tiny_run", build)
  return dict(run, first=subprocess.CompletedProcess(*run["first"]))


# --- clusters of trainer processes on this machine ----------------------------------------
def free_ports(count):
  """`count` free ports of 127.0.0.1."""
  import socket
  sockets = [socket.socket() for _ in range(count)]
  for s in sockets:
    s.bind(("127.0.0.1", 0))
  ports = [s.getsockname()[1] for s in sockets]
  for s in sockets:
    s.close()
  return ports


class Worker:
  """A trainer process whose output goes to files (a full pipe would stall it)."""

  def __init__(self, args, env):
    import tempfile
    self.files = [tempfile.TemporaryFile("w+") for _ in range(2)]
    self.process = popen(args, env=env, stdout=self.files[0], stderr=self.files[1], text=True)
    self.ended = None
    self.out = self.err = ""

  def collect(self):
    for f in self.files:
      f.seek(0)
    self.out, self.err = (f.read() for f in self.files)
    for f in self.files:
      f.close()

  @property
  def lines(self):
    return [line for line in self.err.splitlines() if line.strip()]


def start_workers(flags, env_by_worker=None, count=2, flags_by_worker=None):
  """`count` trainer processes forming one cluster over TF_CONFIG on 127.0.0.1
  (`flags_by_worker`: more flags of some)."""
  cluster = {"worker": [f"127.0.0.1:{p}" for p in free_ports(count)]}
  workers = []
  for index in range(count):
    env = dict(os.environ, TF_CONFIG=json.dumps(
        {"cluster": cluster, "task": {"type": "worker", "index": index}}))
    env.pop("T2T_LITE_FAULT", None)
    env.update((env_by_worker or {}).get(index, {}))
    workers.append(Worker([os.path.join(BIN, "t2t-lite-trainer"), "--strategy=multi_worker",
                           *flags, *(flags_by_worker or {}).get(index, [])], env))
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
        worker.process.wait()
      for worker in workers:
        worker.collect()
      raise AssertionError("workers did not finish in time:\n" + "\n".join(
          worker.err[-2000:] for worker in workers))
    time.sleep(0.1)
  for worker in workers:
    worker.collect()
  return workers


def finish(workers):
  for index, worker in enumerate(wait(workers)):
    assert worker.process.returncode == 0, f"worker {index}:\n{worker.err[-3000:]}"
  return workers


# Under pytest-xdist (--dist loadfile --no-loadscope-reorder, the Makefile's) whole files are
# handed to the processes in collection order: the longest go first, so that none starts last
# and leaves the other process idle.
# test_slurm.py first: much of it is waiting for Slurm, which the other process's tests fill.
LONGEST_FIRST = ("test_slurm.py", "test_distribute.py", "test_schedule.py", "test_export.py",
                 "test_reliability.py", "test_decode.py", "test_dropout_ramp.py",
                 "test_cluster.py", "test_train.py", "test_resume.py", "test_sampling.py",
                 "test_data.py", "test_model_selection.py", "test_multistep.py",
                 "test_decode_sampling.py", "test_ensemble.py", "test_back_translation.py",
                 "test_cooldown.py",
                 "test_workflow.py", "test_bench.py", "test_stream.py", "test_translate_all.py",
                 "test_formats.py", "test_hparams_read.py", "test_adaptation.py",
                 "test_mixed_precision.py", "test_ema.py")


def pytest_collection_modifyitems(items):
  rank = {name: index for index, name in enumerate(LONGEST_FIRST)}
  items.sort(key=lambda item: rank.get(os.path.basename(str(item.fspath)), len(rank)))
