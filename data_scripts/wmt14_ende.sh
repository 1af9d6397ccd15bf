#!/usr/bin/env bash
# The paper's Transformer-base result on one GPU: WMT14 en-de, transformer_base_fake_gpu8
# (4096 tokens x 8 accumulated micro-steps = 32768 tokens per update, like 8 GPUs),
# 100k updates, average the last checkpoints, beam 4 / alpha 0.6 on newstest2014, sacreBLEU.
# Usage: wmt14_ende.sh WORK_DIR      (needs internet once, for the corpus; run with the
#        project's .venv/bin on PATH, e.g. after `source .venv/bin/activate`)
# Environment: TRAIN_STEPS (100000), MIXED_PRECISION (true), VOCAB_SIZE (0: the problem's
# 32000). Rerunning resumes: prepared data and finished steps are reused.
set -euo pipefail
work=${1:?usage: wmt14_ende.sh WORK_DIR}
here=$(cd "$(dirname "$0")" && pwd)
tfds_dir=$work/tfds data_dir=$work/data run_dir=$work/run
mkdir -p "$work"

[ -d "$tfds_dir/wmt14_translate" ] || bash "$here/prepare_wmt14_ende.sh" "$tfds_dir"
t2t-lite-datagen --problem=translate_ende_wmt14 --tmp_dir="$tfds_dir" --data_dir="$data_dir" \
  --vocab_size="${VOCAB_SIZE:-0}"
t2t-lite-trainer --problem=translate_ende_wmt14 --hparams_set=transformer_base_fake_gpu8 \
  --hparams="mixed_precision=${MIXED_PRECISION:-true}" \
  --data_dir="$data_dir" --output_dir="$run_dir" --train_steps="${TRAIN_STEPS:-100000}" \
  --save_checkpoints_steps=1000 --keep_checkpoint_max=20 --local_eval_frequency=5000 \
  --eval_bleu_sentences=500
t2t-lite-avg-checkpoints --output_dir="$run_dir" --num_last_checkpoints=5 --avg_dir="${run_dir}_avg"
python3 - "$tfds_dir" "$work" <<'PY'
import sys
import tensorflow_datasets as tfds
ds = tfds.load("wmt14_translate/de-en", split="test", data_dir=sys.argv[1], download=False)
with open(f"{sys.argv[2]}/newstest2014.en", "w") as en, open(f"{sys.argv[2]}/newstest2014.de", "w") as de:
    for ex in tfds.as_numpy(ds):
        en.write(ex["en"].decode().replace("\n", " ") + "\n")
        de.write(ex["de"].decode().replace("\n", " ") + "\n")
PY
t2t-lite-decoder --output_dir="${run_dir}_avg" --decode_hparams="beam_size=4,alpha=0.6" \
  --decode_from_file="$work/newstest2014.en" --decode_to_file="$work/newstest2014.de.out"
t2t-lite-bleu --translation="$work/newstest2014.de.out" --reference="$work/newstest2014.de" \
  | tee "$work/bleu.txt"
