"""`make bench`: memory, speed and exactness figures, each configuration in its own process.

python -m t2t_lite.bench --out_dir=bench_out [--quick] [--run_dir=runs/multi30k_ende_avg]
python -m t2t_lite.bench --decode_only   # only the decode comparison (about 5 minutes)

The decode comparison (t2t-lite's decoder at --decode_before and now, the SavedModel, and
CTranslate2 float32 and int8) runs when --run_dir holds a trained run.

Writes bench_out/bench.json and bench_out/bench.md (the table the README shows). Figures
are ratios within one run where possible; absolute times vary between machines.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# --- workers (each runs in a fresh process) -----------------------------------------------

def _tf():
  from t2t_lite.cli.common import import_tensorflow
  return import_tensorflow()


def _peak_rss_mib() -> float:
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def synthetic_batch(rows: int, length: int, vocab: int, seed: int = 0):
  import numpy as np
  tf = _tf()
  rng = np.random.RandomState(seed)
  return {name: tf.constant(rng.randint(3, vocab, size=(rows, length)).astype(np.int32))
          for name in ("inputs", "targets")}


def matmul_flops_per_batch(hparams, vocab: int, rows: int, src: int, tgt: int) -> float:
  """Matmul FLOPs of forward + backward (2x forward) for one batch."""
  h, f = hparams.hidden_size, hparams.filter_size
  enc = rows * src * (2 * (4 * h * h + 2 * h * f)) + rows * 4 * src * src * h
  dec = (rows * tgt * 2 * (6 * h * h + 2 * h * f) + rows * src * 2 * 2 * h * h
         + rows * (4 * tgt * tgt * h + 4 * tgt * src * h))
  logits = 2 * rows * tgt * h * vocab
  forward = hparams.num_encoder_layers * enc + hparams.num_decoder_layers * dec + logits
  return 3.0 * forward


def matmul_rate(dtype_name: str, size: int = 2048, repeats: int = 6) -> float:
  tf = _tf()
  dtype = getattr(tf, dtype_name)
  a = tf.cast(tf.random.normal([size, size]), dtype)
  b = tf.cast(tf.random.normal([size, size]), dtype)
  matmul = tf.function(lambda x, y: tf.matmul(x, y))
  matmul(a, b).numpy()
  start = time.perf_counter()
  for _ in range(repeats):
    out = matmul(a, b)
  out.numpy()
  return 2.0 * size ** 3 * repeats / (time.perf_counter() - start)


class _TrainMeasure:
  """A Learner warmed up on synthetic batches, timing blocks of micro-steps on request."""

  def __init__(self, spec: dict):
    from t2t_lite import registry
    from t2t_lite.learner import Learner
    self.spec = spec
    hparams = registry.hparams(spec["hparams_set"])
    hparams.parse(spec.get("hparams", ""))
    self.hparams, self.vocab = hparams, spec.get("vocab", 8000)
    self.rows, self.length, self.n = spec["rows"], spec["length"], spec["n"]
    self.learner = Learner(hparams, self.vocab, self.n, seed=1,
                           xla_compile=spec.get("xla_compile", False))
    self.batches = [synthetic_batch(self.rows, self.length, self.vocab, seed=i)
                    for i in range(4)]
    self.done = 0
    for _ in range(spec.get("warmup_micro_steps", self.n)):
      self._step()
    float(self.learner.micro_step.numpy())

  def _step(self):
    stats = self.learner.step(self.batches[self.done % 4])
    self.done += 1
    return stats

  def block(self, micro_steps: int) -> float:
    """Seconds of `micro_steps` micro-steps, up to their last result on the host."""
    start = time.perf_counter()
    for _ in range(micro_steps):
      stats = self._step()
    if stats is not None:
      float(stats["loss"])
    self.learner.update_step.numpy()
    return time.perf_counter() - start

  def result(self, micro_steps: int, seconds: float) -> dict:
    tf = _tf()
    from t2t_lite.models.transformer import compute_dtype
    tokens = self.rows * self.length * micro_steps
    flops = matmul_flops_per_batch(self.hparams, self.vocab, self.rows, self.length,
                                   self.length) * micro_steps
    result = {"tokens_per_second": tokens / seconds, "model_flops_per_second": flops / seconds,
              "peak_rss_mib": _peak_rss_mib(), "compute_dtype": compute_dtype(self.hparams).name,
              **{f"{k}_mib": v / 2 ** 20 for k, v in self.learner.state_bytes().items()}}
    if tf.config.list_logical_devices("GPU"):
      result["peak_gpu_mib"] = tf.config.experimental.get_memory_info("GPU:0")["peak"] / 2 ** 20
    if self.spec.get("with_matmul_rate"):
      result["matmul_float32_flops_per_second"] = matmul_rate("float32")
    return result


def worker_train(spec: dict) -> dict:
  """Peak memory and steady-state tokens/s of `micro_steps` micro-steps at n = spec['n']."""
  measure = _TrainMeasure(spec)
  micro_steps = spec.get("micro_steps", spec["n"])
  return measure.result(micro_steps, measure.block(micro_steps))


def serve_train(spec: dict) -> None:
  """A train measurement driven over stdin/stdout by paired_train: prints "ready" once warmed
  up, then for each line "<k>" the seconds of k more micro-steps, and for "result <k>
  <seconds>" the result of k micro-steps in that many seconds, and exits."""
  measure = _TrainMeasure(spec)
  print("ready", flush=True)
  for line in sys.stdin:
    words = line.split()
    if words[0] == "result":
      print(json.dumps(measure.result(int(words[1]), float(words[2]))), flush=True)
      return
    print(measure.block(int(words[0])), flush=True)


def paired_train(spec: dict, before_root: str, blocks: int = 8) -> tuple[dict, dict]:
  """The train measurement `spec` on this version and on the one at before_root, in two
  processes warmed up first and then run in turn, a block of micro-steps each (now, before,
  before, now, ...), so that both see the machine in the same state however its speed drifts.
  Returns (now, before) results, each with the block ratios of now's speed to before's."""
  import tempfile
  from t2t_lite import decode_speed
  per_block = max(1, spec.get("micro_steps", spec["n"]) // blocks)
  procs, logs = [], []
  try:
    for root in (None, before_root):
      # stderr to a file: TensorFlow's log lines could fill a pipe nobody reads meanwhile
      logs.append(tempfile.TemporaryFile(mode="w+"))
      proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--serve",
                               json.dumps(spec)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=logs[-1], text=True,
                              cwd=REPO, env=decode_speed._environment(root))
      procs.append(proc)
      if proc.stdout.readline().strip() != "ready":
        proc.wait()
        logs[-1].seek(0)
        raise RuntimeError((logs[-1].read().strip().splitlines() or ["failed"])[-1])

    def ask(proc, line):
      proc.stdin.write(line + "\n")
      proc.stdin.flush()
      return proc.stdout.readline()

    seconds, ratios = [0.0, 0.0], []
    for b in range(blocks):
      block = [0.0, 0.0]
      for side in ((0, 1) if b % 2 == 0 else (1, 0)):
        block[side] = float(ask(procs[side], str(per_block)))
        seconds[side] += block[side]
      ratios.append(block[1] / block[0])
    now, before = (json.loads(ask(proc, f"result {per_block * blocks} {seconds[side]}"))
                   for side, proc in enumerate(procs))
  except (RuntimeError, ValueError, OSError) as e:
    return {"error": f"paired measurement failed: {e}"}, {}
  finally:
    for proc in procs:
      proc.kill()
      proc.wait()
    for log in logs:
      log.close()
  paired = {"blocks": blocks, "micro_steps_per_block": per_block,
            "block_ratios": sorted(ratios)}
  return {**now, **paired}, {**before, **paired}


# Name scopes of the model (layers.py, transformer.py, optimize.py); gradient ops carry them.
PROFILE_SCOPES = ("cross_entropy", "softmax", "layer_norm", "dropout", "adam")


def op_breakdown(xspace_path: str) -> dict:
  """Seconds of TensorFlow op kernels in a profile, by group: matmuls (by op type), then the
  model's name scopes (forward and gradient ops), then everything else (elementwise,
  reshapes, embedding gathers, accumulation, the cross-replica sum)."""
  from tensorflow.tsl.profiler.protobuf import xplane_pb2
  space = xplane_pb2.XSpace()
  with open(xspace_path, "rb") as f:
    space.ParseFromString(f.read())
  import re
  scope = re.compile(r"(?:^|/)(%s)(?:_\d+)?/" % "|".join(PROFILE_SCOPES))
  groups = dict.fromkeys(("matmul", *PROFILE_SCOPES, "other"), 0.0)
  types = {}
  executing = 0.0  # seconds the Python thread spent inside function executions
  for plane in space.planes:
    for line in plane.lines:
      if line.name == "python":
        executing += sum(e.duration_ps * 1e-12 for e in line.events if plane.event_metadata[
            e.metadata_id].name.startswith("EagerLocalExecute: __inference"))
      if not line.name.startswith("tf_Compute"):  # the executor threads: one event per op
        continue
      for event in line.events:
        name, _, op_type = plane.event_metadata[event.metadata_id].name.rpartition(":")
        if not name or name.startswith("ExecutorState"):
          continue
        found = scope.search(name)
        group = "matmul" if "MatMul" in op_type or op_type == "Einsum" else found.group(1) if found else "other"
        groups[group] += event.duration_ps * 1e-12
        types[op_type] = types.get(op_type, 0.0) + event.duration_ps * 1e-12
  return groups, types, executing


def worker_profile(spec: dict) -> dict:
  """Where a micro-step's time goes: TensorFlow's profiler over `micro_steps` steady-state
  micro-steps; op time by group and by op type (shares of all op time; ops running at once on
  several cores overlap), and the host's share (wall time no step function was executing)."""
  import glob
  import tempfile
  tf = _tf()
  measure = _TrainMeasure({**spec, "warmup_micro_steps": 2 * spec["n"]})
  with tempfile.TemporaryDirectory() as logdir:
    tf.profiler.experimental.start(logdir)
    wall = measure.block(spec["micro_steps"])
    tf.profiler.experimental.stop()
    groups, types, executing = op_breakdown(sorted(glob.glob(os.path.join(logdir, "**", "*.xplane.pb"),
                                           recursive=True))[-1])
  total = sum(groups.values())
  top = sorted(types.items(), key=lambda item: -item[1])[:8]
  return {"seconds_per_micro_step": wall / spec["micro_steps"],
          "host_share": max(0.0, 1.0 - executing / wall),
          "shares": {k: v / total for k, v in groups.items()},
          "op_types": {k: v / total for k, v in top}}


@contextlib.contextmanager
def counting_host_reads():
  """Counts the device values read to the host meanwhile: every .numpy(), float(), int() or
  bool() of an eager tensor or variable goes through _EagerTensorBase._numpy."""
  from tensorflow.python.framework import ops
  original = ops._EagerTensorBase._numpy  # noqa: SLF001 (the one place every read passes)
  counter = {"reads": 0}

  def counted(tensor):
    counter["reads"] += 1
    return original(tensor)

  ops._EagerTensorBase._numpy = counted  # noqa: SLF001
  try:
    yield counter
  finally:
    ops._EagerTensorBase._numpy = original  # noqa: SLF001


def host_reads_by_update(trainer) -> dict:
  """Trains `trainer` and counts the device reads of each update (its micro-steps and the
  loop's work after them) with log lines only (no evaluation, saves only at the end):
  {"between_log_lines": [reads of each update with no log line], "log_lines": [... of each
  update with one], "end": reads of the last update (its log line and the final save)}."""
  learner, marks = trainer.learner, []
  step = learner.step

  def marked(*args):
    marks.append(counter["reads"])
    return step(*args)

  learner.step = marked
  with counting_host_reads() as counter:
    trainer.train()
    marks.append(counter["reads"])
  learner.step = step
  n, options = learner.accumulate_steps(1), trainer.options
  per_update = [marks[i + n] - marks[i] for i in range(0, len(marks) - n, n)]
  logged = [(u + 1) % options.log_every == 0 for u in range(len(per_update) - 1)]
  return {"between_log_lines": [r for r, log in zip(per_update, logged) if not log],
          "log_lines": [r for r, log in zip(per_update, logged) if log],
          "end": per_update[-1]}


def worker_host_syncs(spec: dict) -> dict:
  """Device reads per update of the training loop (transformer_tiny on the problem's data):
  none between log lines is the target."""
  _tf()
  from t2t_lite import registry, steps
  from t2t_lite.decide import Checkpointing, Evaluation
  from t2t_lite.train import RunOptions, Trainer
  import tempfile
  hparams = registry.hparams("transformer_tiny")
  hparams.parse(f"batch_size=512,max_length=64,optimizer_multistep_accumulate_steps={spec['n']}")
  with tempfile.TemporaryDirectory() as output_dir:
    options = RunOptions(output_dir=output_dir, data_dir=spec["data_dir"], log_every=4,
                         checkpointing=Checkpointing(save_steps=0),
                         evaluation=Evaluation(frequency=0))
    trainer = Trainer(hparams, registry.problem("translate_ende_multi30k"),
                      steps.plan(hparams, 1, spec.get("updates", 12)), options)
    reads = host_reads_by_update(trainer)
  return {"between_log_lines": sum(reads["between_log_lines"]) / len(reads["between_log_lines"]),
          "at_log_lines": sum(reads["log_lines"]) / len(reads["log_lines"])}


def worker_mirrored(spec: dict) -> dict:
  """2 logical CPU devices under MirroredStrategy: the update applied on each device (see
  equivalence.mirrored_against_single)."""
  _tf()
  from t2t_lite.distribute import split_cpu
  split_cpu(2)
  from t2t_lite import registry
  from t2t_lite.equivalence import mirrored_against_single
  hparams = registry.hparams("transformer_tiny")
  hparams.parse("layer_prepostprocess_dropout=0,attention_dropout=0,relu_dropout=0,"
                "learning_rate_schedule=constant,learning_rate_constant=1e-4")
  return mirrored_against_single(hparams)


def worker_keras(spec: dict) -> dict:
  """Keras 3 Adam(gradient_accumulation_steps=n) against ours, on ragged micro-batches."""
  tf = _tf()
  import keras
  from t2t_lite import registry
  from t2t_lite.equivalence import concat, ragged_batches, relative_difference
  from t2t_lite.learner import Learner
  n, updates, lr, vocab = 4, 3, 1e-4, 60
  hparams = registry.hparams("transformer_tiny")
  hparams.parse(f"layer_prepostprocess_dropout=0,attention_dropout=0,relu_dropout=0,"
                f"learning_rate_schedule=constant,learning_rate_constant={lr}")
  micro = ragged_batches(n * updates, vocab, seed=1)
  big = Learner(hparams, vocab, 1, seed=3)
  ours = Learner(hparams, vocab, n, seed=3)
  for u in range(updates):
    big.step(concat(micro[n * u:n * u + n]))
  for batch in micro:
    ours.step(batch)
  host = Learner(hparams, vocab, 1, seed=3)  # the same model, trained by Keras's optimizer
  variables = host.variables
  optimizer = keras.optimizers.Adam(learning_rate=lr, beta_1=0.9, beta_2=0.997, epsilon=1e-9,
                                    gradient_accumulation_steps=n)
  optimizer.build(variables)

  @tf.function
  def keras_step(batch):
    with tf.GradientTape() as tape:
      loss, tokens = host.model.loss(batch["inputs"], batch["targets"])
      mean = loss / tokens
    grads = [tf.convert_to_tensor(g) for g in tape.gradient(mean, variables)]
    optimizer.apply_gradients(zip(grads, variables))

  for batch in micro:
    keras_step(batch)
  return {"ours_relative_difference": relative_difference(ours, big),
          "keras_relative_difference": relative_difference(host, big),
          "keras_iterations": int(optimizer.iterations.numpy()), "micro_batches": len(micro),
          "updates": updates}


def worker_keras_speed(spec: dict) -> dict:
  """Throughput and peak memory of Keras's accumulation on the benchmark model."""
  tf = _tf()
  import keras
  from t2t_lite import registry
  from t2t_lite.learner import Learner
  hparams = registry.hparams(spec["hparams_set"])
  n, rows, length, vocab = spec["n"], spec["rows"], spec["length"], 8000
  host = Learner(hparams, vocab, 1, seed=1)
  variables = host.variables
  optimizer = keras.optimizers.Adam(learning_rate=1e-4, gradient_accumulation_steps=n)
  optimizer.build(variables)

  @tf.function(reduce_retracing=True)
  def keras_step(batch):
    with tf.GradientTape() as tape:
      loss, tokens = host.model.loss(batch["inputs"], batch["targets"], tf.constant([1, 2],
                                                                               tf.int64))
      mean = loss / tokens
    grads = [tf.convert_to_tensor(g) for g in tape.gradient(mean, variables)]
    optimizer.apply_gradients(zip(grads, variables))
    return mean

  batches = [synthetic_batch(rows, length, vocab, seed=i) for i in range(4)]
  for i in range(n):
    keras_step(batches[i % 4])
  start = time.perf_counter()
  for i in range(spec["micro_steps"]):
    out = keras_step(batches[i % 4])
  float(out)
  seconds = time.perf_counter() - start
  return {"tokens_per_second": rows * length * spec["micro_steps"] / seconds,
          "peak_rss_mib": _peak_rss_mib()}


def worker_decode(spec: dict) -> dict:
  """Sentences per second translating test_2016_flickr (greedy / beam 4, cached / not)."""
  tf = _tf()
  from t2t_lite import decode, registry
  from t2t_lite.problems.base import read_lines
  hparams = registry.hparams("transformer_multi30k_cpu")
  model = registry.model("transformer")(hparams, 8000)
  source = spec.get("checkpoint")
  if source:
    tf.train.Checkpoint(model=model).restore(source).expect_partial()
  vocab = registry.problem("translate_ende_multi30k").get_vocab(spec["data_dir"])
  lines = read_lines(os.path.join(spec["raw_dir"], "test_2016_flickr.en.gz"))[:spec["sentences"]]
  sources = vocab.encode_batch(lines)
  decoder = decode.Decoder(model, hparams.max_length)
  results = {}
  for beam in (1, 4):
    for cached in (True, False):
      decoder.translate_ids(sources[:8], beam, 0.6, 64, cached)  # trace
      start = time.perf_counter()
      decoder.translate_ids(sources, beam, 0.6, 64, cached)
      results[f"beam{beam}_{'cached' if cached else 'uncached'}"] = (
          len(sources) / (time.perf_counter() - start))
  results["trained_model"] = bool(source)
  return results


def worker_pipeline(spec: dict) -> dict:
  """Examples per second the tf.data pipeline delivers for transformer_multi30k_cpu."""
  _tf()
  from t2t_lite import data, registry
  hparams = registry.hparams("transformer_multi30k_cpu")
  files = registry.problem("translate_ende_multi30k").data_files(spec["data_dir"], "train")
  dataset = data.train_dataset(files, hparams, seed=1)
  iterator = iter(dataset)
  for _ in range(20):
    next(iterator)
  examples, start = 0, time.perf_counter()
  for _ in range(spec.get("batches", 400)):
    examples += int(next(iterator)["targets"].shape[0])
  seconds = time.perf_counter() - start
  return {"examples_per_second": examples / seconds,
          "padding_fraction": data.padding_fraction(dataset, 200)}


def worker_cluster_member(spec: dict) -> dict:
  """One of two workers (TF_CONFIG set by worker_cluster): seconds per update at n=1 and the
  collective ops of its cross-replica sum, with the sums packed or one per tensor."""
  tf = _tf()
  from t2t_lite import learner as learner_lib, registry
  strategy = tf.distribute.MultiWorkerMirroredStrategy()
  if not spec["packed"]:
    learner_lib.PACK_BYTES = 1  # packs of at least 1 byte: every tensor its own all-reduce
  hparams = registry.hparams(spec["hparams_set"])
  learner = learner_lib.Learner(hparams, spec["vocab"], 1, seed=1, strategy=strategy)
  batches = [synthetic_batch(spec["rows"], spec["length"], spec["vocab"], seed=i)
             for i in range(4)]
  distributed = [strategy.experimental_distribute_values_from_function(lambda _, b=b: b)
                 for b in batches]
  for i in range(3):
    learner.step(distributed[i % 4])
  float(learner.update_step.numpy())
  start = time.perf_counter()
  for i in range(spec["updates"]):
    stats = learner.step(distributed[i % 4])
  float(stats["loss"])
  return {"seconds_per_update": (time.perf_counter() - start) / spec["updates"],
          "variables": len(learner.variables), **learner.reduction}


def worker_cluster(spec: dict) -> dict:
  """Two worker processes on 127.0.0.1, packed sums against one all-reduce per tensor."""
  import socket
  results = {}
  for packed in (True, False):
    sockets = [socket.socket() for _ in range(2)]
    for sock in sockets:
      sock.bind(("127.0.0.1", 0))
    cluster = {"worker": [f"127.0.0.1:{sock.getsockname()[1]}" for sock in sockets]}
    for sock in sockets:
      sock.close()
    member = json.dumps({**spec, "kind": "cluster_member", "packed": packed})
    processes = [subprocess.Popen(
        [sys.executable, "-m", "t2t_lite.bench", "--worker", member], cwd=REPO,
        env=dict(os.environ, TF_CONFIG=json.dumps(
            {"cluster": cluster, "task": {"type": "worker", "index": index}})),
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True) for index in range(2)]
    outputs = [p.communicate(timeout=300)[0] for p in processes]
    if any(p.returncode for p in processes):
      return {"error": "a worker failed"}
    results["packed" if packed else "per_tensor"] = json.loads(outputs[0].strip().splitlines()[-1])
  return results


WORKERS = {"train": worker_train, "cluster_member": worker_cluster_member,
           "cluster": worker_cluster, "keras": worker_keras, "keras_speed": worker_keras_speed,
           "decode": worker_decode, "pipeline": worker_pipeline, "profile": worker_profile,
           "host_syncs": worker_host_syncs, "mirrored": worker_mirrored}


# --- the suite ----------------------------------------------------------------------------

def extract_version(commit: str, directory: str) -> None:
  """t2t_lite and configs as of `commit` into `directory` (an older version to compare)."""
  import io
  import tarfile
  archive = subprocess.run(["git", "archive", commit, "t2t_lite", "configs"], cwd=REPO,
                           capture_output=True, check=True).stdout
  with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
    tar.extractall(directory, filter="data")


def run_worker(spec: dict, package_root: str | None = None) -> dict:
  """One configuration in a fresh process: this file's worker, run on the t2t_lite of
  `package_root` when given (an older version, for before/after rows)."""
  from t2t_lite import decode_speed
  result = subprocess.run([sys.executable, os.path.abspath(__file__), "--worker",
                           json.dumps(spec)], capture_output=True, text=True, cwd=REPO,
                          env=decode_speed._environment(package_root))
  if result.returncode != 0:
    return {"error": result.stderr.strip().splitlines()[-1] if result.stderr else "failed"}
  return json.loads(result.stdout.strip().splitlines()[-1])


def suite(quick: bool, data_dir: str | None, raw_dir: str | None, checkpoint: str | None,
          before: bool = False):
  """The configurations: (name, spec). --quick shrinks them to seconds (for the test).
  `before`: the training speed, profile and host-sync rows again on the version before
  (--train_before), as "before/<name>"."""
  cpu = {"hparams_set": "transformer_multi30k_cpu", "rows": 128, "length": 32}
  base = {"hparams_set": "transformer_base", "hparams": "batch_size=512", "rows": 16,
          "length": 32}
  if quick:
    cpu = {"hparams_set": "transformer_tiny", "rows": 8, "length": 8, "vocab": 100}
    base = dict(cpu)
  memory_ns = (1, 2, 4) if quick else (1, 2, 4, 8, 16)
  specs = []
  for label, config in (("transformer_multi30k_cpu", cpu), ("transformer_base", base)):
    for n in memory_ns:
      specs.append((f"memory/{label}/n={n}", {"kind": "train", **config, "n": n,
                                              "warmup_micro_steps": 0, "micro_steps": n}))
  steady = 4 if quick else 16
  specs.append(("speed/n=1", {"kind": "train", **cpu, "n": 1, "warmup_micro_steps": 2,
                              "micro_steps": steady, "with_matmul_rate": True}))
  specs.append(("speed/n=8", {"kind": "train", **cpu, "n": 8, "warmup_micro_steps": 8,
                              "micro_steps": steady, "with_matmul_rate": True}))
  specs.append(("speed/n=1/mixed_precision", {
      "kind": "train", **cpu, "n": 1, "warmup_micro_steps": 2, "micro_steps": steady,
      "hparams": "mixed_precision=true", "with_matmul_rate": True}))
  specs.append(("speed/n=1/float32", {
      "kind": "train", **cpu, "n": 1, "warmup_micro_steps": 2, "micro_steps": steady,
      "hparams": "mixed_precision=false", "with_matmul_rate": True}))
  specs.append(("speed/n=1/xla", {"kind": "train", **cpu, "n": 1, "warmup_micro_steps": 2,
                                  "micro_steps": steady, "xla_compile": True}))
  specs.append(("keras/exactness", {"kind": "keras"}))
  specs.append(("two_workers/transformer_tiny/n=1", {
      "kind": "cluster", "hparams_set": "transformer_tiny", "rows": 8 if quick else 32,
      "length": 16, "vocab": 100 if quick else 8000, "updates": 4 if quick else 30}))
  if not quick:
    specs.append(("keras/speed/n=8", {"kind": "keras_speed", **cpu, "n": 8,
                                      "micro_steps": steady}))
  specs.append(("mirrored", {"kind": "mirrored"}))
  specs.append(("profile/n=1", {"kind": "profile", **cpu, "n": 1,
                                "micro_steps": 2 if quick else 6}))
  if data_dir:
    for n in (1, 4):
      specs.append((f"host_syncs/n={n}", {"kind": "host_syncs", "data_dir": data_dir, "n": n}))
  if before:  # the same configurations on the version before: the n=1 speeds measured in
    # turns with now's (paired_train), the profile and host syncs right after their now rows
    paired = []
    for name, spec in specs:
      if name in ("speed/n=1", "speed/n=1/float32"):
        paired.append((name, {**spec, "paired": True}))
        continue
      paired.append((name, spec))
      if name == "profile/n=1" or name.startswith("host_syncs/"):
        paired.append((f"before/{name}", {**spec, "before": True}))
    specs = paired
  if data_dir and raw_dir:
    specs.append(("decode", {"kind": "decode", "data_dir": data_dir, "raw_dir": raw_dir,
                             "checkpoint": checkpoint, "sentences": 16 if quick else 200}))
    specs.append(("pipeline", {"kind": "pipeline", "data_dir": data_dir,
                               "batches": 20 if quick else 400}))
  return specs


DECODE_ENGINES = (("before", "t2t-lite before ({commit})"), ("after", "t2t-lite now"),
                  ("saved_model", "SavedModel"), ("ctranslate2_float32", "CTranslate2 float32"),
                  ("ctranslate2_int8", "CTranslate2 int8"))


def decode_comparison(run_dir: str, raw_dir: str, out_dir: str, before_commit: str,
                      sentences: int = 0) -> dict:
  """test_2016_flickr with beam 4 (alpha 0.6), batches of 64 sentences, by t2t-lite's decoder
  at `before_commit` and now, the SavedModel, and CTranslate2 float32 and int8: each in a
  fresh process, one after another. The exports are made first (not timed)."""
  import tempfile
  from t2t_lite import decode_speed
  from t2t_lite.export import serving_speed
  spec = {"output_dir": run_dir, "source": os.path.join(raw_dir, "test_2016_flickr.en.gz"),
          "reference": os.path.join(raw_dir, "test_2016_flickr.de.gz"), "beam_size": 4,
          "alpha": 0.6, "batch_size": 64, "sentences": sentences}
  exports = os.path.join(out_dir, "exports")
  exporter = [os.path.join(os.path.dirname(sys.executable), "t2t-lite-exporter"),
              f"--output_dir={run_dir}", "--overwrite", "--decode_hparams=beam_size=4,alpha=0.6"]
  for name, args in (("saved_model", []), ("ctranslate2_float32", ["--format=ctranslate2"]),
                     ("ctranslate2_int8", ["--format=ctranslate2", "--quantization=int8"])):
    done = subprocess.run([*exporter, f"--export_dir={os.path.join(exports, name)}", *args],
                          capture_output=True, text=True)
    if done.returncode:
      return {"error": f"export {name}: {done.stderr.strip().splitlines()[-1]}"}
  results = {"_commit": before_commit, "_sentences": sentences or 1000}
  with tempfile.TemporaryDirectory() as old:
    extract_version(before_commit, old)
    results["before"] = decode_speed.measure_process(spec, old)
  results["after"] = decode_speed.measure_process(spec)
  for name, engine in (("saved_model", "saved_model"), ("ctranslate2_float32", "ctranslate2"),
                       ("ctranslate2_int8", "ctranslate2")):
    results[name] = serving_speed.measure_process(
        {**spec, "engine": engine, "export_dir": os.path.join(exports, name)})
  return results


def decode_rows(d: dict) -> list[str]:
  """The decode table: sentences/s while decoding (start-up excluded), the ratio to the
  decoder before, the decoding and whole-process seconds, and BLEU."""
  rows, before = [], d.get("before", {}).get("sentences_per_second")
  for name, label in DECODE_ENGINES:
    r = d.get(name, {})
    label = label.format(commit=d.get("_commit", ""))
    if "sentences_per_second" not in r:
      rows.append(f"| decode, {label} | {r.get('error', 'not measured')} |")
      continue
    ratio = f" ({r['sentences_per_second'] / before:.1f}x)" if before else ""
    rows.append(f"| decode {d.get('_sentences', 1000)} test_2016_flickr sentences, beam 4, "
                f"batch 64: {label} | {r['sentences_per_second']:.1f} sentences/s{ratio}; "
                f"{r['decode_seconds']:.1f} s decoding, {r['process_seconds']:.1f} s whole "
                f"process; BLEU {r.get('bleu', float('nan')):.2f} |")
  return rows


def _ratio(now: dict, before: dict, key: str) -> str:
  if key in now and key in before:
    return f" ({now[key] / before[key]:.2f}x)"
  return ""


def _turns(now: dict) -> str:
  """How a paired measurement was taken, and the spread of its blocks' speed ratios."""
  if "block_ratios" not in now:
    return ""
  r = now["block_ratios"]
  return (f"; in turns, {now['blocks']} blocks of {now['micro_steps_per_block']} micro-steps "
          f"each: block ratios {r[0]:.2f}-{r[-1]:.2f}")


def before_after_rows(results: dict) -> list[str]:
  """Training speed and peak memory now against --train_before, the profile, host syncs
  per update and the mirrored-update check."""
  rows, commit = [], results.get("_train_before", "before")
  for name, label in (("speed/n=1", "default precision"), ("speed/n=1/float32", "float32")):
    now, before = results.get(name, {}), results.get(f"before/{name}", {})
    if "tokens_per_second" in now and "tokens_per_second" in before:
      rows.append(f"| {label} ({now['compute_dtype']}) n=1 tokens/s, peak RSS: {commit} / now | "
                  f"{before['tokens_per_second']:.0f}, {before['peak_rss_mib']:.0f} MiB / "
                  f"{now['tokens_per_second']:.0f}{_ratio(now, before, 'tokens_per_second')}, "
                  f"{now['peak_rss_mib']:.0f} MiB{_ratio(now, before, 'peak_rss_mib')}"
                  f"{_turns(now)} |")
  for name in ("before/profile/n=1", "profile/n=1"):
    p = results.get(name, {})
    if "shares" in p:
      label = commit if name.startswith("before/") else "now"
      shares = ", ".join(f"{k} {v:.0%}" for k, v in p["shares"].items() if v >= 0.005)
      types = ", ".join(f"{k} {v:.0%}" for k, v in p["op_types"].items())
      rows.append(f"| profile of a micro-step ({label}): {p['seconds_per_micro_step']:.2f} s; "
                  f"host {p['host_share']:.1%} | op time by scope: {shares}; by op type: "
                  f"{types} |")
  for n in (1, 4):
    now, before = results.get(f"host_syncs/n={n}", {}), results.get(f"before/host_syncs/n={n}", {})
    if "between_log_lines" in now:
      was = (f"{before['between_log_lines']:.1f} / {before['at_log_lines']:.1f} before ({commit}); "
             if "between_log_lines" in before else "")
      rows.append(f"| host syncs per update, n={n}: between log lines / at a log line | "
                  f"{was}{now['between_log_lines']:.1f} / {now['at_log_lines']:.1f} now |")
  m = results.get("mirrored", {})
  if "apply_ops" in m:
    devices = ", ".join(f"{d.rsplit('/', 1)[-1]}: {c}" for d, c in sorted(m["apply_ops"].items()))
    rows.append(f"| mirrored update, 2 CPU devices: fused Adam kernels per device "
                f"({m['variables']} variables); parameters vs 1 device (rel.) | {devices}; "
                f"{m['relative_difference']:.1e} |")
  return rows


def table(results: dict) -> str:
  rows = ["| measurement | figure |", "|---|---|"]
  for label in ("transformer_multi30k_cpu", "transformer_base"):
    one = results.get(f"memory/{label}/n=1", {})
    if "peak_rss_mib" not in one:
      continue
    acc = results.get(f"memory/{label}/n=2", {}).get("accumulators_mib", 0.0)
    rows.append(f"| {label}: parameters / Adam slots / accumulators (n>1) | "
                f"{one['parameters_mib']:.1f} / {one['adam_slots_mib']:.1f} / {acc:.1f} MiB |")
    for name, result in results.items():
      if name.startswith(f"memory/{label}/") and "peak_rss_mib" in result:
        n = name.rsplit("=", 1)[1]
        if n == "1":
          rows.append(f"| {label}: peak RSS at n=1 | {result['peak_rss_mib']:.0f} MiB |")
          continue
        delta = result["peak_rss_mib"] - one["peak_rss_mib"]
        budget = acc + 0.05 * one["peak_rss_mib"]
        verdict = "within target" if delta <= budget else "OVER target"
        rows.append(f"| {label}: peak RSS at n={n} | {result['peak_rss_mib']:.0f} MiB "
                    f"({delta:+.0f} vs n=1; target <= +{budget:.0f}: {verdict}) |")
  s1, s8 = results.get("speed/n=1", {}), results.get("speed/n=8", {})
  if "tokens_per_second" in s1 and "tokens_per_second" in s8:
    rows.append(f"| tokens/s n=1 / n=8 (same batch) | {s1['tokens_per_second']:.0f} / "
                f"{s8['tokens_per_second']:.0f} (ratio {s8['tokens_per_second'] / s1['tokens_per_second']:.3f}) |")
    for name in ("speed/n=1/float32", "speed/n=1/mixed_precision"):
      r = results.get(name, {})
      if "tokens_per_second" in r:
        mfu = r["model_flops_per_second"] / r["matmul_float32_flops_per_second"]
        rows.append(f"| {name.split('/')[-1]} ({r['compute_dtype']}): tokens/s, model FLOP/s "
                    f"/ float32 matmul FLOP/s | {r['tokens_per_second']:.0f}, "
                    f"{r['model_flops_per_second'] / 1e9:.0f} / "
                    f"{r['matmul_float32_flops_per_second'] / 1e9:.0f} GFLOP/s = {mfu:.0%} |")
    xla = results.get("speed/n=1/xla", {})
    if "tokens_per_second" in xla:
      rows.append(f"| --xla_compile ({xla['compute_dtype']}, n=1): tokens/s with / without | "
                  f"{xla['tokens_per_second']:.0f} / {s1['tokens_per_second']:.0f} "
                  f"({xla['tokens_per_second'] / s1['tokens_per_second']:.2f}x) |")
  rows.extend(before_after_rows(results))
  k = results.get("keras/exactness", {})
  if "keras_relative_difference" in k:
    rows.append(f"| parameters vs one big batch after {k['updates']} updates (rel.): ours / "
                f"Keras gradient_accumulation_steps | {k['ours_relative_difference']:.1e} / "
                f"{k['keras_relative_difference']:.1e} |")
  ks = results.get("keras/speed/n=8", {})
  if "tokens_per_second" in ks and "tokens_per_second" in s8:
    rows.append(f"| n=8 tokens/s, peak RSS: ours / Keras | {s8['tokens_per_second']:.0f}, "
                f"{s8['peak_rss_mib']:.0f} MiB / {ks['tokens_per_second']:.0f}, "
                f"{ks['peak_rss_mib']:.0f} MiB |")
  d = results.get("decode", {})
  if "beam4_cached" in d:
    rows.append(f"| decode sentences/s, greedy cached / uncached | {d['beam1_cached']:.1f} / "
                f"{d['beam1_uncached']:.1f} ({d['beam1_cached'] / d['beam1_uncached']:.1f}x) |")
    rows.append(f"| decode sentences/s, beam 4 cached / uncached | {d['beam4_cached']:.1f} / "
                f"{d['beam4_uncached']:.1f} ({d['beam4_cached'] / d['beam4_uncached']:.1f}x) |")
  if "decode_comparison" in results:
    rows.extend(decode_rows(results["decode_comparison"]))
  c = results.get("two_workers/transformer_tiny/n=1", {})
  if "packed" in c and "per_tensor" in c:
    packed, per_tensor = c["packed"], c["per_tensor"]
    rows.append(f"| 2 local workers, transformer_tiny n=1 ({packed['variables']} variables): "
                f"collective ops and s/update, packed / one per tensor | "
                f"{packed['collective_ops']}, {packed['seconds_per_update']:.3f} s / "
                f"{per_tensor['collective_ops']}, {per_tensor['seconds_per_update']:.3f} s "
                f"({per_tensor['seconds_per_update'] / packed['seconds_per_update']:.1f}x) |")
  p = results.get("pipeline", {})
  if "examples_per_second" in p:
    rows.append(f"| input pipeline examples/s, padding fraction | "
                f"{p['examples_per_second']:.0f}, {p['padding_fraction']:.1%} |")
  return "\n".join(rows) + "\n"


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__)
  parser.add_argument("--worker", help=argparse.SUPPRESS)
  parser.add_argument("--serve", help=argparse.SUPPRESS)
  parser.add_argument("--out_dir", default="bench_out")
  parser.add_argument("--quick", action="store_true", help="tiny configurations (seconds)")
  parser.add_argument("--data_dir", default="data/multi30k_ende")
  parser.add_argument("--raw_dir", default=None)
  parser.add_argument("--checkpoint", default=None, help="a trained model for decoding")
  parser.add_argument("--table_only", action="store_true",
                      help="rewrite bench.md from an existing bench.json")
  parser.add_argument("--run_dir", default="runs/multi30k_ende_avg",
                      help="the trained run (or averaged run) of the decode comparison")
  parser.add_argument("--decode_before", default="dbe53b6",
                      help="the commit whose decoder is the comparison's 'before'")
  parser.add_argument("--train_before", default="ab2aa83",
                      help="the commit whose training speed, memory, profile and host syncs "
                           "are the 'before' rows ('' for none)")
  parser.add_argument("--decode_only", action="store_true",
                      help="run only the decode comparison; merge it into bench.json")
  args = parser.parse_args(argv)
  if args.decode_only and not os.path.isfile(os.path.join(args.run_dir, "hparams.json")):
    parser.error(f"--decode_only: --run_dir={args.run_dir} is not a trained run (no "
                 "hparams.json); run make train first or pass --run_dir")
  if args.serve:
    serve_train(json.loads(args.serve))
    return
  if args.worker:
    spec = json.loads(args.worker)
    print(json.dumps(WORKERS[spec["kind"]](spec)))
    return
  if args.table_only:
    with open(os.path.join(args.out_dir, "bench.json")) as f:
      markdown = table(json.load(f))
    with open(os.path.join(args.out_dir, "bench.md"), "w") as f:
      f.write(markdown)
    print(markdown)
    return
  raw_dir = args.raw_dir or os.path.join(args.data_dir, "raw")
  have_data = os.path.isfile(os.path.join(args.data_dir, "translate_ende_multi30k.manifest.json"))
  checkpoint = args.checkpoint
  if checkpoint is None and os.path.isdir("runs/multi30k_ende_avg"):
    import glob
    found = sorted(glob.glob("runs/multi30k_ende_avg/ckpt-*.index"))
    checkpoint = found[-1][:-len(".index")] if found else None
  results = {}
  bench_json = os.path.join(args.out_dir, "bench.json")
  if args.decode_only and os.path.isfile(bench_json):
    with open(bench_json) as f:
      results = json.load(f)
  start = time.time()
  if not args.decode_only:
    before_root = None
    if args.train_before and not args.quick:
      import tempfile
      before_root = tempfile.mkdtemp(prefix="t2t-lite-before-")
      extract_version(args.train_before, before_root)
      results["_train_before"] = args.train_before
    try:
      for name, spec in suite(args.quick, args.data_dir if have_data else None, raw_dir,
                              checkpoint, before=before_root is not None):
        if spec.get("paired"):
          results[name], results[f"before/{name}"] = paired_train(spec, before_root)
          print(f"before/{name}: {json.dumps(results[f'before/{name}'])}", flush=True)
        else:
          results[name] = run_worker(spec, before_root if spec.get("before") else None)
        print(f"{name}: {json.dumps(results[name])}", flush=True)
    finally:
      if before_root:
        import shutil
        shutil.rmtree(before_root)
  if os.path.isfile(os.path.join(args.run_dir, "hparams.json")) and not args.quick:
    results["decode_comparison"] = decode_comparison(args.run_dir, raw_dir, args.out_dir,
                                                     args.decode_before)
    print(f"decode_comparison: {json.dumps(results['decode_comparison'])}", flush=True)
  results["_meta"] = {"seconds": round(time.time() - start, 1), "quick": args.quick,
                      "cpu_count": os.cpu_count()}
  os.makedirs(args.out_dir, exist_ok=True)
  with open(os.path.join(args.out_dir, "bench.json"), "w") as f:
    json.dump(results, f, indent=2)
  markdown = table(results)
  with open(os.path.join(args.out_dir, "bench.md"), "w") as f:
    f.write(markdown)
  print(markdown)


if __name__ == "__main__":
  if os.path.dirname(os.path.abspath(__file__)) in sys.path:  # run as a script:
    sys.path.remove(os.path.dirname(os.path.abspath(__file__)))  # not the package's folder
  main()
