"""A datagen's training corpora: the problem's own training split, and more of --corpus.

`--corpus=NAME:WEIGHT:DIR` adds the corpus in DIR (`train.<source_lang>` and
`train.<target_lang>`, plain or .gz); `--corpus=NAME:WEIGHT` names and weighs the problem's own
training split (else it is "main", of weight 1). The own corpus comes first; its training
splits keep their names ("train", "train_sampled"), another's are "<split>.<name>". Without
--corpus the data has one corpus and its manifest no `corpora` (as before corpora existed).
Training samples the corpora by weight (t2t_lite.data.curriculum).
"""

from __future__ import annotations

import math
import os

from t2t_lite.core.errors import UsageError
from t2t_lite.core.hparams_check import CORPUS_NAME

OWN = "main"  # the name of the problem's own training corpus, unless --corpus names it
# The training pairs again, each in `subword_sampling.copies` sampled segmentations (data
# made with subword sampling; "train" holds their one best segmentation).
SAMPLED = "train_sampled"  # (the second of snapshot.TRAINING_SPLITS)


def corpus_file(folder: str, lang: str) -> str:
  """`folder`/train.`lang`, plain or gzip: a training corpus's file of one language."""
  plain = os.path.join(folder, f"train.{lang}")
  for path in (plain, plain + ".gz"):
    if os.path.isfile(path):
      return path
  raise UsageError(f"missing corpus file train.{lang}: looked for {plain} and {plain}.gz")


def _entry(text: str) -> dict:
  name, _, rest = text.partition(":")
  weight_text, _, folder = rest.partition(":")
  try:
    weight = float(weight_text)
  except ValueError:
    weight = -1.0
  if not CORPUS_NAME.match(name) or not 0 < weight < math.inf:
    raise UsageError(f"--corpus={text}: write NAME:WEIGHT[:DIR], a name of lowercase letters, "
                     "digits, '_' and '-', a weight above 0, and the folder of its "
                     "train.<lang> files (none: the problem's own training split)")
  if folder and not os.path.isdir(folder):
    raise UsageError(f"--corpus={text}: {folder} is not a folder")
  return {"name": name, "weight": weight, "dir": folder}


def parse(entries) -> list[dict]:
  """The corpora (name, weight, dir; "" for the own one) of --corpus `entries`, the own one
  first; [] for none."""
  corpora = []
  for text in entries:
    entry = _entry(text)
    if any(c["name"] == entry["name"] for c in corpora):
      raise UsageError(f"--corpus: the name {entry['name']} is given twice; give each corpus "
                       "its own")
    corpora.append(entry)
  if not corpora:
    return []
  own = [c for c in corpora if not c["dir"]]
  others = [c for c in corpora if c["dir"]]
  if len(own) > 1:
    raise UsageError(f"--corpus: {own[0]['name']} and {own[1]['name']} both name the problem's "
                     "own training split (no DIR); give the other a folder")
  if not others:
    raise UsageError("--corpus: one corpus is the problem's own training split; add another "
                     "with --corpus=NAME:WEIGHT:DIR, or drop --corpus")
  if not own and any(c["name"] == OWN for c in others):
    raise UsageError(f"--corpus: {OWN} names the problem's own training split; give the "
                     "corpus of that folder another name")
  return (own or [{"name": OWN, "weight": 1.0, "dir": ""}]) + others


class TrainingCorpora:
  """The training corpora of one datagen (see the module docstring). `back_translated`: the
  names of those whose sources are back-translated (datagen --back_translated): each of their
  sources begins with the reserved piece vocab.BT_TAG."""

  def __init__(self, entries=(), back_translated=()):
    self.entries = parse(entries)
    names = [c["name"] for c in self.entries]
    for name in back_translated:
      if name not in names:
        raise UsageError(f"--back_translated={name} names no corpus of --corpus"
                         f"{' (' + ', '.join(names) + ')' if names else ''}; name one of "
                         "them, each given with --corpus=NAME:WEIGHT[:DIR]")
    for corpus in self.entries:
      if corpus["name"] in back_translated:
        corpus["back_translated"] = True

  def tagged(self, index: int) -> bool:
    """Whether the index-th corpus's sources carry the back-translation tag."""
    return bool(self.entries) and self.entries[index].get("back_translated", False)

  @property
  def any_tagged(self) -> bool:
    return any(c.get("back_translated") for c in self.entries)

  def __bool__(self) -> bool:
    return bool(self.entries)

  def settings(self) -> dict:
    """What the manifest's settings say of them (nothing for one corpus: data made before
    corpora stays up to date)."""
    if not self.entries:
      return {}
    return {"corpora": [{"name": c["name"], "weight": c["weight"],
                         **({"back_translated": True} if c.get("back_translated") else {})}
                        for c in self.entries]}

  def manifest(self) -> dict:
    """The manifest's `corpora`: name, weight and the split of the one best, in order."""
    if not self.entries:
      return {}
    return {"corpora": [{"name": c["name"], "weight": c["weight"],
                         "split": split_name("train", c["name"], index == 0),
                         **({"back_translated": True} if c.get("back_translated") else {})}
                        for index, c in enumerate(self.entries)]}

  def training_splits(self, sampled: bool) -> dict[str, tuple[int, bool]]:
    """The training splits datagen writes: name -> (its corpus's index, whether it holds
    sampled segmentations)."""
    kinds = ("train",) + ((SAMPLED,) if sampled else ())
    return {split_name(kind, corpus["name"], index == 0): (index, kind == SAMPLED)
            for index, corpus in enumerate(self.entries or [{"name": OWN}])
            for kind in kinds}

  def inputs(self, source_lang: str, target_lang: str) -> dict:
    """The sha256 of the other corpora's files, by corpus and file name."""
    from t2t_lite.data.text import file_sha256
    return {f"{corpus['name']}/{os.path.basename(path)}": file_sha256(path)
            for corpus in self.entries[1:] for lang in (source_lang, target_lang)
            for path in [corpus_file(corpus["dir"], lang)]}

  def raw(self, own, source_lang: str, target_lang: str) -> list:
    """The training pairs of each corpus (base.RawSplit), `own` (the problem's) first."""
    from t2t_lite.data.text import read_parallel
    return [own] + [read_parallel(corpus_file(c["dir"], source_lang),
                                  corpus_file(c["dir"], target_lang))
                    for c in self.entries[1:]]

  def label(self, index: int) -> str:
    """The name of the index-th corpus's training split in datagen's messages."""
    return "train" if not index else f"train ({self.entries[index]['name']})"


def split_name(kind: str, name: str, own: bool) -> str:
  """The split of training split kind `kind` ("train" or SAMPLED) of the corpus `name`,
  `own` if it is the problem's own."""
  return kind if own else f"{kind}.{name}"
