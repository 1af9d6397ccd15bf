"""WMT14 English-German through tensorflow-datasets (`wmt14_translate/de-en`).

tensorflow-datasets retries DNS for minutes when offline, so nothing here lets it download:
the data must already be prepared in `--tmp_dir` (the TFDS data dir), by
`data_scripts/prepare_wmt14_ende.sh` on a machine with internet. dev = newstest2013,
test = newstest2014.
"""

from __future__ import annotations

import os

from t2t_lite.core.errors import UsageError
from t2t_lite.data.problems.base import TranslateProblem
from t2t_lite.data.text import RawSplit
from t2t_lite.core.registry import register_problem

TFDS_NAME = "wmt14_translate/de-en"
TFDS_SPLITS = {"train": "train", "dev": "validation", "test": "test"}


@register_problem(name="translate_ende_wmt14")
class TranslateEndeWmt14(TranslateProblem):
  name = "translate_ende_wmt14"
  source_lang = "en"
  target_lang = "de"
  vocab_size = 32000
  num_train_shards = 100

  def _builder(self, tmp_dir: str):
    import tensorflow_datasets as tfds
    builder = tfds.builder(TFDS_NAME, data_dir=tmp_dir)
    if not os.path.isdir(os.fspath(builder.data_dir)) or not builder.info.splits:
      raise UsageError(
          f"{TFDS_NAME} is not prepared in {tmp_dir}; on a machine with internet run "
          f"data_scripts/prepare_wmt14_ende.sh {tmp_dir} (about 1.5 GB download), then "
          f"pass --tmp_dir={tmp_dir}")
    return builder

  def read_raw(self, split: str, tmp_dir: str) -> RawSplit:
    builder = self._builder(tmp_dir)

    def pairs():
      import tensorflow_datasets as tfds
      for example in tfds.as_numpy(builder.as_dataset(split=TFDS_SPLITS[split])):
        yield (example[self.source_lang].decode("utf-8"),
               example[self.target_lang].decode("utf-8"))

    return RawSplit(pairs, source=f"tfds {TFDS_NAME}:{TFDS_SPLITS[split]}")

  def input_fingerprint(self, tmp_dir: str) -> dict:
    builder = self._builder(tmp_dir)
    return {"tfds": TFDS_NAME, "version": str(builder.info.version),
            "examples": {k: v.num_examples for k, v in builder.info.splits.items()}}
