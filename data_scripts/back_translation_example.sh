#!/usr/bin/env bash
# The back-translation example of docs/training.md: Multi30k's training pairs halved (A, B); a
# German-English model trained on A translates B's German back into English (beam, and
# sampled), and English-German models train on A alone, A + the beam back-translations,
# A + the sampled ones, A + the beam ones tagged <BT>, and A + B's real English (the
# ceiling), the same number of updates each, the checkpoint chosen by dev BLEU.
# Usage: back_translation_example.sh RAW_DIR WORK_DIR [STAGE...]
# RAW_DIR: Multi30k's raw .gz files (data_scripts/get_multi30k.sh); stages: halve reverse
# backtranslate data train score table (default: all, in that order). STEPS: the updates of
# every model (400); EVAL_EVERY: the updates between dev evaluations (100); BT_ENGINE:
# ctranslate2 (default: an export of the reverse model, float32) or tensorflow.
# WORK_DIR/times.txt gets the seconds of each step, WORK_DIR/scores.txt the scores, and the
# table stage prints the table of docs/training.md from both.
set -euo pipefail
raw_dir=$1
work=$2
shift 2
stages=${*:-halve reverse backtranslate data train score table}
steps=${STEPS:-400}
eval_every=${EVAL_EVERY:-100}
engine=${BT_ENGINE:-ctranslate2}
here=$(dirname "$0")
systems="a_only bt_beam bt_sampled bt_tagged ab_real"
train_flags=(--problem=translate_folder --hparams_set=transformer_multi30k_cpu
             --train_steps="$steps" --save_checkpoints_steps="$eval_every" --keep_checkpoint_max=2
             --log_every=50 --local_eval_frequency="$eval_every" --eval_steps=0
             --eval_bleu_sentences=200 --eval_early_stopping_metric=dev_bleu)

timed() {  # timed NAME COMMAND...: runs COMMAND, appends "NAME SECONDS" to times.txt
  local name=$1 start
  shift
  start=$(date +%s)
  "$@"
  echo "$name $(( $(date +%s) - start ))" >> "$work/times.txt"
}

decode_b() {  # decode_b NAME DECODE_HPARAMS: B's German into English with the reverse model
  local out=$work/raw_$1
  mkdir -p "$out"
  if [ "$engine" = ctranslate2 ]; then
    timed "backtranslate_$1" t2t-lite-decoder --engine=ctranslate2 --export_dir="$work/reverse_ct2" \
      --decode_hparams="$2" --decode_from_file="$work/raw_b/train.de" --decode_to_file="$out/train.en"
  else
    timed "backtranslate_$1" t2t-lite-decoder --output_dir="$work/reverse_chosen" \
      --decode_hparams="$2" --decode_from_file="$work/raw_b/train.de" --decode_to_file="$out/train.en"
  fi
  cp "$work/raw_b/train.de" "$out/train.de"
}

train() {  # train NAME DATA_DIR [FLAGS...]: STEPS updates, then the best by dev BLEU -> NAME_chosen
  local name=$1 data=$2
  shift 2
  timed "train_$name" t2t-lite-trainer "${train_flags[@]}" --data_dir="$data" \
    --output_dir="$work/$name" "$@"
  t2t-lite-avg-checkpoints --output_dir="$work/$name" --best --avg_dir="$work/${name}_chosen"
}

mkdir -p "$work"
for stage in $stages; do
  case $stage in
    halve)
      python "$here/halve_corpus.py" "$raw_dir" "$work/raw_a" "$work/raw_b"
      ;;
    reverse)
      timed datagen_reverse t2t-lite-datagen --problem=translate_folder --source_lang=de \
        --target_lang=en --tmp_dir="$work/raw_a" --data_dir="$work/data_reverse"
      train reverse "$work/data_reverse"
      if [ "$engine" = ctranslate2 ]; then
        t2t-lite-exporter --output_dir="$work/reverse_chosen" --format=ctranslate2 \
          --export_dir="$work/reverse_ct2" --overwrite
      fi
      ;;
    backtranslate)  # beam 4 as the dev decodes; sampling from the whole softmax at temperature 1
      decode_b bt_beam "beam_size=4,alpha=1.4"
      decode_b bt_sampled "beam_size=1,sampling_method=random,sampling_temp=1.0,sampling_seed=1"
      ;;
    data)
      folder=(--problem=translate_folder --source_lang=en --target_lang=de --tmp_dir="$work/raw_a")
      timed datagen_a_only t2t-lite-datagen "${folder[@]}" --data_dir="$work/data_a_only"
      for bt in bt_beam bt_sampled; do
        timed "datagen_$bt" t2t-lite-datagen "${folder[@]}" --data_dir="$work/data_$bt" \
          --corpus=real:1 --corpus="bt:1:$work/raw_$bt"
      done
      timed datagen_bt_tagged t2t-lite-datagen "${folder[@]}" --data_dir="$work/data_bt_tagged" \
        --corpus=real:1 --corpus="bt:1:$work/raw_bt_beam" --back_translated=bt
      timed datagen_ab_real t2t-lite-datagen "${folder[@]}" --data_dir="$work/data_ab_real" \
        --corpus=real:1 --corpus="b:1:$work/raw_b"
      ;;
    train)
      for name in ${RUNS:-$systems}; do
        train "$name" "$work/data_$name"
      done
      ;;
    score)  # the chosen checkpoint of each, on all of dev (val) and test, beam 4, alpha 1.4
      for name in reverse ${RUNS:-$systems}; do
        [ -d "$work/${name}_chosen" ] || continue
        if [ "$name" = reverse ]; then src=de tgt=en; else src=en tgt=de; fi
        for split in dev test; do
          out="$work/$name/$split.$tgt.out"
          t2t-lite-decoder --output_dir="$work/${name}_chosen" --decode_hparams="beam_size=4,alpha=1.4" \
            --decode_from_file="$work/raw_a/$split.$src" --decode_to_file="$out" >/dev/null
          echo "$name $split $(t2t-lite-bleu --translation="$out" --reference="$work/raw_a/$split.$tgt" \
            --metrics=bleu,chrf | grep ' = ' | awk '{print $3}' | tr '\n' ' ')"
        done
      done | tee -a "$work/scores.txt"
      ;;
    table)
      python "$here/back_translation_table.py" "$work"
      ;;
    *) echo "unknown stage $stage (halve reverse backtranslate data train score table)" >&2; exit 2 ;;
  esac
done
