"""Joint sentencepiece vocabulary: ids 0 = padding, 1 = end of sentence, 2 = unknown."""

from __future__ import annotations

import hashlib
import io
import re
from typing import Iterable, Sequence

import sentencepiece as spm

PAD_ID = 0
EOS_ID = 1
UNK_ID = 2


class VocabSizeTooHigh(ValueError):
  """The text has fewer possible pieces than the vocabulary size asked for."""

  def __init__(self, limit: int):
    super().__init__(f"vocabulary size too high for this text (at most {limit})")
    self.limit = limit


def train_sentencepiece(sentences: Iterable[str], vocab_size: int, seed: int = 1) -> bytes:
  """Trains a unigram sentencepiece model on `sentences`; returns the model file's bytes."""
  spm.set_random_generator_seed(seed)
  model = io.BytesIO()
  try:
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(sentences), model_writer=model, vocab_size=vocab_size,
        model_type="unigram", character_coverage=1.0, pad_id=PAD_ID, eos_id=EOS_ID,
        unk_id=UNK_ID, bos_id=-1, input_sentence_size=2_000_000, shuffle_input_sentence=True,
        max_sentence_length=4096, num_threads=2, minloglevel=2)
  except RuntimeError as err:
    found = re.search(r"Vocabulary size too high \(\d+\)\. Please set it to a value <= (\d+)",
                      str(err))
    if found:
      raise VocabSizeTooHigh(int(found.group(1))) from None
    raise
  return model.getvalue()


def sha256(data: bytes) -> str:
  return hashlib.sha256(data).hexdigest()


class SubwordVocab:
  """Encodes text to ids ending in EOS, and decodes ids back to detokenized text."""

  def __init__(self, model_file: str):
    self.model_file = model_file
    self._sp = spm.SentencePieceProcessor(model_file=model_file)

  @property
  def size(self) -> int:
    return self._sp.get_piece_size()

  def encode(self, text: str) -> list[int]:
    return self._sp.encode(text) + [EOS_ID]

  def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
    return [ids + [EOS_ID] for ids in self._sp.encode(list(texts))]

  def decode(self, ids: Iterable[int]) -> str:
    kept = []
    for token in ids:
      token = int(token)
      if token == EOS_ID:
        break
      if token != PAD_ID:
        kept.append(token)
    return self._sp.decode(kept)
