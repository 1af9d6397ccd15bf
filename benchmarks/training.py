"""Training benchmarks: memory against accumulate steps, speed (precision, XLA, n), a profile
of a micro-step, device reads per update, the Keras comparison, the mirrored update, packed
all-reduces on two workers (the input: benchmarks/input.py). Each configuration runs in its
own process.

    python -m benchmarks.training [--quick] [--data_dir=data/multi30k_ende]

`make bench` runs this and benchmarks/decoding.py (see benchmarks/run.py).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time

from benchmarks.common import (REPO, free_ports, import_tf, peak_rss_mib, run_worker,
                               synthetic_batch, worker_main)

MODULE = "benchmarks.training"


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
  tf = import_tf()
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
    from t2t_lite.core import registry
    from t2t_lite.training.learner import Learner
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
    tf = import_tf()
    from t2t_lite.models.transformer import compute_dtype
    tokens = self.rows * self.length * micro_steps
    flops = matmul_flops_per_batch(self.hparams, self.vocab, self.rows, self.length,
                                   self.length) * micro_steps
    result = {"tokens_per_second": tokens / seconds, "model_flops_per_second": flops / seconds,
              "peak_rss_mib": peak_rss_mib(), "compute_dtype": compute_dtype(self.hparams).name,
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


def worker_ema_speed(spec: dict) -> dict:
  """Tokens/s with the moving average of the weights on and off, in one process: blocks of
  micro-steps alternate between the two learners (the same batches), so a drift of the
  machine's pace falls on both; the medians of the blocks' rates and their ratio."""
  on = _TrainMeasure({**spec, "hparams": f"{spec.get('hparams', '')},ema_decay=0.999"
                      .lstrip(",")})
  off = _TrainMeasure(spec)
  rates = {"on": [], "off": []}
  tokens = spec["rows"] * spec["length"] * spec["micro_steps"]
  for _ in range(spec["rounds"]):
    for name, measure in (("off", off), ("on", on)):
      rates[name].append(tokens / measure.block(spec["micro_steps"]))
  median = {name: sorted(values)[len(values) // 2] for name, values in rates.items()}
  return {"tokens_per_second_on": median["on"], "tokens_per_second_off": median["off"],
          "ratio": median["on"] / median["off"], "rounds": spec["rounds"],
          "moving_average_mib": on.learner.state_bytes()["moving_average"] / 2 ** 20,
          "compute_dtype": on.result(1, 1.0)["compute_dtype"]}


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
        group = ("matmul" if "MatMul" in op_type or op_type == "Einsum"
                 else found.group(1) if found else "other")
        groups[group] += event.duration_ps * 1e-12
        types[op_type] = types.get(op_type, 0.0) + event.duration_ps * 1e-12
  return groups, types, executing


def worker_profile(spec: dict) -> dict:
  """Where a micro-step's time goes: TensorFlow's profiler over `micro_steps` steady-state
  micro-steps; op time by group and by op type (shares of all op time; ops running at once on
  several cores overlap), and the host's share (wall time no step function was executing)."""
  import glob
  import tempfile
  tf = import_tf()
  measure = _TrainMeasure({**spec, "warmup_micro_steps": 2 * spec["n"]})
  with tempfile.TemporaryDirectory() as logdir:
    tf.profiler.experimental.start(logdir)
    wall = measure.block(spec["micro_steps"])
    tf.profiler.experimental.stop()
    groups, types, executing = op_breakdown(sorted(glob.glob(
        os.path.join(logdir, "**", "*.xplane.pb"), recursive=True))[-1])
  total = sum(groups.values())
  top = sorted(types.items(), key=lambda item: -item[1])[:8]
  return {"seconds_per_micro_step": wall / spec["micro_steps"],
          "host_share": max(0.0, 1.0 - executing / wall),
          "shares": {k: v / total for k, v in groups.items()},
          "op_types": {k: v / total for k, v in top}}


@contextlib.contextmanager
def counting_host_reads():
  """Counts the device values read to the host meanwhile: every .numpy(), float(), int() or
  bool() of an eager tensor or variable goes through TensorFlow's _EagerTensorBase._numpy,
  which this wraps for the duration (TensorFlow offers no counter of its own; t2t-lite is
  not touched)."""
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


def host_reads_by_update(make_trainer) -> tuple[dict, object]:
  """Builds a Trainer with `make_trainer(after_update)`, trains it, and counts the device
  reads of each update (its micro-steps and the loop's work after them), through the
  Trainer's after_update hook. Returns ({"between_log_lines": [reads of each update with no
  log line], "log_lines": [... of each update with one]}, the trainer). The first update
  (restore, first traces) and the last (the stop's log line and save) are not counted."""
  marks = []
  with counting_host_reads() as counter:
    trainer = make_trainer(lambda tried: marks.append((tried, counter["reads"])))
    trainer.train()
  log_every = trainer.options.log_every
  between, at = [], []
  for (_, before), (update, after) in zip(marks[:-1], marks[1:-1]):
    (at if update % log_every == 0 else between).append(after - before)
  return {"between_log_lines": between, "log_lines": at}, trainer


def worker_host_syncs(spec: dict) -> dict:
  """Device reads per update of the training loop (transformer_tiny on the problem's data):
  none between log lines is the target."""
  import_tf()
  from t2t_lite.core import registry
  from t2t_lite.training import steps
  from t2t_lite.training.options import Checkpointing, Evaluation
  from t2t_lite.training.options import RunOptions
  from t2t_lite.training.loop import Trainer
  import tempfile
  hparams = registry.hparams("transformer_tiny")
  hparams.parse(f"batch_size=512,max_length=64,optimizer_multistep_accumulate_steps={spec['n']}")
  with tempfile.TemporaryDirectory() as output_dir:
    options = RunOptions(output_dir=output_dir, data_dir=spec["data_dir"], log_every=4,
                         checkpointing=Checkpointing(save_steps=0),
                         evaluation=Evaluation(frequency=0))
    reads, _ = host_reads_by_update(lambda hook: Trainer(
        hparams, registry.problem("translate_ende_multi30k"),
        steps.run_steps(hparams, 1, spec.get("updates", 13)), options, after_update=hook))
  return {"between_log_lines": sum(reads["between_log_lines"]) / len(reads["between_log_lines"]),
          "at_log_lines": sum(reads["log_lines"]) / len(reads["log_lines"])}


def worker_mirrored(spec: dict) -> dict:
  """2 logical CPU devices under MirroredStrategy: the update applied on each device (see
  equivalence.mirrored_against_single)."""
  import_tf()
  from t2t_lite.cluster.distribute import split_cpu
  split_cpu(2)
  from t2t_lite.core import registry
  from t2t_lite.training.equivalence import mirrored_against_single
  hparams = registry.hparams("transformer_tiny")
  hparams.parse("layer_prepostprocess_dropout=0,attention_dropout=0,relu_dropout=0,"
                "learning_rate_schedule=constant,learning_rate_constant=1e-4")
  return mirrored_against_single(hparams)


def worker_keras(spec: dict) -> dict:
  """Keras 3 Adam(gradient_accumulation_steps=n) against ours, on ragged micro-batches."""
  tf = import_tf()
  import keras
  from t2t_lite.core import registry
  from t2t_lite.training.equivalence import concat, ragged_batches, relative_difference
  from t2t_lite.training.learner import Learner
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
  tf = import_tf()
  import keras
  from t2t_lite.core import registry
  from t2t_lite.training.learner import Learner
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
          "peak_rss_mib": peak_rss_mib()}


def worker_cluster_member(spec: dict) -> dict:
  """One of two workers (TF_CONFIG set by worker_cluster): seconds per update at n=1 and the
  collective ops of its cross-replica sum, with the sums packed or one per tensor."""
  tf = import_tf()
  from t2t_lite.training import learner as learner_lib
  from t2t_lite.core import registry
  strategy = tf.distribute.MultiWorkerMirroredStrategy()
  hparams = registry.hparams(spec["hparams_set"])
  # Packs of at least 1 byte: every tensor its own all-reduce.
  learner = learner_lib.Learner(hparams, spec["vocab"], 1, seed=1, strategy=strategy,
                                pack_bytes=learner_lib.PACK_BYTES if spec["packed"] else 1)
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
  results = {}
  for packed in (True, False):
    cluster = {"worker": [f"127.0.0.1:{port}" for port in free_ports(2)]}
    member = json.dumps({**spec, "kind": "cluster_member", "packed": packed})
    processes = [subprocess.Popen(
        [sys.executable, "-m", MODULE, "--worker", member], cwd=REPO,
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
           "profile": worker_profile,
           "host_syncs": worker_host_syncs, "mirrored": worker_mirrored,
           "ema_speed": worker_ema_speed}


def suite(quick: bool, data_dir: str | None):
  """The configurations: (name, spec). `quick` shrinks them to seconds (for the tests). The
  host-sync rows need a datagen directory of Multi30k en-de (`data_dir`)."""
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
  for label, config in (("transformer_multi30k_cpu", cpu), ("transformer_base", base)):
    specs.append((f"memory/{label}/n=1/ema", {
        "kind": "train", **config, "n": 1, "warmup_micro_steps": 0, "micro_steps": 1,
        "hparams": f"{config.get('hparams', '')},ema_decay=0.999".lstrip(",")}))
    specs.append((f"memory/{label}/n=2/frozen", {
        "kind": "train", **config, "n": 2, "warmup_micro_steps": 0, "micro_steps": 2,
        "hparams": f"{config.get('hparams', '')},frozen_parts=embeddings;encoder".lstrip(",")}))
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
  specs.append(("speed/n=1/ema", {"kind": "ema_speed", **cpu, "n": 1, "warmup_micro_steps": 2,
                                  "micro_steps": 2 if quick else 8,
                                  "rounds": 2 if quick else 7}))
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
  return specs


def profile_sync_mirrored_rows(results: dict) -> list[str]:
  """The profile of a micro-step, device reads per update, and the mirrored-update check."""
  rows = []
  p = results.get("profile/n=1", {})
  if "shares" in p:
    shares = ", ".join(f"{k} {v:.0%}" for k, v in p["shares"].items() if v >= 0.005)
    types = ", ".join(f"{k} {v:.0%}" for k, v in p["op_types"].items())
    rows.append(f"| profile of a micro-step: {p['seconds_per_micro_step']:.2f} s; host "
                f"{p['host_share']:.1%} | op time by scope: {shares}; by op type: {types} |")
  for n in (1, 4):
    now = results.get(f"host_syncs/n={n}", {})
    if "between_log_lines" in now:
      rows.append(f"| device reads per update, n={n}: between log lines / at a log line | "
                  f"{now['between_log_lines']:.1f} / {now['at_log_lines']:.1f} |")
  m = results.get("mirrored", {})
  if "apply_ops" in m:
    devices = ", ".join(f"{d.rsplit('/', 1)[-1]}: {c}" for d, c in sorted(m["apply_ops"].items()))
    rows.append(f"| mirrored update, 2 CPU devices: fused Adam kernels per device "
                f"({m['variables']} variables); parameters vs 1 device (rel.) | {devices}; "
                f"{m['relative_difference']:.1e} |")
  return rows


def memory_rows(results: dict) -> list[str]:
  """Memory by accumulate steps, with the moving average and with frozen parts."""
  rows = []
  for label in ("transformer_multi30k_cpu", "transformer_base"):
    one = results.get(f"memory/{label}/n=1", {})
    if "peak_rss_mib" not in one:
      continue
    acc = results.get(f"memory/{label}/n=2", {}).get("accumulators_mib", 0.0)
    rows.append(f"| {label}: parameters / Adam slots / accumulators (n>1) | "
                f"{one['parameters_mib']:.1f} / {one['adam_slots_mib']:.1f} / {acc:.1f} MiB |")
    ema = results.get(f"memory/{label}/n=1/ema", {})
    if "peak_rss_mib" in ema:
      delta = ema["peak_rss_mib"] - one["peak_rss_mib"]
      rows.append(f"| {label}: peak RSS at n=1 with the moving average of the weights | "
                  f"{ema['peak_rss_mib']:.0f} MiB ({delta:+.0f} vs without; the average: "
                  f"{ema['moving_average_mib']:.1f} MiB) |")
    frozen, two = (results.get(f"memory/{label}/n=2/frozen", {}),
                   results.get(f"memory/{label}/n=2", {}))
    if "peak_rss_mib" in frozen and "peak_rss_mib" in two:
      rows.append(f"| {label}, n=2, frozen_parts=embeddings;encoder: peak RSS; Adam slots / "
                  f"accumulators | {frozen['peak_rss_mib']:.0f} MiB "
                  f"({frozen['peak_rss_mib'] - two['peak_rss_mib']:+.0f} vs nothing frozen); "
                  f"{frozen['adam_slots_mib']:.1f} / {frozen['accumulators_mib']:.1f} MiB "
                  f"(against {two['adam_slots_mib']:.1f} / {two['accumulators_mib']:.1f}) |")
    for name, result in results.items():
      if (name.startswith(f"memory/{label}/") and not name.endswith(("/ema", "/frozen"))
          and "peak_rss_mib" in result):
        n = name.rsplit("=", 1)[1]
        if n == "1":
          rows.append(f"| {label}: peak RSS at n=1 | {result['peak_rss_mib']:.0f} MiB |")
          continue
        delta = result["peak_rss_mib"] - one["peak_rss_mib"]
        budget = acc + 0.05 * one["peak_rss_mib"]
        verdict = "within target" if delta <= budget else "OVER target"
        rows.append(f"| {label}: peak RSS at n={n} | {result['peak_rss_mib']:.0f} MiB "
                    f"({delta:+.0f} vs n=1; target <= +{budget:.0f}: {verdict}) |")
  return rows


def table(results: dict) -> str:
  rows = ["| measurement | figure |", "|---|---|", *memory_rows(results)]
  s1, s8 = results.get("speed/n=1", {}), results.get("speed/n=8", {})
  if "tokens_per_second" in s1 and "tokens_per_second" in s8:
    rows.append(f"| tokens/s n=1 / n=8 (same batch) | {s1['tokens_per_second']:.0f} / "
                f"{s8['tokens_per_second']:.0f} "
                f"(ratio {s8['tokens_per_second'] / s1['tokens_per_second']:.3f}) |")
    for name in ("speed/n=1/float32", "speed/n=1/mixed_precision"):
      r = results.get(name, {})
      if "tokens_per_second" in r:
        mfu = r["model_flops_per_second"] / r["matmul_float32_flops_per_second"]
        rows.append(f"| {name.split('/')[-1]} ({r['compute_dtype']}): tokens/s, model FLOP/s "
                    f"/ float32 matmul FLOP/s | {r['tokens_per_second']:.0f}, "
                    f"{r['model_flops_per_second'] / 1e9:.0f} / "
                    f"{r['matmul_float32_flops_per_second'] / 1e9:.0f} GFLOP/s = {mfu:.0%} |")
    ema = results.get("speed/n=1/ema", {})
    if "ratio" in ema:
      verdict = "within target" if ema["ratio"] >= 0.97 else "OVER target"
      rows.append(f"| moving average of the weights ({ema['compute_dtype']}, n=1): tokens/s "
                  f"on / off, median of {ema['rounds']} alternating blocks | "
                  f"{ema['tokens_per_second_on']:.0f} / {ema['tokens_per_second_off']:.0f} "
                  f"({ema['ratio']:.3f}; target >= 0.97: {verdict}) |")
    xla = results.get("speed/n=1/xla", {})
    if "tokens_per_second" in xla:
      rows.append(f"| --xla_compile ({xla['compute_dtype']}, n=1): tokens/s with / without | "
                  f"{xla['tokens_per_second']:.0f} / {s1['tokens_per_second']:.0f} "
                  f"({xla['tokens_per_second'] / s1['tokens_per_second']:.2f}x) |")
  rows.extend(profile_sync_mirrored_rows(results))
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
  c = results.get("two_workers/transformer_tiny/n=1", {})
  if "packed" in c and "per_tensor" in c:
    packed, per_tensor = c["packed"], c["per_tensor"]
    rows.append(f"| 2 local workers, transformer_tiny n=1 ({packed['variables']} variables): "
                f"collective ops and s/update, packed / one per tensor | "
                f"{packed['collective_ops']}, {packed['seconds_per_update']:.3f} s / "
                f"{per_tensor['collective_ops']}, {per_tensor['seconds_per_update']:.3f} s "
                f"({per_tensor['seconds_per_update'] / packed['seconds_per_update']:.1f}x) |")
  return "\n".join(rows) + "\n"


def measure(quick: bool, data_dir: str | None) -> dict:
  """Runs the suite, one process a configuration, printing each result as it comes."""
  results = {}
  for name, spec in suite(quick, data_dir):
    results[name] = run_worker(MODULE, spec)
    print(f"{name}: {json.dumps(results[name])}", flush=True)
  return results


if __name__ == "__main__" and not worker_main(WORKERS):
  from benchmarks import run
  run.main(["--training_only", *sys.argv[1:]])
