#!/usr/bin/env bash
# Puts the raw Multi30k task-1 files ({train,val,test_2016_flickr}.{en,de,fr}.gz) into DEST.
# Usage: get_multi30k.sh DEST [LOCAL_DIR]
#   LOCAL_DIR (or $MULTI30K_DIR, or ../shared/data/multi30k beside the repository) is copied
#   when it holds the files; otherwise they are downloaded from the upstream repository.
set -euo pipefail
dest=${1:?usage: get_multi30k.sh DEST [LOCAL_DIR]}
repo=$(cd "$(dirname "$0")/.." && pwd)
local_dir=${2:-${MULTI30K_DIR:-}}
if [ -z "$local_dir" ] && [ -f "$repo/../shared/data/multi30k/train.en.gz" ]; then
  local_dir="$repo/../shared/data/multi30k"
fi
upstream=https://raw.githubusercontent.com/multi30k/dataset/master/data/task1/raw
mkdir -p "$dest"
for split in train val test_2016_flickr; do
  for lang in en de fr; do
    name=$split.$lang.gz
    [ -s "$dest/$name" ] && continue
    if [ -n "$local_dir" ]; then
      if [ ! -f "$local_dir/$name" ]; then
        echo "get_multi30k.sh: $local_dir has no $name" >&2; exit 2
      fi
      cp "$local_dir/$name" "$dest/$name.tmp" && mv "$dest/$name.tmp" "$dest/$name"
    else
      curl -fsSL --retry 2 "$upstream/$name" -o "$dest/$name.tmp" && mv "$dest/$name.tmp" "$dest/$name"
    fi
  done
done
echo "Multi30k raw files in $dest"
