"""`make bench`: the training, input and decoding benchmarks, one process a configuration.

    python -m benchmarks.run [--quick] [--data_dir=data/multi30k_ende]
        [--run_dir=runs/multi30k_ende_avg] [--out_dir=bench_out] [--no_docs]

Writes out_dir/bench.json (every result) and out_dir/bench.md (the table), and puts the
table, with the machine and the command, between the `make bench` markers of
docs/performance.md (not with --quick or --no_docs). The decode rows need a datagen directory
(`make train` prepares one) and the engine comparison a trained run (`make train` leaves its
average in runs/multi30k_ende_avg). Figures are ratios within one run where possible;
absolute times vary between machines.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import time

from benchmarks import common, decoding, input as input_bench, training

MARKER = "make bench"


def table(results: dict) -> str:
  rows = training.table(results).rstrip("\n").split("\n")
  rows.extend(input_bench.table_rows(results))
  rows.extend(decoding.table_rows(results))
  return "\n".join(rows) + "\n"


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--out_dir", default="bench_out")
  parser.add_argument("--quick", action="store_true", help="tiny configurations (seconds)")
  parser.add_argument("--data_dir", default="data/multi30k_ende")
  parser.add_argument("--raw_dir", default=None, help="raw Multi30k (default: DATA_DIR/raw)")
  parser.add_argument("--run_dir", default="runs/multi30k_ende_avg",
                      help="a trained (or averaged) run for the decode rows")
  parser.add_argument("--no_docs", action="store_true", help="leave docs/performance.md")
  parser.add_argument("--training_only", action="store_true", help=argparse.SUPPRESS)
  parser.add_argument("--decoding_only", action="store_true", help=argparse.SUPPRESS)
  args = parser.parse_args(argv)
  have_data = os.path.isfile(os.path.join(args.data_dir,
                                          "translate_ende_multi30k.manifest.json"))
  have_run = os.path.isfile(os.path.join(args.run_dir, "hparams.json"))
  if args.decoding_only and not have_run:
    parser.error(f"--run_dir={args.run_dir} is not a trained run (no hparams.json); run "
                 "make train first or pass --run_dir")
  start = time.time()
  results = {}
  if not args.decoding_only:
    results.update(training.measure(args.quick, args.data_dir if have_data else None))
    results.update(input_bench.measure(args.quick, args.data_dir if have_data else None))
  if not args.training_only:
    results.update(decoding.measure(args.quick, args.data_dir if have_data else None,
                                    args.raw_dir or os.path.join(args.data_dir, "raw"),
                                    args.run_dir if have_run else None, args.out_dir))
  results["_meta"] = {"seconds": round(time.time() - start, 1), "quick": args.quick,
                      "machine": common.machine(),
                      "date": datetime.date.today().isoformat()}
  os.makedirs(args.out_dir, exist_ok=True)
  with open(os.path.join(args.out_dir, "bench.json"), "w") as f:
    json.dump(results, f, indent=2)
  markdown = table(results)
  with open(os.path.join(args.out_dir, "bench.md"), "w") as f:
    f.write(markdown)
  print(markdown)
  if not (args.quick or args.no_docs or args.training_only or args.decoding_only):
    meta = results["_meta"]
    header = (f"Measured by `make bench` on {meta['date']}, {meta['machine']}; "
              f"{meta['seconds'] / 60:.0f} minutes.\n\n")
    if common.write_block(MARKER, header + markdown):
      print(f"table written to {os.path.relpath(common.PERFORMANCE_DOC)}")


if __name__ == "__main__":
  main()
