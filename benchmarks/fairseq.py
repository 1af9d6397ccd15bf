"""Training speed and peak memory against fairseq, on the same data, model and CPU.

python -m benchmarks.fairseq --fairseq_bin=/path/to/fairseq-venv/bin \
    [--data_dir=data/multi30k_ende] [--out_dir=bench_out] [--updates=100] [--rounds=1]

fairseq is not a dependency of t2t-lite: point --fairseq_bin at the bin/ folder of an
environment that has `fairseq-preprocess` and `fairseq-train` (fairseq 0.12.2 and PyTorch).

Both train transformer_multi30k_cpu's model (3+3 layers, 256/1024, 4 heads, shared
embeddings and softmax; dropout 0.1 on every path, where the set ramps its residual dropout
from 0 to 0.3 and has none on attention and ReLU; label smoothing 0.1, Adam) at n=1 on
batches of at most 4,096 tokens (rows x longest sequence), on the same sentencepiece pieces:
our training shards, written out as fairseq text and binarized with our vocabulary. Training
tokens/s is counted on the target tokens (end-of-sentence included, padding not) of updates
`--from_update`..`--updates`, from each program's own log, over wall time; peak RSS is the
process's high-water mark (wait4). The programs run one after another, `--rounds` times, in
the order fairseq, t2t-lite float32, t2t-lite default precision (left out where the default
is float32).

`--isa` caps the instruction set both programs' kernels may use (oneDNN's, MKL's and
PyTorch's own), to measure on this machine what a CPU with only that set would run: its
instructions, not its clock, caches or memory. `avx2` stands for an AVX2-only CPU (default
precision float32 there), `avx512_core_bf16` for one with AVX512-BF16 and no AMX.

Writes out_dir/fairseq.json and out_dir/fairseq.md, and puts the table, with the command, between
the `make bench-fairseq` markers of docs/performance.md (not with --no_docs).
"""

from __future__ import annotations

import argparse
import datetime
import contextlib
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

from t2t_lite.core.files import write_atomic

HPARAMS_SET = "transformer_multi30k_cpu"
# fairseq has one constant dropout: both programs train at 0.1 on the residual, attention and
# ReLU paths, without the set's ramp (which starts at 0) and with the attention and ReLU
# dropout the set does not have; the published figures were measured so and stay comparable.
CONSTANT_DROPOUT = ("layer_prepostprocess_dropout=0.1,dropout_ramp_initial=0.0,"
                    "dropout_ramp_start=0,dropout_ramp_end=0,attention_dropout=0.1,"
                    "relu_dropout=0.1")


def bench_hparams():
  """The hparams both programs train with: HPARAMS_SET at CONSTANT_DROPOUT."""
  from t2t_lite.core import registry
  hparams = registry.hparams(HPARAMS_SET)
  hparams.parse(CONSTANT_DROPOUT)
  return hparams

# --isa: the environment that caps each library's kernels, and the /proc/cpuinfo flag the
# CPU needs for the cap to mean anything.
ISA_CEILINGS = {
    "native": ({}, None),
    "avx512_core_bf16": ({"ONEDNN_MAX_CPU_ISA": "AVX512_CORE_BF16",
                          "MKL_ENABLE_INSTRUCTIONS": "AVX512", "ATEN_CPU_CAPABILITY": "avx512"},
                         "avx512_bf16"),
    "avx512_core": ({"ONEDNN_MAX_CPU_ISA": "AVX512_CORE", "MKL_ENABLE_INSTRUCTIONS": "AVX512",
                     "ATEN_CPU_CAPABILITY": "avx512"}, "avx512f"),
    "avx2": ({"ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2",
              "ATEN_CPU_CAPABILITY": "avx2"}, "avx2"),
}


def write_fairseq_text(data_dir: str, problem_name: str, work: str) -> dict:
  """Our training shards as fairseq's parallel text (space-separated sentencepiece pieces,
  without our end-of-sentence id: fairseq appends its own) and its dictionary (our pieces,
  our special ids left out). Returns the counts written."""
  from t2t_lite.core import registry
  from t2t_lite.data.eval_input import parse_example
  from t2t_lite.core.runtime import import_tensorflow
  from t2t_lite.data.vocab import EOS_ID, PAD_ID
  import sentencepiece as spm
  tf = import_tensorflow()
  problem = registry.problem(problem_name)
  files = problem.data_files(data_dir, "train")
  model = spm.SentencePieceProcessor(model_file=problem.vocab_file(data_dir))
  special = {PAD_ID, EOS_ID, model.unk_id()}
  pieces = [model.id_to_piece(i) for i in range(model.get_piece_size())]
  counts = {"sentences": 0, "source_tokens": 0, "target_tokens": 0}
  with contextlib.ExitStack() as stack:
    out = {(split, side): stack.enter_context(
               open(os.path.join(work, f"{split}.{side}"), "w", encoding="utf-8"))
           for split in ("train", "valid") for side in ("src", "tgt")}
    for example in tf.data.TFRecordDataset(files).map(parse_example).as_numpy_iterator():
      for name, side in (("inputs", "src"), ("targets", "tgt")):
        # Our end of sentence goes (fairseq appends its own), and so would an unknown piece.
        ids = [i for i in map(int, example[name]) if i not in special]
        line = " ".join(pieces[i] for i in ids) + "\n"
        out["train", side].write(line)
        if counts["sentences"] < 100:  # fairseq-train loads a valid split even unused
          out["valid", side].write(line)
        counts["source_tokens" if side == "src" else "target_tokens"] += len(ids) + 1
      counts["sentences"] += 1
  with open(os.path.join(work, "dict.txt"), "w", encoding="utf-8") as out:
    for i, piece in enumerate(pieces):
      if i not in special:
        out.write(f"{piece} 1\n")
  return counts


def fairseq_train_args(bin_dir: str, data: str, updates: int, seed: int,
                       hparams) -> list[str]:
  """fairseq-train on binarized `data` with the model, loss, optimizer, peak learning rate,
  warmup and batch size of `hparams` (pre-norm, shared embeddings and softmax)."""
  from t2t_lite.training.optimize import learning_rate
  peak = float(learning_rate(hparams, hparams.learning_rate_warmup_steps))
  h = hparams
  return [
      os.path.join(bin_dir, "fairseq-train"), data, "--cpu", "--task", "translation",
      "--source-lang", "src", "--target-lang", "tgt", "--arch", "transformer",
      "--encoder-layers", str(h.num_encoder_layers), "--decoder-layers", str(h.num_decoder_layers),
      "--encoder-embed-dim", str(h.hidden_size), "--decoder-embed-dim", str(h.hidden_size),
      "--encoder-ffn-embed-dim", str(h.filter_size), "--decoder-ffn-embed-dim", str(h.filter_size),
      "--encoder-attention-heads", str(h.num_heads), "--decoder-attention-heads", str(h.num_heads),
      "--encoder-normalize-before", "--decoder-normalize-before", "--share-all-embeddings",
      "--dropout", str(h.layer_prepostprocess_dropout),
      "--attention-dropout", str(h.attention_dropout),
      "--activation-dropout", str(h.relu_dropout),
      "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", str(h.label_smoothing),
      "--optimizer", "adam",
      "--adam-betas", f"({h.optimizer_adam_beta1}, {h.optimizer_adam_beta2})",
      "--adam-eps", str(h.optimizer_adam_epsilon), "--lr", f"{peak:.6g}",
      "--lr-scheduler", "inverse_sqrt", "--warmup-updates", str(h.learning_rate_warmup_steps),
      "--max-tokens", str(h.batch_size), "--max-update", str(updates), "--seed", str(seed),
      "--log-format", "simple", "--log-interval", "10", "--num-workers", "0",
      "--no-save", "--disable-validation", "--max-source-positions", str(h.max_length),
      "--max-target-positions", str(h.max_length), "--skip-invalid-size-inputs-valid-test"]


_FAIRSEQ_LINE = re.compile(r"\bwps=([\d.]+).*\bwpb=([\d.]+).*\bnum_updates=(\d+)")
_T2T_LINE = re.compile(r"update (\d+)/\d+ .* ([\d.]+) tokens/s, ([\d.]+) tokens/update")


def fairseq_progress(log: str) -> list[tuple[int, float, float]]:
  """(update, target tokens/s, target tokens/update) of each line of fairseq's simple log:
  every --log-interval updates it prints wps and wpb (the mean target tokens per batch) of
  the updates since its last line, and the update count."""
  return [(int(u), float(r), float(t)) for r, t, u in _FAIRSEQ_LINE.findall(log)]


def t2t_progress(log: str) -> list[tuple[int, float, float]]:
  """The same of t2t-lite's progress lines (tokens/s and tokens/update of each window)."""
  return [(int(u), float(r), float(t)) for u, r, t in _T2T_LINE.findall(log)]


def tokens_per_second(points: list[tuple[int, float, float]], from_update: int) -> float:
  """Tokens over seconds of the log windows (previous line, line] that start at or after
  `from_update`; `points`: (update, tokens/s, tokens/update) of each progress line."""
  tokens = seconds = 0.0
  for (start, _, _), (update, rate, per_update) in zip(points, points[1:]):
    if start >= from_update:
      tokens += per_update * (update - start)
      seconds += per_update * (update - start) / rate
  if not seconds:
    raise ValueError(f"no progress lines after update {from_update} in the log")
  return tokens / seconds


def run_measured(args: list[str], log_path: str, env: dict | None = None) -> tuple[str, float]:
  """Runs `args`, its stdout and stderr to `log_path`; returns (the log, peak RSS MiB)."""
  with open(log_path, "w") as log:
    process = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=env)
    _, status, usage = os.wait4(process.pid, 0)
  process.returncode = os.waitstatus_to_exitcode(status)
  with open(log_path) as log:
    text = log.read()
  if process.returncode != 0:
    raise RuntimeError(f"{args[0]} failed (exit {process.returncode}): "
                       f"{text.strip().splitlines()[-1] if text.strip() else ''}; see {log_path}")
  return text, usage.ru_maxrss / 1024.0


def t2t_train_args(problem: str, data_dir: str, output_dir: str, updates: int, seed: int,
                   mixed_precision: bool) -> list[str]:
  """Our trainer's command. Like fairseq it trains on the one best segmentation, also on
  data with sampled segmentations (`make train`'s): by the set's own rule, which reads them
  only in a run of at least subword_sampling_min_updates updates, set above `updates`."""
  trainer = os.path.join(os.path.dirname(sys.executable), "t2t-lite-trainer")
  one_best = f"subword_sampling_min_updates={updates + 1}"
  return [trainer, f"--problem={problem}", f"--hparams_set={HPARAMS_SET}",
          f"--hparams=mixed_precision={str(mixed_precision).lower()},{CONSTANT_DROPOUT},"
          f"{one_best}",
          f"--data_dir={data_dir}",
          f"--output_dir={output_dir}", f"--train_steps={updates}", "--log_every=10",
          "--local_eval_frequency=0", "--save_checkpoints_steps=0", f"--random_seed={seed}"]


def _cpuinfo() -> str:
  try:
    with open("/proc/cpuinfo") as f:
      return f.read()
  except OSError:
    return ""


def cpu_model() -> str:
  """The CPU's model name and core count, as /proc/cpuinfo gives them."""
  names = re.findall(r"^model name\s*:\s*(.+)$", _cpuinfo(), flags=re.M)
  return f"{names[0] if names else 'unknown CPU'}, {os.cpu_count()} cores"


def isa_environment(isa: str, cpuinfo: str) -> dict:
  """The variables that cap the kernels at `isa` (see --isa); ValueError if the CPU lacks it."""
  variables, flag = ISA_CEILINGS[isa]
  if flag and not re.search(rf"^flags\s*:.*\b{flag}\b", cpuinfo, flags=re.M):
    raise ValueError(f"this CPU has no {flag}, so --isa={isa} would measure the native "
                     f"instruction set; use --isa=native or a lower set")
  return variables


def table(results: dict) -> str:
  """Median of the rounds per program, and the ratios to fairseq."""
  def median(name, key):
    return statistics.median(r[key] for r in results["rounds"][name])

  base_speed, base_rss = median("fairseq", "tokens_per_second"), median("fairseq", "peak_rss_mib")
  isa = results.get("isa", "native")
  capped = "" if isa == "native" else (
      f"; kernels capped at {isa} (ONEDNN_MAX_CPU_ISA, MKL_ENABLE_INSTRUCTIONS, "
      "ATEN_CPU_CAPABILITY)")
  if "pytorch_cpu_capability" in results:
    capped += f"; PyTorch's kernels at {results['pytorch_cpu_capability']}"
  lines = [f"{results['cpu']}{capped}; default precision {results['default_precision']}.", "",
           f"| program ({results['updates_measured']}, {len(results['rounds']['fairseq'])} "
           "round(s), medians) | target tokens/s | vs fairseq | peak RSS MiB | vs fairseq |",
           "|---|---|---|---|---|"]
  for name in results["rounds"]:
    speed, rss = median(name, "tokens_per_second"), median(name, "peak_rss_mib")
    lines.append(f"| {name} | {speed:,.0f} | {speed / base_speed:.2f}x | {rss:,.0f} | "
                 f"{rss / base_rss:.2f}x |")
  return "\n".join(lines) + "\n"


def _measure(name: str, args, binarized: str, work: str, round_index: int):
  """(target tokens/s, peak RSS MiB) of one training run of program `name`."""
  slug = name.replace(" ", "_")
  log_path = os.path.join(args.out_dir, f"fairseq_bench_{slug}_{round_index}.log")
  if name == "fairseq":
    log, rss = run_measured(fairseq_train_args(args.fairseq_bin, binarized, args.updates,
                                               args.seed, bench_hparams()),
                            log_path)
    return tokens_per_second(fairseq_progress(log), args.from_update), rss
  output_dir = os.path.join(work, f"{slug}_{round_index}")
  log, rss = run_measured(t2t_train_args(args.problem, args.data_dir, output_dir, args.updates,
                                         args.seed, name.endswith("default")), log_path)
  return tokens_per_second(t2t_progress(log), args.from_update), rss


def pytorch_cpu_capability(fairseq_bin: str, env: dict) -> str:
  """The instruction set PyTorch's own kernels run at in the fairseq environment ("unknown"
  where its PyTorch cannot say)."""
  done = subprocess.run(
      [os.path.join(fairseq_bin, "python"), "-c",
       "import torch; print(torch.backends.cpu.get_cpu_capability())"],
      env=env, capture_output=True, text=True)
  return done.stdout.strip() if done.returncode == 0 and done.stdout.strip() else "unknown"


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--fairseq_bin", required=True,
                      help="bin/ folder with fairseq-preprocess and fairseq-train")
  parser.add_argument("--data_dir", default="data/multi30k_ende")
  parser.add_argument("--problem", default="translate_ende_multi30k")
  parser.add_argument("--out_dir", default="bench_out")
  parser.add_argument("--updates", type=int, default=100)
  parser.add_argument("--from_update", type=int, default=20)
  parser.add_argument("--rounds", type=int, default=1)
  parser.add_argument("--seed", type=int, default=1)
  parser.add_argument("--isa", default="native", choices=sorted(ISA_CEILINGS),
                      help="the instruction set both programs' kernels may use (see above)")
  parser.add_argument("--no_docs", action="store_true", help="leave docs/performance.md")
  args = parser.parse_args(argv)
  try:
    ceiling = isa_environment(args.isa, _cpuinfo())
  except ValueError as e:
    parser.error(str(e))
  for tool in ("fairseq-preprocess", "fairseq-train"):
    if not os.access(os.path.join(args.fairseq_bin, tool), os.X_OK):
      parser.error(f"--fairseq_bin={args.fairseq_bin} has no {tool}; give the bin/ folder "
                   "of an environment with fairseq installed")
  if not os.path.isdir(args.data_dir):
    parser.error(f"--data_dir={args.data_dir} does not exist; run t2t-lite-datagen first "
                 "(make train prepares data/multi30k_ende)")
  if not 0 <= args.from_update < args.updates or args.updates % 10:
    parser.error("--updates must be a multiple of 10 (the log interval) above --from_update")
  os.makedirs(args.out_dir, exist_ok=True)
  # Both programs inherit the cap, and the default precision below is read under it, as the
  # trainer will read it.
  os.environ.update(ceiling)
  from t2t_lite.models.transformer import cpu_has_fast_bfloat16
  default = "bfloat16" if cpu_has_fast_bfloat16() else "float32"
  results = {"updates_measured": f"updates {args.from_update}-{args.updates}",
             "cpu": cpu_model(), "isa": args.isa, "default_precision": default,
             "rounds": {"fairseq": [], "t2t-lite float32": []}}
  if default != "float32":
    results["rounds"]["t2t-lite default"] = []
  results["pytorch_cpu_capability"] = pytorch_cpu_capability(args.fairseq_bin, os.environ)
  with tempfile.TemporaryDirectory(prefix="bench_fairseq_") as work:
    results["data"] = write_fairseq_text(args.data_dir, args.problem, work)
    binarized = os.path.join(work, "bin")
    subprocess.run([os.path.join(args.fairseq_bin, "fairseq-preprocess"), "--source-lang",
                    "src", "--target-lang", "tgt", "--trainpref", os.path.join(work, "train"),
                    "--validpref", os.path.join(work, "valid"),
                    "--destdir", binarized, "--srcdict", os.path.join(work, "dict.txt"),
                    "--joined-dictionary", "--workers", "2"],
                   check=True, capture_output=True)
    for round_index in range(args.rounds):
      for name, rows in results["rounds"].items():
        speed, rss = _measure(name, args, binarized, work, round_index)
        rows.append({"tokens_per_second": speed, "peak_rss_mib": rss})
        print(f"round {round_index + 1}: {name}: {speed:,.0f} target tokens/s, "
              f"peak RSS {rss:,.0f} MiB", flush=True)
  markdown = table(results)
  write_atomic(os.path.join(args.out_dir, "fairseq.json"), json.dumps(results, indent=1))
  write_atomic(os.path.join(args.out_dir, "fairseq.md"), markdown)
  print(markdown)
  if not args.no_docs:
    from benchmarks.common import PERFORMANCE_DOC, write_block
    command = (f"`make bench-fairseq FAIRSEQ_ROUNDS={args.rounds} FAIRSEQ_ISA={args.isa}` "
               f"on {datetime.date.today().isoformat()}, {results['cpu']}.")
    if write_block("make bench-fairseq", f"Measured by {command}\n\n{markdown}"):
      print(f"table written to {os.path.relpath(PERFORMANCE_DOC)}")


if __name__ == "__main__":
  main()
