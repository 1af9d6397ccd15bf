"""Input benchmarks: one worker's training input before and after the planned stream, what
each of N localhost workers reads, the plan of a WMT14-sized corpus, and the data position's
bytes in a checkpoint. Each configuration runs in its own process.

    python -m benchmarks.input [--quick] --data_dir=data/multi30k_ende

The "before" pipeline is the tf.data one the trainer used until the planned stream replaced
it (interleaved shards, a 20,000-example shuffle buffer, tensor2tensor's length buckets),
rebuilt here from t2t_lite.data.eval_input's parts as the reference.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import time

from benchmarks.common import REPO, import_tf, peak_rss_mib, run_worker, worker_main

MODULE = "benchmarks.input"
HPARAMS_SET = "transformer_multi30k_cpu"
PROBLEM = "translate_ende_multi30k"
SHUFFLE_BUFFER = 20000  # the set's shuffle_buffer_size before the planned stream


def reference_pipeline(files: list[str], hparams, seed: int):
  """The tf.data training input of before: every shard read in turn, a window shuffle, the
  length buckets; endless."""
  tf = import_tf()
  from t2t_lite.data import eval_input
  dataset = tf.data.Dataset.from_tensor_slices(files).interleave(
      tf.data.TFRecordDataset, cycle_length=len(files), block_length=1,
      num_parallel_calls=len(files), deterministic=True)
  dataset = dataset.map(eval_input.parse_example, num_parallel_calls=tf.data.AUTOTUNE,
                        deterministic=True)
  dataset = dataset.filter(lambda ex: tf.maximum(tf.shape(ex["inputs"])[0],
                                                 tf.shape(ex["targets"])[0])
                           <= hparams.max_length)
  dataset = dataset.shuffle(SHUFFLE_BUFFER, seed=seed).repeat()
  return eval_input.batched(dataset, hparams.batch_size, hparams.max_length,
                      hparams.min_length_bucket, hparams.length_bucket_step
                      ).prefetch(tf.data.AUTOTUNE)


def _padding(batch, totals) -> None:
  for side in ("inputs", "targets"):
    array = batch[side]
    totals[0] += int((array == 0).sum())
    totals[1] += array.size


def worker_before(spec: dict) -> dict:
  """The tf.data pipeline: examples/s and micro-batches/s of one replica's input, padding,
  and the bytes of its iterator in a checkpoint."""
  tf = import_tf()
  from t2t_lite.core import registry
  hparams = registry.hparams(HPARAMS_SET)
  files = registry.problem(PROBLEM).data_files(spec["data_dir"], "train")
  iterator = iter(reference_pipeline(files, hparams, seed=1))
  for _ in range(20):
    next(iterator)
  examples, totals, start = 0, [0, 0], time.perf_counter()
  for _ in range(spec["batches"]):
    batch = next(iterator)
    examples += int(batch["targets"].shape[0])
    _padding({k: v.numpy() for k, v in batch.items()}, totals)
  seconds = time.perf_counter() - start
  with tempfile.TemporaryDirectory() as folder:
    path = tf.train.Checkpoint(iterator=iterator).write(os.path.join(folder, "ckpt"))
    iterator_bytes = sum(os.path.getsize(os.path.join(folder, name))
                         for name in os.listdir(folder) if name.startswith("ckpt"))
    del path
  return {"examples_per_second": examples / seconds,
          "batches_per_second": spec["batches"] / seconds,
          "padding_fraction": totals[0] / totals[1], "iterator_bytes": iterator_bytes}


def worker_after(spec: dict) -> dict:
  """The planned stream: the same figures for one replica of `replicas` (each worker reads
  its own batches only), with the tensors the trainer makes of them."""
  tf = import_tf()
  from t2t_lite.core import registry
  from t2t_lite.data.stream import Batching, TrainingStream
  hparams = registry.hparams(HPARAMS_SET)
  store = registry.problem(PROBLEM).training_store(spec["data_dir"], "train")
  start = time.perf_counter()
  stream = TrainingStream([store], Batching.of(hparams), 1, spec["replicas"], [0])
  plan_seconds = time.perf_counter() - start
  for micro_step in range(20):
    stream.micro_batches(micro_step)
  examples, totals, start = stream.examples_read, [0, 0], time.perf_counter()
  for micro_step in range(20, 20 + spec["batches"]):
    (batch,) = stream.micro_batches(micro_step)
    {name: tf.constant(value) for name, value in batch.items()}
    _padding(batch, totals)
  seconds = time.perf_counter() - start
  stream.close()
  return {"examples_per_second": (stream.examples_read - examples) / seconds,
          "batches_per_second": spec["batches"] / seconds, "plan_seconds": plan_seconds,
          "padding_fraction": totals[0] / totals[1]}


def worker_plan(spec: dict) -> dict:
  """The plan of `pairs` synthetic pairs (lengths as Multi30k's, scaled to WMT14's mean):
  seconds to plan the first epoch and read its first batch's indices, and the memory the
  plan holds."""
  import numpy as np
  from t2t_lite.core import registry
  from t2t_lite.data.stream import Batching, SplitPlan
  rng = np.random.default_rng(0)
  lengths = np.clip(rng.lognormal(3.3, 0.55, size=(spec["pairs"], 2)), 2, 400).astype(np.int32)
  before = peak_rss_mib()
  start = time.perf_counter()
  plan = SplitPlan(lengths, Batching.of(registry.hparams("transformer_base")), 1, 0)
  plan.batch(0)
  seconds = time.perf_counter() - start
  held = plan.nbytes
  return {"pairs": spec["pairs"], "seconds": seconds, "batches": plan.batches_per_epoch,
          "plan_mib": held / 2 ** 20, "lengths_mib": lengths.nbytes / 2 ** 20,
          "peak_rss_growth_mib": peak_rss_mib() - before}


def worker_cluster(spec: dict) -> dict:
  """`workers` localhost trainer processes (transformer_tiny, 4 micro-batches an update
  whatever the count), `updates` updates: the examples and micro-batches each read."""
  from benchmarks.common import free_ports
  flags = ["--problem=" + PROBLEM, "--hparams_set=transformer_tiny",
           "--hparams=batch_size=512,max_length=64,optimizer_multistep_accumulate_steps="
           f"{4 // spec['workers']}", f"--data_dir={spec['data_dir']}",
           f"--train_steps={spec['updates']}", "--local_eval_frequency=0",
           "--save_checkpoints_steps=0", "--log_every=0"]
  with tempfile.TemporaryDirectory() as folder:
    flags.append(f"--output_dir={folder}/run")
    trainer = os.path.join(os.path.dirname(sys.executable), "t2t-lite-trainer")
    if spec["workers"] == 1:
      commands, envs = [[trainer, *flags]], [dict(os.environ)]
    else:
      cluster = {"worker": [f"127.0.0.1:{p}" for p in free_ports(spec["workers"])]}
      commands = [[trainer, "--strategy=multi_worker", *flags]] * spec["workers"]
      envs = [dict(os.environ, TF_CONFIG=json.dumps(
          {"cluster": cluster, "task": {"type": "worker", "index": index}}))
          for index in range(spec["workers"])]
    processes = [subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.PIPE, text=True, cwd=REPO)
                 for command, env in zip(commands, envs)]
    logs = [p.communicate(timeout=600)[1] for p in processes]
  read = []
  for process, log in zip(processes, logs):
    found = re.search(r"this process read (\d+) examples in (\d+) micro-batches", log)
    if process.returncode or not found:
      return {"error": (log.strip().splitlines() or ["failed"])[-1]}
    read.append([int(found.group(1)), int(found.group(2))])
  return {"workers": spec["workers"], "updates": spec["updates"], "read": read}


WORKERS = {"before": worker_before, "after": worker_after, "plan": worker_plan,
           "cluster": worker_cluster}


def suite(quick: bool, data_dir: str) -> list[tuple[str, dict]]:
  batches = 20 if quick else 400
  specs = [("input/before", {"kind": "before", "data_dir": data_dir, "batches": batches})]
  for replicas in (1, 64):
    specs.append((f"input/after/replicas={replicas}", {
        "kind": "after", "data_dir": data_dir, "batches": batches, "replicas": replicas}))
  specs.append(("input/plan", {"kind": "plan", "pairs": 50_000 if quick else 4_500_000}))
  for workers in (1, 2, 4):
    specs.append((f"input/workers={workers}", {"kind": "cluster", "data_dir": data_dir,
                                               "workers": workers,
                                               "updates": 2 if quick else 10}))
  return specs


def table_rows(results: dict) -> list[str]:
  rows = []
  before = results.get("input/before", {})
  for replicas in (1, 64):
    after = results.get(f"input/after/replicas={replicas}", {})
    if "examples_per_second" not in after or "examples_per_second" not in before:
      continue
    # Before, every process parsed every replica's micro-batches: a micro-step's input took
    # `replicas` batches' time; now one.
    seconds_before = replicas / before["batches_per_second"]
    seconds_after = 1 / after["batches_per_second"]
    rows.append(f"| input of one worker's micro-step at {replicas} replica(s), {HPARAMS_SET}: "
                f"before / after (examples/s, micro-batches/s of the pipeline) | "
                f"{seconds_before * 1e3:.1f} / {seconds_after * 1e3:.2f} ms "
                f"({seconds_before / seconds_after:.0f}x; {before['examples_per_second']:.0f}, "
                f"{before['batches_per_second']:.1f} / {after['examples_per_second']:.0f}, "
                f"{after['batches_per_second']:.1f}) |")
  after = results.get("input/after/replicas=1", {})
  if "padding_fraction" in before and "padding_fraction" in after:
    rows.append(f"| training padding, before / after | {before['padding_fraction']:.1%} / "
                f"{after['padding_fraction']:.1%} |")
  if "iterator_bytes" in before:
    rows.append(f"| the data position in a checkpoint, before / after | tf.data iterator "
                f"{before['iterator_bytes'] / 2 ** 20:.1f} MiB / two int64 scalars (micro-step "
                "counter, sampling switch) |")
  plan = results.get("input/plan", {})
  if "seconds" in plan:
    rows.append(f"| plan of {plan['pairs']:,} synthetic pairs (transformer_base batches): time, "
                f"memory held (lengths) | {plan['seconds']:.2f} s for {plan['batches']:,} "
                f"batches, {plan['plan_mib']:.0f} MiB ({plan['lengths_mib']:.0f} MiB) |")
  cells, updates = [], 0
  for workers in (1, 2, 4):
    run = results.get(f"input/workers={workers}", {})
    if "read" in run:
      read, updates = [examples for examples, _ in run["read"]], run["updates"]
      cells.append(f"{workers}: {' + '.join(map(str, read))} = {sum(read)}")
  if cells:
    rows.append(f"| examples read in {updates} updates by each of N localhost workers "
                f"(transformer_tiny, 4 micro-batches an update) | {'; '.join(cells)} |")
  return rows


def measure(quick: bool, data_dir: str | None) -> dict:
  results = {}
  if not data_dir:
    return results
  for name, spec in suite(quick, data_dir):
    results[name] = run_worker(MODULE, spec)
    print(f"{name}: {json.dumps(results[name])}", flush=True)
  return results


if __name__ == "__main__" and not worker_main(WORKERS):
  import argparse
  parser = argparse.ArgumentParser()
  parser.add_argument("--quick", action="store_true")
  parser.add_argument("--data_dir", default="data/multi30k_ende")
  args = parser.parse_args()
  print("\n".join(table_rows(measure(args.quick, args.data_dir))))
