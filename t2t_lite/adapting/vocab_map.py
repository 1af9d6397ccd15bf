"""Warm start onto another vocabulary: the rows of the embedding and softmax, by piece.

A new run whose data has another sentencepiece vocabulary than the run it starts from
(`--warm_start_from`) takes, for each piece of its vocabulary:
- carried: the source's row of the same piece string (padding, end of sentence and unknown
  by their fixed ids);
- composed: a piece the source lacks starts from the mean of the source's rows of the pieces
  its string splits into under the source's unigram model (the highest-scoring split of the
  string as it is, word-start mark included), so "▁Fahrradfahrer" starts near "▁Fahrrad" +
  "fahrer";
- new: a piece with a character the source has no piece for keeps its fresh initial row.
`--warm_start_vocab_rows` picks the rule: `pieces` (the above), `carried` (composed pieces
start fresh too) or `fresh` (every vocabulary row starts fresh; only the rest of the model is
carried), the last two to measure what the mapping is worth (docs/training.md).
With --warm_start_optimizer, Adam's moments are carried for the carried rows and start at 0
for the composed and new ones (their gradients' history belongs to other pieces).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from t2t_lite.data.sampling import SegmentationSampler
from t2t_lite.data.vocab import EOS_ID, PAD_ID, UNK_ID

CARRIED, COMPOSED, NEW = "carried", "composed", "new"
ROW_RULES = ("pieces", "carried", "fresh")  # --warm_start_vocab_rows


@dataclass
class VocabMapping:
  """For each piece of the new vocabulary, where its row comes from."""

  kinds: list[str]                    # CARRIED, COMPOSED or NEW, by new id
  sources: list[list[int]]            # the source ids it comes from (one when carried)
  source_size: int
  examples: dict = field(default_factory=dict)  # a few composed pieces, for the log

  def counts(self) -> dict:
    return {kind: self.kinds.count(kind) for kind in (CARRIED, COMPOSED, NEW)}

  def summary(self) -> str:
    counts = self.counts()
    return (f"of {len(self.kinds):,} pieces, {counts[CARRIED]:,} carried from the source's "
            f"{self.source_size:,} by piece, {counts[COMPOSED]:,} composed from the source's "
            f"pieces of their text, {counts[NEW]:,} new")

  def map_rows(self, source: np.ndarray, fresh: np.ndarray, axis: int = 0) -> np.ndarray:
    """The new variable: `fresh` (its initial value) with the rows (along `axis`) of the
    carried and composed pieces taken from `source`."""
    src = np.moveaxis(source, axis, 0)
    out = np.array(np.moveaxis(fresh, axis, 0), copy=True)
    for new_id, (kind, ids) in enumerate(zip(self.kinds, self.sources)):
      if kind == CARRIED:
        out[new_id] = src[ids[0]]
      elif kind == COMPOSED:
        out[new_id] = src[ids].mean(axis=0)
    return np.moveaxis(out, 0, axis)

  def map_moments(self, source: np.ndarray, axis: int = 0) -> np.ndarray:
    """Adam's moments of a vocabulary variable: the carried rows' from `source`, 0 for the
    others."""
    src = np.moveaxis(source, axis, 0)
    shape = list(src.shape)
    shape[0] = len(self.kinds)
    out = np.zeros(shape, src.dtype)
    for new_id, (kind, ids) in enumerate(zip(self.kinds, self.sources)):
      if kind == CARRIED:
        out[new_id] = src[ids[0]]
    return np.moveaxis(out, 0, axis)


def mapping(source_vocab, new_vocab, rows: str = "pieces") -> VocabMapping:
  """Where each piece of `new_vocab` starts from in `source_vocab` (both SubwordVocab), by
  the rule `rows` (one of ROW_RULES)."""
  if rows not in ROW_RULES:
    raise ValueError(f"rows={rows!r}: one of {', '.join(ROW_RULES)}")
  old, new = source_vocab._sp, new_vocab._sp  # noqa: SLF001 (the sentencepiece models)
  fixed = {PAD_ID, EOS_ID, UNK_ID}
  by_piece = {old.id_to_piece(i): i for i in range(old.get_piece_size()) if i not in fixed}
  splitter = SegmentationSampler(old)
  kinds, sources, examples = [], [], {}
  for new_id in range(new.get_piece_size()):
    piece = new.id_to_piece(new_id)
    if rows == "fresh":
      kinds.append(NEW)
      sources.append([])
      continue
    if new_id in fixed:
      kinds.append(CARRIED)
      sources.append([new_id])
      continue
    if piece in by_piece:
      kinds.append(CARRIED)
      sources.append([by_piece[piece]])
      continue
    parts = splitter.best(piece) if rows == "pieces" else None
    if parts:
      kinds.append(COMPOSED)
      sources.append(parts)
      if len(examples) < 3:
        examples[piece] = [old.id_to_piece(i) for i in parts]
    else:
      kinds.append(NEW)
      sources.append([])
  return VocabMapping(kinds, sources, old.get_piece_size(), examples)
