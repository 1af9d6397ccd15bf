"""Choosing a tf.distribute strategy: one device, several GPUs, or a cluster of workers."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import re
import secrets
import shutil
import sys
import time

import tensorflow as tf
from absl import logging

from t2t_lite.core.errors import RunError, UsageError

STRATEGIES = ("auto", "one_device", "mirrored", "multi_worker")
_joined_as = None  # this process's task name, once it joined a cluster (make_strategy)
# A worker other than the chief leaves its process at once when it ends, failed or not (see
# leave_cluster and exit_now): Python's exit finalizers can deadlock on the thread pool of
# TensorFlow's collectives once its cluster is gone (seen: a worker hung after its one-line
# error, in multiprocessing's pool finalizer).
_left_at_exit = False


def exit_now(code: int) -> None:
  """Ends a worker other than the chief with `code` without Python's exit finalizers (see
  _left_at_exit); returns in any other process."""
  if _left_at_exit:
    sys.stdout.flush()
    sys.stderr.flush()
    logging.flush()
    os._exit(code)


def split_cpu(replicas: int) -> None:
  """Splits the CPU into `replicas` logical devices (to run mirrored training on a CPU)."""
  if replicas > 1:
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration() for _ in range(replicas)])


@functools.cache
def cluster_resolver(slurm_port_base: int = 8888):
  """TF_CONFIG when set, else a Slurm allocation (one resolver per process).

  Under Slurm, each task's GPUs are chosen by setting CUDA_VISIBLE_DEVICES, which only takes
  effect before TensorFlow first lists the devices: the trainer calls this before that.
  Tasks of one node listen on ports slurm_port_base, slurm_port_base + 1, ...
  """
  if os.environ.get("TF_CONFIG"):
    return tf.distribute.cluster_resolver.TFConfigClusterResolver()
  if os.environ.get("SLURM_JOB_ID"):
    for name in ("SLURM_PROCID", "SLURM_STEP_NUM_TASKS", "SLURM_STEP_NODELIST",
                 "SLURM_STEP_TASKS_PER_NODE"):
      if name not in os.environ:
        raise UsageError(f"--strategy=multi_worker under Slurm needs {name}: start the "
                         "trainer with srun inside the allocation (see "
                         "data_scripts/slurm_transformer_base.sbatch)")
    gpu_split = {}
    if "CUDA_VISIBLE_DEVICES" not in os.environ and shutil.which("nvidia-smi") is None:
      # CPU nodes: the resolver would ask nvidia-smi for GPUs to split among the tasks.
      tasks = int(os.environ["SLURM_STEP_NUM_TASKS"])
      gpu_split = dict(gpus_per_node=tasks, gpus_per_task=1, auto_set_gpu=False)
    try:
      resolver = tf.distribute.cluster_resolver.SlurmClusterResolver(
          port_base=slurm_port_base, **gpu_split)
      resolver.cluster_spec()  # sets this task's CUDA_VISIBLE_DEVICES and its task type / id
    except (RuntimeError, ValueError) as err:
      gpus = os.environ.get("CUDA_VISIBLE_DEVICES")
      gpus = f"{len(gpus.split(','))} GPU(s)" if gpus else "GPUs"
      raise UsageError(f"cannot split this node's {gpus} among its "
                       f"{os.environ['SLURM_STEP_TASKS_PER_NODE']} Slurm task(s) per node "
                       f"({err}); start one task per node or one per GPU") from None
    return resolver
  raise UsageError("--strategy=multi_worker needs a cluster: set TF_CONFIG (see "
                   "data_scripts/local_workers.sh) or run inside a Slurm allocation")


def make_strategy(name: str, cpu_replicas: int = 1,
                  slurm_port_base: int = 8888) -> tuple[tf.distribute.Strategy, bool, str]:
  """(strategy, is_chief, this task's name). Call before any other TensorFlow work."""
  if name not in STRATEGIES:
    raise UsageError(f"--strategy={name} is not one of {', '.join(STRATEGIES)}")
  if name == "multi_worker":
    global _joined_as
    resolver = cluster_resolver(slurm_port_base)
    strategy = tf.distribute.MultiWorkerMirroredStrategy(cluster_resolver=resolver)
    task_type, task_id = resolver.task_type, resolver.task_id
    is_chief = task_type in ("chief", None) or (
        task_type == "worker" and task_id == 0 and "chief" not in resolver.cluster_spec().jobs)
    _joined_as = f"{task_type}-{task_id}"
    if not is_chief:
      global _left_at_exit
      _left_at_exit = True
    return strategy, is_chief, _joined_as
  split_cpu(cpu_replicas)
  gpus = tf.config.list_logical_devices("GPU")
  if name == "mirrored" or (name == "auto" and len(gpus) > 1):
    devices = [d.name for d in gpus] or [d.name for d in tf.config.list_logical_devices("CPU")]
    strategy = tf.distribute.MirroredStrategy(devices)
    logging.info("MirroredStrategy over %s", devices)
    return strategy, True, "chief"
  return tf.distribute.get_strategy(), True, "chief"


def local_replica_ids(strategy: tf.distribute.Strategy) -> list[int]:
  """The replica numbers (in the whole cluster) of this process's devices."""
  ids = strategy.experimental_distribute_values_from_function(
      lambda context: context.replica_id_in_sync_group)
  return [int(i) for i in strategy.experimental_local_results(ids)]


def tasks_per_node(spec: str) -> list[int]:
  """Slurm's tasks-per-node list, e.g. '2(x3),1' -> [2, 2, 2, 1]."""
  counts = []
  for part in spec.split(","):
    found = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part.strip())
    if not found:
      raise UsageError(f"cannot read Slurm's tasks per node {spec!r}")
    counts += [int(found.group(1))] * int(found.group(2) or 1)
  return counts


def planned_replicas(name: str, cpu_replicas: int = 1) -> int:
  """Replicas a strategy would have, without starting it (for --dry_run)."""
  gpus = len(tf.config.list_physical_devices("GPU"))
  if name == "multi_worker":
    config = json.loads(os.environ.get("TF_CONFIG", "{}") or "{}")
    workers = sum(len(v) for k, v in config.get("cluster", {}).items() if k in ("chief", "worker"))
    if workers or not os.environ.get("SLURM_JOB_ID"):
      return max(workers, 1) * max(gpus, 1)
    # Slurm: as the resolver splits them, each task gets this node's GPUs divided by the
    # most tasks any node runs (CPU-only nodes: one replica per task).
    tasks = int(os.environ.get("SLURM_STEP_NUM_TASKS") or os.environ.get("SLURM_NTASKS", "1"))
    per_node = tasks_per_node(os.environ.get("SLURM_STEP_TASKS_PER_NODE")
                              or os.environ.get("SLURM_TASKS_PER_NODE") or str(tasks))
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    node_gpus = len(visible.split(",")) if visible else gpus
    return tasks * max(node_gpus // max(per_node), 1)
  if name == "mirrored" or (name == "auto" and gpus > 1):
    return gpus if gpus else max(cpu_replicas, 1)
  return 1


# --- one worker's failure is every worker's ------------------------------------------------
# A worker that fails tells the cluster through TensorFlow's coordination service, which
# aborts every collective the other workers are in or enter next, with the message. A worker
# that is killed stops sending heartbeats; the coordination service notices within its
# heartbeat timeout (about 10 s) and aborts the others' collectives the same way.

def _first_line(err: BaseException) -> str:
  text = str(err).strip()
  return text.splitlines()[0] if text else type(err).__name__


def report_failure(task: str, err: BaseException) -> str:
  """Tells every worker of the cluster that `task` failed with `err`; the one-line message."""
  message = f"{task}: {_first_line(err)}"
  from tensorflow.python.eager import context  # no public API reports an error to the cluster
  try:
    context.context().report_error_to_cluster(2, message)  # 2: UNKNOWN
  except Exception as failure:  # noqa: BLE001  (the cluster may be gone already)
    logging.warning("could not tell the other workers: %s", _first_line(failure))
  return message


def _task_name(job: str, index: str) -> str:
  return f"{job}-{index}"


def peer_failure(err: BaseException) -> str | None:
  """Why a collective was aborted by another worker's failure or absence, or None when
  `err` is not that."""
  if not isinstance(err, tf.errors.OpError):
    return None
  text = str(err)
  if "Collective" not in text and "coordination service" not in text.lower():
    return None  # this worker's own error (its data or disk, say), reported as such
  reported = re.search(r"Error reported from /job:(\w+)/(?:replica:\d+/)?task:(\d+): (.*)", text)
  unhealthy = re.search(r"stopped sending heartbeats\):\s*/job:(\w+)/replica:\d+/task:(\d+)",
                        text)
  if unhealthy:
    return (f"{_task_name(*unhealthy.groups())} went away (it stopped sending heartbeats: "
            "killed, crashed or unreachable; see its log)")
  aborted = re.search(r"aborted by: (?:Error reported from /job:\w+/(?:replica:\d+/)?"
                      r"task:\d+: )?([a-z]+-\d+): (.*)", text)
  if aborted:  # what a worker reported (report_failure): "<task>: <cause>"
    return f"{aborted.group(1)} failed: {aborted.group(2).strip()}"
  if reported:
    return f"{_task_name(*reported.groups()[:2])} failed: {reported.group(3).strip()}"
  if re.search(r"failed to connect|Connection refused|Connection reset|Socket closed|"
               r"UNAVAILABLE", text):
    remote = re.search(r"remote target /job:(\w+)/replica:\d+/task:(\d+)", text)
    who = _task_name(*remote.groups()) if remote else "another worker"
    return f"{who} went away (connection lost: killed, crashed or unreachable; see its log)"
  if "Collective ops is aborted by" in text:
    return "another worker failed: " + text.split("aborted by:", 1)[1].strip().splitlines()[0]
  return None


LEAVE_GRACE_SECONDS = 2.0


def leave_cluster(is_chief: bool) -> None:
  """The end of a worker's run: all meet at a barrier; then the others exit at once, before
  the chief, whose process holds the coordination service (a worker still sending
  heartbeats to a chief that has exited logs an error although all went well)."""
  from tensorflow.python.eager import context
  context.context().wait_at_barrier("t2t-lite-end", 60_000)
  if not is_chief:
    logging.flush()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
  # The chief's answer to the others' barrier calls must reach them before its process (and
  # the service) ends: a chief that exits at once can cut a worker's call short, which it then
  # reports as the chief gone away.
  time.sleep(LEAVE_GRACE_SECONDS)


@contextlib.contextmanager
def shared_failures():
  """Around a worker's run: an error here is reported to the other workers, and a collective
  aborted by another worker's failure becomes one line naming that worker. Either way the
  error raised names this worker: a UsageError or RunError that the program prints as one
  line."""
  try:
    yield
  except BaseException as err:
    if _joined_as is None:  # not in a cluster yet: nobody waits for this process
      raise
    peer = peer_failure(err)
    if peer is not None:
      logging.debug("collective aborted: %s", err)
      raise RunError(f"{_joined_as}: stopped because {peer}") from err
    if isinstance(err, (KeyboardInterrupt, SystemExit)):
      report_failure(_joined_as, RunError("interrupted"))
      raise
    message = report_failure(_joined_as, err)
    raise (UsageError if isinstance(err, UsageError) else RunError)(message) from err


# --- what the workers share before they train ----------------------------------------------
def from_chief(strategy: tf.distribute.Strategy, values: list[float]) -> list[float]:
  """The chief's `values` (float64, so integers below 2**53 are exact), on every worker: one
  collective, in which the other workers wait while the chief works alone (an evaluation,
  say)."""
  zeros = [0.0] * len(values)
  per_replica = strategy.experimental_distribute_values_from_function(
      lambda context: tf.constant(values if context.replica_id_in_sync_group == 0 else zeros,
                                  tf.float64))  # replica 0 is the chief's first device
  total = strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)
  return [float(v) for v in total.numpy()]


def on_any_worker(strategy: tf.distribute.Strategy, flags: list[bool]) -> list[bool]:
  """For each of `flags`, whether any worker raised it (one collective)."""
  per_replica = strategy.experimental_distribute_values_from_function(
      lambda context: tf.constant([float(flag) for flag in flags], tf.float64))
  total = strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)
  return [bool(v > 0) for v in total.numpy()]


def digest(text: str) -> float:
  """48 bits of text's sha256, as a float64 (exact)."""
  return float(int(hashlib.sha256(text.encode()).hexdigest()[:12], 16))


def check_shared_directory(strategy: tf.distribute.Strategy, is_chief: bool, task: str,
                           directory: str, wait_seconds: float = 5.0) -> None:
  """Refuses the run on every worker when a worker cannot see the files the chief writes in
  `directory` (its checkpoints, which every worker resumes from): the chief writes a marker
  named by a number it sends to all, which the others look for (a shared filesystem may show
  a new file a few seconds late). The error raised is named after this worker by
  shared_failures."""
  nonce = secrets.randbits(48) if is_chief else 0
  marker = os.path.join(directory, f".t2t-lite-cluster-{nonce:012x}")
  if is_chief:
    with open(marker, "w") as f:
      f.write(f"{task}\n")
  try:
    nonce = int(from_chief(strategy, [float(nonce)])[0])
    marker = os.path.join(directory, f".t2t-lite-cluster-{nonce:012x}")
    deadline = time.time() + wait_seconds
    while not os.path.exists(marker) and time.time() < deadline:
      time.sleep(0.5)
    missing = not os.path.exists(marker)
    if on_any_worker(strategy, [missing])[0]:
      who = "this worker" if missing else "another worker"
      raise UsageError(f"{who} cannot see the files the chief writes in --output_dir="
                       f"{directory}; every worker resumes from the chief's checkpoints, so "
                       "--output_dir must be on a filesystem all workers share")
  finally:
    if is_chief and os.path.exists(marker):
      os.remove(marker)


def agree(strategy: tf.distribute.Strategy, settings: dict[str, str]) -> None:
  """Refuses the run on every worker, naming what differs, unless all workers have the same
  `settings` (name -> value: flags, hparams, the data's and the program's identity): the
  number of settings and their names first, then a digest of each value."""
  names = sorted(settings)
  shape = [float(len(names)), digest("\n".join(names))]
  if on_any_worker(strategy, [mine != chiefs for mine, chiefs in
                              zip(shape, from_chief(strategy, shape))])[0]:
    raise UsageError("the workers run different versions of t2t-lite (their settings "
                     "differ in kind); install the same version on every worker")
  values = [digest(str(settings[name])) for name in names]
  chiefs = from_chief(strategy, values)
  differs = on_any_worker(strategy, [mine != chief for mine, chief in zip(values, chiefs)])
  named = [name for name, flag in zip(names, differs) if flag]
  if named:
    mine = "; ".join(f"{name}={settings[name]}" for name in named[:4])
    raise UsageError(f"the workers differ in {', '.join(named)} (this worker: {mine}); "
                     "start every worker with the same flags, hparams, data and program")
