#!/usr/bin/env bash
# The main job (make train): Multi30k English-German on the CPU, from raw text to sacreBLEU.
# Usage: multi30k_ende.sh DATA_DIR RUN_DIR TRAIN_MINUTES
# TRAIN_FLAGS: more trainer flags; EVAL_FLAGS replaces the evaluation flags
# (EVAL_FLAGS=--local_eval_frequency=0 trains without evaluating).
set -euo pipefail
data_dir=${1:-data/multi30k_ende}
run_dir=${2:-runs/multi30k_ende}
minutes=${3:-25}
raw_dir=$data_dir/raw
start=$(date +%s)

echo "== 1-2/5 data: Multi30k raw files -> $raw_dir; joint sentencepiece vocabulary (8000) and TFRecords -> $data_dir"
bash "$(dirname "$0")/multi30k_data.sh" "$data_dir"

echo "== 3/5 train: transformer_multi30k_cpu for $minutes minutes -> $run_dir"
t2t-lite-trainer --problem=translate_ende_multi30k --hparams_set=transformer_multi30k_cpu \
  --data_dir="$data_dir" --output_dir="$run_dir" --train_minutes="$minutes" \
  --train_steps=100000 --save_checkpoints_steps=30 --keep_checkpoint_max=6 --log_every=25 \
  ${EVAL_FLAGS:---local_eval_frequency=200 --eval_steps=0 --eval_bleu_sentences=200} \
  ${TRAIN_FLAGS:-}

echo "== 4/5 average the last 6 checkpoints -> ${run_dir}_avg"
t2t-lite-avg-checkpoints --output_dir="$run_dir" --num_last_checkpoints=6 --avg_dir="${run_dir}_avg"

echo "== 5/5 decode test_2016_flickr with beam 4, alpha 0.6, and score it"
gunzip -c "$raw_dir/test_2016_flickr.en.gz" > "$run_dir/test_2016_flickr.en"
gunzip -c "$raw_dir/test_2016_flickr.de.gz" > "$run_dir/test_2016_flickr.de"
t2t-lite-decoder --output_dir="${run_dir}_avg" --decode_hparams="beam_size=4,alpha=0.6" \
  --decode_from_file="$run_dir/test_2016_flickr.en" --decode_to_file="$run_dir/test_2016_flickr.de.out"
t2t-lite-bleu --translation="$run_dir/test_2016_flickr.de.out" \
  --reference="$run_dir/test_2016_flickr.de" | tee "$run_dir/bleu.txt"

echo
echo "Done in $(( ($(date +%s) - start) / 60 )) minutes."
echo "  data and vocabulary:  $data_dir"
echo "  checkpoints, TensorBoard summaries:  $run_dir   (tensorboard --logdir $run_dir)"
echo "  averaged checkpoint:  ${run_dir}_avg"
echo "  translations:  $run_dir/test_2016_flickr.de.out"
echo "  score:  $run_dir/bleu.txt"
