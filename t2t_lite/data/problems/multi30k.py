"""Multi30k task 1 (Elliott et al., 2016): en/de/fr image descriptions, 29k training pairs.

Raw files `{train,val,test_2016_flickr}.{en,de,fr}.gz` are read from `--tmp_dir`; when one is
missing there, it is fetched from the upstream repository (needs internet).
"""

from __future__ import annotations

import os
import urllib.request

from t2t_lite.core.errors import UsageError
from t2t_lite.core.files import write_atomic
from t2t_lite.data.text import RawSplit, file_sha256, read_parallel
from t2t_lite.data.problems.base import TranslateProblem
from t2t_lite.core.registry import register_problem

UPSTREAM = "https://raw.githubusercontent.com/multi30k/dataset/master/data/task1/raw"
FILE_SPLITS = {"train": "train", "dev": "val", "test": "test_2016_flickr"}


def raw_file(tmp_dir: str, split: str, lang: str) -> str:
  """Path of a raw Multi30k file, downloading it into `tmp_dir` if it is not there."""
  name = f"{FILE_SPLITS[split]}.{lang}.gz"
  path = os.path.join(tmp_dir, name)
  if os.path.isfile(path):
    return path
  url = f"{UPSTREAM}/{name}"
  try:
    os.makedirs(tmp_dir, exist_ok=True)
    with urllib.request.urlopen(url, timeout=20) as response:
      data = response.read()
  except OSError as err:
    raise UsageError(
        f"missing Multi30k file {name}: looked for {path}, and downloading {url} failed "
        f"({err}); run data_scripts/get_multi30k.sh {tmp_dir} <dir with the .gz files>") from None
  write_atomic(path, data)
  return path


class Multi30kProblem(TranslateProblem):
  vocab_size = 8000
  num_train_shards = 4

  def read_raw(self, split: str, tmp_dir: str) -> RawSplit:
    return read_parallel(raw_file(tmp_dir, split, self.source_lang),
                         raw_file(tmp_dir, split, self.target_lang))

  def input_fingerprint(self, tmp_dir: str) -> dict:
    return {f"{FILE_SPLITS[split]}.{lang}.gz": file_sha256(raw_file(tmp_dir, split, lang))
            for split in FILE_SPLITS for lang in (self.source_lang, self.target_lang)}


def _define(source: str, target: str) -> None:
  name = f"translate_{source}{target}_multi30k"
  cls = type(name, (Multi30kProblem,), {"name": name, "source_lang": source,
                                        "target_lang": target,
                                        "__doc__": f"Multi30k {source}->{target}."})
  register_problem(cls, name=name)


for _source, _target in (("en", "de"), ("de", "en"), ("en", "fr"), ("fr", "en")):
  _define(_source, _target)
