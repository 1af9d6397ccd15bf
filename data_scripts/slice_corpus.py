"""Splits a parallel corpus by the words of its source side: the pairs whose source has one of
the given words (an in-domain slice) and the others, each split in the layout that
t2t-lite-datagen --problem=translate_folder reads ({train,dev,test}.{src,tgt}).

Usage: python data_scripts/slice_corpus.py RAW_DIR SLICE_DIR REST_DIR --words=w1,w2,...
RAW_DIR holds Multi30k's {train,val,test_2016_flickr}.{en,de}.gz (see its README)."""

from __future__ import annotations

import argparse
import gzip
import os
import re

SPLITS = {"train": "train", "dev": "val", "test": "test_2016_flickr"}


def read(path: str) -> list[str]:
  with gzip.open(path, "rt", encoding="utf-8") as f:
    return [line.rstrip("\n") for line in f]


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("raw_dir")
  parser.add_argument("slice_dir")
  parser.add_argument("rest_dir")
  parser.add_argument("--words", required=True, help="comma-separated, matched as whole "
                      "words of the source side, case-insensitive")
  parser.add_argument("--source", default="en")
  parser.add_argument("--target", default="de")
  args = parser.parse_args()
  words = [w.strip() for w in args.words.split(",") if w.strip()]
  pattern = re.compile(r"\b(?:" + "|".join(map(re.escape, words)) + r")\b", re.IGNORECASE)
  for folder in (args.slice_dir, args.rest_dir):
    os.makedirs(folder, exist_ok=True)
  for split, raw in SPLITS.items():
    sources = read(os.path.join(args.raw_dir, f"{raw}.{args.source}.gz"))
    targets = read(os.path.join(args.raw_dir, f"{raw}.{args.target}.gz"))
    if len(sources) != len(targets):
      raise SystemExit(f"{raw}: {len(sources)} source and {len(targets)} target lines")
    chosen = [bool(pattern.search(line)) for line in sources]
    for folder, keep in ((args.slice_dir, True), (args.rest_dir, False)):
      for lang, lines in ((args.source, sources), (args.target, targets)):
        path = os.path.join(folder, f"{split}.{lang}")
        with open(path + ".tmp", "w", encoding="utf-8") as f:
          f.writelines(line + "\n" for line, c in zip(lines, chosen) if c == keep)
        os.replace(path + ".tmp", path)
    print(f"{split}: {sum(chosen)} pairs in the slice, {len(chosen) - sum(chosen)} in the rest")


if __name__ == "__main__":
  main()
