#!/usr/bin/env bash
# The fine-tuning example of docs/training.md: a Multi30k en-de model of everything but the
# descriptions of water scenes, fine-tuned on those (an in-domain slice of ~2,600 pairs) with
# a vocabulary made for them, its rows started three ways; then the two corpora mixed by
# weight. Usage: finetune_example.sh RAW_DIR WORK_DIR [STAGE...]
# RAW_DIR: Multi30k's raw .gz files (data_scripts/get_multi30k.sh); stages: slice base
# finetune mixed weights score (default: all, in that order). BASE_STEPS, TUNE_STEPS, SCRATCH_STEPS
# set the lengths of the base run, the fine-tuning runs and a run on the slice alone; RUNS
# the runs that `score` decodes and scores (appended to WORK_DIR/scores.txt).
set -euo pipefail
raw_dir=$1
work=$2
shift 2
stages=${*:-slice base finetune mixed weights score}
base_steps=${BASE_STEPS:-1500}
tune_steps=${TUNE_STEPS:-150}
scratch_steps=${SCRATCH_STEPS:-600}
words=water,ocean,beach,lake,river,pool,surf,surfer,surfing,wave,waves,boat,boats,swim,swimming,swims,swimmer
here=$(dirname "$0")
folder=(--problem=translate_folder --source_lang=en --target_lang=de)
# Fine-tuning: a short warmup to a peak rate of ~1.3e-3 (the base run's is 3.2e-3), the
# residual dropout at 0.3 from the start, the last 30% of the updates cooling down.
tune_hparams="learning_rate_warmup_steps=50,learning_rate_constant=0.15,dropout_ramp_end=0,dropout_ramp_start=0"
tune_flags=(--hparams_set=transformer_multi30k_cpu --train_steps="$tune_steps"
            --save_checkpoints_steps=50 --keep_checkpoint_max=2 --log_every=25
            --local_eval_frequency=50 --eval_steps=0 --eval_bleu_sentences=86)

for stage in $stages; do
  case $stage in
    slice)
      python "$here/slice_corpus.py" "$raw_dir" "$work/raw_water" "$work/raw_general" --words="$words"
      t2t-lite-datagen "${folder[@]}" --tmp_dir="$work/raw_general" --data_dir="$work/data_general"
      t2t-lite-datagen "${folder[@]}" --tmp_dir="$work/raw_water" --data_dir="$work/data_water" \
        --vocab_size=2000
      ;;
    base)
      t2t-lite-trainer --problem=translate_folder --hparams_set=transformer_multi30k_cpu \
        --data_dir="$work/data_general" --output_dir="$work/base" --train_steps="$base_steps" \
        --save_checkpoints_steps=100 --keep_checkpoint_max=2 --log_every=100 \
        --local_eval_frequency=0
      ;;
    finetune)
      for rows in pieces carried fresh; do
        t2t-lite-trainer --problem=translate_folder --data_dir="$work/data_water" \
          --output_dir="$work/tuned_$rows" --warm_start_from="$work/base" \
          --warm_start_vocab_rows="$rows" --hparams="$tune_hparams" "${tune_flags[@]}"
      done
      t2t-lite-trainer --problem=translate_folder --data_dir="$work/data_water" \
        --output_dir="$work/scratch_water" --hparams_set=transformer_multi30k_cpu \
        --train_steps="$scratch_steps" --save_checkpoints_steps=100 --keep_checkpoint_max=2 \
        --log_every=100 --local_eval_frequency=0
      ;;
    mixed)
      t2t-lite-datagen "${folder[@]}" --tmp_dir="$work/raw_water" --data_dir="$work/data_mixed" \
        --corpus="general:1:$work/raw_general" --corpus="water:1"
      t2t-lite-trainer --problem=translate_folder --data_dir="$work/data_mixed" \
        --output_dir="$work/tuned_mixed" --warm_start_from="$work/base" \
        --hparams="$tune_hparams" "${tune_flags[@]}"
      ;;
    weights)  # the same data, other weights: water alone; 1:1, then water alone
      switch=$((tune_steps * 2 / 3))
      for run in "water_only=water:1" "mixed_then_water=water:1/general:1;water:1@$switch"; do
        t2t-lite-trainer --problem=translate_folder --data_dir="$work/data_mixed" \
          --output_dir="$work/tuned_${run%%=*}" --warm_start_from="$work/base" \
          --hparams="$tune_hparams,corpus_weights=${run#*=}" "${tune_flags[@]}"
      done
      ;;
    score)
      for run in ${RUNS:-base tuned_pieces tuned_carried tuned_fresh scratch_water tuned_mixed \
                 tuned_water_only tuned_mixed_then_water}; do
        [ -d "$work/$run" ] || continue
        for domain in water general; do
          for split in dev test; do
            out="$work/$run/$domain.$split.de.out"
            t2t-lite-decoder --output_dir="$work/$run" --decode_hparams="beam_size=4,alpha=1.4" \
              --decode_from_file="$work/raw_$domain/$split.en" --decode_to_file="$out" >/dev/null
            echo "$run $domain $split: $(t2t-lite-bleu --translation="$out" \
              --reference="$work/raw_$domain/$split.de" | sed -n 1p)"
          done
        done
      done | tee -a "$work/scores.txt"
      ;;
    *) echo "unknown stage $stage (slice base finetune mixed weights score)" >&2; exit 2 ;;
  esac
done
