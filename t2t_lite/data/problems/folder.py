"""Any parallel corpus: `{train,dev,test}.{src,tgt}` (plain or .gz) in one directory."""

from __future__ import annotations

import glob
import os

from t2t_lite.core.errors import UsageError
from t2t_lite.data.text import RawSplit, file_sha256, read_parallel
from t2t_lite.data.problems.base import TranslateProblem
from t2t_lite.core.registry import register_problem


@register_problem(name="translate_folder")
class TranslateFolder(TranslateProblem):
  """Parallel text files in `--tmp_dir`; languages from `--source_lang/--target_lang`."""

  name = "translate_folder"
  source_lang = ""
  target_lang = ""
  vocab_size = 8000
  num_train_shards = 4

  def configure(self, source_lang: str = "", target_lang: str = "", vocab_size: int = 0,
                **options) -> None:
    super().configure(vocab_size=vocab_size, **options)
    self.source_lang = source_lang or self.source_lang
    self.target_lang = target_lang or self.target_lang

  def _path(self, tmp_dir: str, split: str, lang: str) -> str:
    if not (self.source_lang and self.target_lang):
      raise UsageError("translate_folder needs the languages: pass --source_lang=xx "
                       "--target_lang=yy (the file suffixes, e.g. train.xx)")
    plain = os.path.join(tmp_dir, f"{split}.{lang}")
    for path in (plain, plain + ".gz"):
      if os.path.isfile(path):
        return path
    present = sorted(os.path.basename(p) for p in glob.glob(os.path.join(tmp_dir, "*")))
    raise UsageError(f"missing data file {split}.{lang}: looked for {plain} and {plain}.gz "
                     f"(the folder holds: {', '.join(present[:8]) or 'nothing'})")

  def read_raw(self, split: str, tmp_dir: str) -> RawSplit:
    return read_parallel(self._path(tmp_dir, split, self.source_lang),
                         self._path(tmp_dir, split, self.target_lang))

  def input_fingerprint(self, tmp_dir: str) -> dict:
    return {os.path.basename(path): file_sha256(path)
            for split in ("train", "dev", "test")
            for lang in (self.source_lang, self.target_lang)
            for path in [self._path(tmp_dir, split, lang)]}
