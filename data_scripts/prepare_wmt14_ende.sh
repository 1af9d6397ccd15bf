#!/usr/bin/env bash
# Downloads and prepares WMT14 English-German with tensorflow-datasets (needs internet,
# about 1.5 GB of downloads and 10-30 minutes). Usage: prepare_wmt14_ende.sh TFDS_DIR
# Afterwards: t2t-lite-datagen --problem=translate_ende_wmt14 --tmp_dir=TFDS_DIR --data_dir=...
set -euo pipefail
tfds_dir=${1:?usage: prepare_wmt14_ende.sh TFDS_DIR}
python3 - "$tfds_dir" <<'PY'
import sys
import tensorflow_datasets as tfds
builder = tfds.builder("wmt14_translate/de-en", data_dir=sys.argv[1])
builder.download_and_prepare()
print({split: info.num_examples for split, info in builder.info.splits.items()})
PY
