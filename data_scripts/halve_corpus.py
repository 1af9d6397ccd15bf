"""Splits a parallel corpus's training pairs into two halves A and B (alternate lines, so both
halves cover the whole corpus alike), each in the layout that
t2t-lite-datagen --problem=translate_folder reads ({train,dev,test}.{src,tgt}); dev and test go
to both whole.

Usage: python data_scripts/halve_corpus.py RAW_DIR A_DIR B_DIR
RAW_DIR holds Multi30k's {train,val,test_2016_flickr}.{en,de}.gz (see its README)."""

from __future__ import annotations

import argparse
import os

from slice_corpus import SPLITS, read


def write(path: str, lines: list[str]) -> None:
  with open(path + ".tmp", "w", encoding="utf-8") as f:
    f.writelines(line + "\n" for line in lines)
  os.replace(path + ".tmp", path)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("raw_dir")
  parser.add_argument("a_dir")
  parser.add_argument("b_dir")
  parser.add_argument("--langs", default="en,de", help="the two languages, comma-separated")
  args = parser.parse_args()
  langs = args.langs.split(",")
  for folder in (args.a_dir, args.b_dir):
    os.makedirs(folder, exist_ok=True)
  for split, raw in SPLITS.items():
    sides = [read(os.path.join(args.raw_dir, f"{raw}.{lang}.gz")) for lang in langs]
    if len(sides[0]) != len(sides[1]):
      raise SystemExit(f"{raw}: {len(sides[0])} and {len(sides[1])} lines")
    for half, folder in enumerate((args.a_dir, args.b_dir)):
      for lang, lines in zip(langs, sides):
        chosen = lines[half::2] if split == "train" else lines
        write(os.path.join(folder, f"{split}.{lang}"), chosen)
    print(f"{split}: {len(sides[0][0::2])} pairs in A, {len(sides[0][1::2])} in B"
          if split == "train" else f"{split}: {len(sides[0])} pairs in both")


if __name__ == "__main__":
  main()
