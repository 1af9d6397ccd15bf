#!/usr/bin/env bash
# Multi30k English-German from raw text to training data: the raw files into DATA_DIR/raw,
# then the joint sentencepiece vocabulary and TFRecords into DATA_DIR.
# Usage: multi30k_data.sh DATA_DIR   (MULTI30K_DIR: a local folder with the raw .gz files;
# VOCAB_SIZE: the vocabulary's pieces, 12000 unless set. Chosen on the dev set: a 25-minute
# run scored 40.32 with 12000, 39.84 with the problem's own 8000 and 38.24 with 4000;
# docs/training.md)
set -euo pipefail
data_dir=${1:-data/multi30k_ende}
raw_dir=$data_dir/raw
bash "$(dirname "$0")/get_multi30k.sh" "$raw_dir" ${MULTI30K_DIR:+"$MULTI30K_DIR"}
t2t-lite-datagen --problem=translate_ende_multi30k --data_dir="$data_dir" --tmp_dir="$raw_dir" \
  --vocab_size="${VOCAB_SIZE:-12000}"
