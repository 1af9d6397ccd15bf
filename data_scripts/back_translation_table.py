"""Prints the tables of docs/training.md's back-translation example from what
back_translation_example.sh wrote in WORK_DIR: scores.txt (NAME SPLIT BLEU CHRF; the newest
line of each counts) and times.txt (NAME SECONDS).

Usage: python data_scripts/back_translation_table.py WORK_DIR"""

from __future__ import annotations

import os
import sys

ROWS = [
    ("a_only", "A alone"),
    ("bt_beam", "A + B back-translated, beam 4"),
    ("bt_sampled", "A + B back-translated, sampled (temperature 1, the whole softmax)"),
    ("bt_tagged", "A + B back-translated, beam 4, sources tagged `<BT>`"),
    ("ab_real", "A + B real (the ceiling)"),
]


def read_fields(path: str) -> list[list[str]]:
  if not os.path.exists(path):
    return []
  with open(path, encoding="utf-8") as f:
    return [line.split() for line in f if line.strip()]


def main() -> None:
  work = sys.argv[1]
  scores = {(f[0], f[1]): f[2:4] for f in read_fields(os.path.join(work, "scores.txt"))}
  seconds = {f[0]: int(f[1]) for f in read_fields(os.path.join(work, "times.txt"))}

  def figures(name: str) -> str:
    return " | ".join(" / ".join(scores.get((name, split), ["-", "-"]))
                      for split in ("dev", "test"))

  def minutes(step: str) -> str:
    return f"{seconds[step] / 60:.1f}" if step in seconds else "-"

  print("| model | dev BLEU / chrF | test BLEU / chrF | minutes of datagen / training |")
  print("|---|---|---|---|")
  print(f"| de->en on A (the reverse model) | {figures('reverse')} | "
        f"{minutes('datagen_reverse')} / {minutes('train_reverse')} |")
  for name, label in ROWS:
    print(f"| en->de: {label} | {figures(name)} | "
          f"{minutes('datagen_' + name)} / {minutes('train_' + name)} |")
  print()
  for name in ("bt_beam", "bt_sampled"):
    print(f"back-translating B's German ({name}): {minutes('backtranslate_' + name)} minutes")


if __name__ == "__main__":
  main()
