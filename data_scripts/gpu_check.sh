#!/usr/bin/env bash
# One GPU, under 8 minutes: Transformer-base tokens/s at n=1 and n=8, peak GPU memory for
# n=1 and n=8 (must be flat), mixed precision on and off, and the equivalence tests on the GPU.
# Usage: data_scripts/gpu_check.sh [OUT_DIR]   (run from the repository, after make install)
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-gpu_check}
mkdir -p "$out"
py=${PYTHON:-.venv/bin/python}
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$out/gpu.txt"
for mp in false true; do
  for n in 1 8; do
    spec="{\"kind\": \"train\", \"hparams_set\": \"transformer_base\", \"hparams\": \"mixed_precision=$mp\", \"rows\": 128, \"length\": 32, \"vocab\": 32000, \"n\": $n, \"warmup_micro_steps\": $n, \"micro_steps\": 32}"
    echo -n "transformer_base mixed_precision=$mp n=$n: "
    timeout 150 "$py" -m t2t_lite.bench --worker "$spec" | tail -n 1 | tee -a "$out/train.jsonl"
  done
done
timeout 150 "$py" -m pytest -q tests/test_multistep.py 2>&1 | tail -n 3 | tee "$out/equivalence.txt"
"$py" - "$out/train.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
names = ["float32 n=1", "float32 n=8", "mixed n=1", "mixed n=8"]
for name, r in zip(names, rows):
    print(f"{name}: {r['tokens_per_second']:.0f} tokens/s, peak GPU {r.get('peak_gpu_mib', 0):.0f} MiB, {r['compute_dtype']}")
print(f"n=8/n=1 tokens/s (float32): {rows[1]['tokens_per_second'] / rows[0]['tokens_per_second']:.3f}")
print(f"peak GPU n=8 - n=1 (float32): {rows[1].get('peak_gpu_mib', 0) - rows[0].get('peak_gpu_mib', 0):.0f} MiB "
      f"(accumulators: {rows[1]['accumulators_mib']:.0f} MiB)")
PY
