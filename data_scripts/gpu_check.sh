#!/usr/bin/env bash
# One GPU, in about 6 minutes (10 at most): Transformer-base tokens/s at n=1 and n=8, peak GPU
# memory for n=1 and n=8 (must be flat), mixed precision on and off, --xla_compile against
# plain at n=1, the accumulation and mixed-precision tests on the GPU, and the time the WMT14
# recipe (data_scripts/wmt14_ende.sh) takes at the measured speed.
# Usage: data_scripts/gpu_check.sh [OUT_DIR]   (from the repository, after make install)
# Each bench run is a fresh process: peak memory is per process, and nothing is shared.
# GPU_CHECK_HPARAMS_SET and GPU_CHECK_VOCAB (default transformer_base, 32000) change the model,
# e.g. to try the script itself on a small machine.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-gpu_check}
mkdir -p "$out"
py=${PYTHON:-.venv/bin/python}
set_name=${GPU_CHECK_HPARAMS_SET:-transformer_base}
vocab=${GPU_CHECK_VOCAB:-32000}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$out/gpu.txt"
: > "$out/train.jsonl"
for mp in false true; do
  for n in 1 8; do
    # 128 sentences x 32 tokens = 4096 tokens per micro-step, transformer_base's batch_size
    spec="{\"kind\": \"train\", \"hparams_set\": \"$set_name\", \"hparams\": \"mixed_precision=$mp\", \"rows\": 128, \"length\": 32, \"vocab\": $vocab, \"n\": $n, \"warmup_micro_steps\": $((2 * n)), \"micro_steps\": 64}"
    echo "$set_name mixed_precision=$mp n=$n: "
    timeout 100 "$py" -m benchmarks.training --worker "$spec" | tail -n 1 | tee -a "$out/train.jsonl"
  done
done
# --xla_compile: the forward and backward pass compiled by XLA (one shape here; a real run
# compiles once per length bucket), mixed precision, n=1
spec="{\"kind\": \"train\", \"hparams_set\": \"$set_name\", \"hparams\": \"mixed_precision=true\", \"rows\": 128, \"length\": 32, \"vocab\": $vocab, \"n\": 1, \"warmup_micro_steps\": 3, \"micro_steps\": 64, \"xla_compile\": true}"
echo "$set_name mixed_precision=true n=1 --xla_compile: "
timeout 150 "$py" -m benchmarks.training --worker "$spec" | tail -n 1 | tee "$out/xla.json"
timeout 150 "$py" -m pytest -p no:cacheprovider tests/test_multistep.py \
  tests/test_mixed_precision.py 2>&1 | tail -n 3 | tee "$out/tests.txt"
"$py" - "$out/train.jsonl" "$out/xla.json" <<'PY' | tee "$out/summary.txt"
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
xla = json.loads(open(sys.argv[2]).read() or "{}")
names = ["float32 n=1", "float32 n=8", "mixed n=1", "mixed n=8"]
for name, r in zip(names, rows):
    print(f"{name}: {r['tokens_per_second']:.0f} tokens/s, peak GPU "
          f"{r.get('peak_gpu_mib', 0):.0f} MiB, compute {r['compute_dtype']}")
for label, one, eight in (("float32", rows[0], rows[1]), ("mixed", rows[2], rows[3])):
    growth = eight.get('peak_gpu_mib', 0) - one.get('peak_gpu_mib', 0)
    budget = eight['accumulators_mib'] + 0.05 * one.get('peak_gpu_mib', 0)
    print(f"{label}: n=8 / n=1 tokens/s {eight['tokens_per_second'] / one['tokens_per_second']:.3f}; "
          f"peak GPU n=8 - n=1 {growth:+.0f} MiB, budget accumulators + 5% = {budget:.0f} MiB: "
          f"{'flat' if growth <= budget else 'NOT FLAT'}")
print(f"mixed / float32 tokens/s at n=8: {rows[3]['tokens_per_second'] / rows[1]['tokens_per_second']:.2f}")
if "tokens_per_second" in xla:
    print(f"--xla_compile / plain tokens/s, mixed n=1: {xla['tokens_per_second']:.0f} / "
          f"{rows[2]['tokens_per_second']:.0f} = {xla['tokens_per_second'] / rows[2]['tokens_per_second']:.2f}; "
          f"peak GPU {xla.get('peak_gpu_mib', 0):.0f} MiB")
else:
    print(f"--xla_compile: no result ({xla.get('error', 'the run failed or timed out')})")
tokens = 100_000 * 4096 * 8  # wmt14_ende.sh: 100k updates of transformer_base_fake_gpu8
for label, r in (("float32", rows[1]), ("mixed", rows[3])):
    print(f"wmt14_ende.sh on this GPU ({label}): 100k updates x 32768 tokens / "
          f"{r['tokens_per_second']:.0f} tokens/s = {tokens / r['tokens_per_second'] / 3600:.1f} h "
          "of training (synthetic 32-token sentences; real batches pad about 8%)")
PY
