"""Choosing a tf.distribute strategy: one device, several GPUs, or a cluster of workers."""

from __future__ import annotations

import json
import os

import tensorflow as tf
from absl import logging

from t2t_lite.errors import UsageError

STRATEGIES = ("auto", "one_device", "mirrored", "multi_worker")


def split_cpu(replicas: int) -> None:
  """Splits the CPU into `replicas` logical devices (to run mirrored training on a CPU)."""
  if replicas > 1:
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration() for _ in range(replicas)])


def cluster_resolver():
  """TF_CONFIG when set, else a Slurm allocation."""
  if os.environ.get("TF_CONFIG"):
    return tf.distribute.cluster_resolver.TFConfigClusterResolver()
  if os.environ.get("SLURM_JOB_ID"):
    return tf.distribute.cluster_resolver.SlurmClusterResolver()
  raise UsageError("--strategy=multi_worker needs a cluster: set TF_CONFIG (see "
                   "data_scripts/local_workers.sh) or run inside a Slurm allocation")


def make_strategy(name: str, cpu_replicas: int = 1) -> tuple[tf.distribute.Strategy, bool, str]:
  """(strategy, is_chief, this task's name). Call before any other TensorFlow work."""
  if name not in STRATEGIES:
    raise UsageError(f"--strategy={name} is not one of {', '.join(STRATEGIES)}")
  if name == "multi_worker":
    resolver = cluster_resolver()
    strategy = tf.distribute.MultiWorkerMirroredStrategy(cluster_resolver=resolver)
    task_type, task_id = resolver.task_type, resolver.task_id
    is_chief = task_type in ("chief", None) or (
        task_type == "worker" and task_id == 0 and "chief" not in resolver.cluster_spec().jobs)
    return strategy, is_chief, f"{task_type}-{task_id}"
  split_cpu(cpu_replicas)
  gpus = tf.config.list_logical_devices("GPU")
  if name == "mirrored" or (name == "auto" and len(gpus) > 1):
    devices = [d.name for d in gpus] or [d.name for d in tf.config.list_logical_devices("CPU")]
    strategy = tf.distribute.MirroredStrategy(devices)
    logging.info("MirroredStrategy over %s", devices)
    return strategy, True, "chief"
  return tf.distribute.get_strategy(), True, "chief"


def planned_replicas(name: str, cpu_replicas: int = 1) -> int:
  """Replicas a strategy would have, without starting it (for --dry_run)."""
  gpus = len(tf.config.list_physical_devices("GPU"))
  if name == "multi_worker":
    config = json.loads(os.environ.get("TF_CONFIG", "{}") or "{}")
    workers = sum(len(v) for k, v in config.get("cluster", {}).items() if k in ("chief", "worker"))
    return max(workers, int(os.environ.get("SLURM_NTASKS", "1"))) * max(gpus, 1)
  if name == "mirrored" or (name == "auto" and gpus > 1):
    return gpus if gpus else max(cpu_replicas, 1)
  return 1
