"""What the benchmarks share: a fresh process per measurement, the machine, the tables.

Each measurement runs in its own Python process (`run_worker`), so peak memory is its own and
nothing is shared. The benchmarks drive t2t-lite through its public API; run them from the
repository's root (`make bench`, `make bench-fairseq`), which puts this folder on the path.
"""

from __future__ import annotations

import json
import os
import platform
import resource
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PERFORMANCE_DOC = os.path.join(REPO, "docs", "performance.md")


def import_tf():
  from t2t_lite.core.runtime import import_tensorflow
  return import_tensorflow()


def peak_rss_mib() -> float:
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def synthetic_batch(rows: int, length: int, vocab: int, seed: int = 0):
  import numpy as np
  rng = np.random.RandomState(seed)
  return {name: import_tf().constant(rng.randint(3, vocab, size=(rows, length)).astype(np.int32))
          for name in ("inputs", "targets")}


def run_worker(module: str, spec: dict, env: dict | None = None, timeout: int = 3600) -> dict:
  """`python -m <module> --worker <spec>` in a fresh process: its last stdout line, a JSON
  result; {"error": its last stderr line} when it fails."""
  result = subprocess.run([sys.executable, "-m", module, "--worker", json.dumps(spec)],
                          capture_output=True, text=True, cwd=REPO, env=env, timeout=timeout)
  if result.returncode != 0:
    return {"error": (result.stderr.strip().splitlines() or ["failed"])[-1]}
  return json.loads(result.stdout.strip().splitlines()[-1])


def cpu_model() -> str:
  try:
    with open("/proc/cpuinfo") as f:
      for line in f:
        if line.startswith("model name"):
          return line.split(":", 1)[1].strip()
  except OSError:
    pass
  return platform.processor() or platform.machine()


def machine() -> str:
  """One line naming the machine: CPU model, cores, and the instruction sets that matter."""
  flags = ""
  try:
    with open("/proc/cpuinfo") as f:
      flags = next((line for line in f if line.startswith("flags")), "")
  except OSError:
    pass
  sets = [name for name in ("avx2", "avx512f", "avx512_bf16", "amx_bf16") if f" {name}" in flags]
  return f"{cpu_model()}, {os.cpu_count()} cores ({', '.join(sets) or 'no AVX2'})"


def write_block(name: str, text: str, path: str = PERFORMANCE_DOC) -> bool:
  """Replaces what lies between `<!-- NAME: begin -->` and `<!-- NAME: end -->` in `path`
  (docs/performance.md) with `text`; False (and nothing written) when the markers are not
  there. Written to a temporary name and renamed."""
  from t2t_lite.core.files import write_atomic
  begin, end = f"<!-- {name}: begin -->", f"<!-- {name}: end -->"
  try:
    with open(path, encoding="utf-8") as f:
      document = f.read()
  except OSError:
    return False
  if begin not in document or end not in document:
    return False
  head, rest = document.split(begin, 1)
  tail = rest.split(end, 1)[1]
  write_atomic(path, f"{head}{begin}\n{text.strip()}\n{end}{tail}")
  return True


def worker_main(workers: dict) -> bool:
  """In a worker process (`--worker SPEC` on the command line): runs the worker of SPEC's
  kind, prints its JSON result and returns True; False otherwise."""
  if len(sys.argv) == 3 and sys.argv[1] == "--worker":
    spec = json.loads(sys.argv[2])
    print(json.dumps(workers[spec["kind"]](spec)))
    return True
  return False


def free_ports(count: int) -> list[int]:
  """`count` free ports of 127.0.0.1 (for localhost clusters)."""
  import socket
  sockets = [socket.socket() for _ in range(count)]
  for sock in sockets:
    sock.bind(("127.0.0.1", 0))
  ports = [sock.getsockname()[1] for sock in sockets]
  for sock in sockets:
    sock.close()
  return ports
