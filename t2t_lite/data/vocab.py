"""Joint sentencepiece vocabulary: ids 0 = padding, 1 = end of sentence, 2 = unknown."""

from __future__ import annotations

import hashlib
import io
import random
import re
from typing import Iterable, Sequence

import sentencepiece as spm

from t2t_lite.data.sampling import SegmentationSampler

PAD_ID = 0
EOS_ID = 1
UNK_ID = 2
# The piece that begins every source of a back-translated corpus (datagen --back_translated;
# Caswell et al. 2019, "Tagged Back-Translation"): a vocabulary of such data holds it as one
# piece, and decoding never predicts it.
BT_TAG = "<BT>"
# The vocabulary is trained on a seeded sample of at most SAMPLE_SENTENCES sentences and
# SAMPLE_CHARACTERS characters: sentencepiece's unigram trainer takes about 20 bytes per
# character it trains on (a suffix array over all of them), so 60M characters keep it near
# 1.2 GB, for any corpus (about 460k WMT sentences, or 920k short Multi30k ones).
SAMPLE_SENTENCES = 1_000_000
SAMPLE_CHARACTERS = 60_000_000
# Sentencepiece's own cap, above any sample, so that it never samples again (its sampling
# ignores the seed: two runs gave two models); part of the trainer spec in every model.
_SPM_INPUT_SENTENCE_SIZE = 2_000_000


class VocabSizeTooHigh(ValueError):
  """The text has fewer possible pieces than the vocabulary size asked for."""

  def __init__(self, limit: int):
    super().__init__(f"vocabulary size too high for this text (at most {limit})")
    self.limit = limit


def reservoir_sample(items: Iterable[str], size: int, seed: int) -> list[str]:
  """A uniform sample of `size` items from a stream of unknown length, seeded (algorithm R).

  Memory holds `size` items whatever the stream's length; a stream of at most `size` items
  comes back whole and in order.
  """
  rng = random.Random(seed)
  sample = []
  for seen, item in enumerate(items):
    if seen < size:
      sample.append(item)
    else:
      slot = rng.randrange(seen + 1)
      if slot < size:
        sample[slot] = item
  return sample


def within_characters(sentences: list[str], budget: int, seed: int) -> list[str]:
  """`sentences` if they hold at most `budget` characters, else a seeded random subset that
  does (a random subset of a uniform sample is a uniform sample)."""
  if sum(map(len, sentences)) <= budget:
    return sentences
  shuffled = list(sentences)
  random.Random(seed).shuffle(shuffled)
  kept, total = 0, 0
  while kept < len(shuffled) and total + len(shuffled[kept]) <= budget:
    total += len(shuffled[kept])
    kept += 1
  return shuffled[:kept]


def train_sentencepiece(sentences: Sequence[str], vocab_size: int, seed: int = 1,
                        reserved: Sequence[str] = ()) -> bytes:
  """Trains a unigram sentencepiece model on `sentences`; returns the model file's bytes.
  `reserved`: pieces it holds whole whatever the text (BT_TAG).

  At most SAMPLE_SENTENCES sentences: draw them from a larger stream with
  `reservoir_sample`; beyond SAMPLE_CHARACTERS characters, a seeded random subset is used.
  The same sentences and seed always give the same model.
  """
  if len(sentences) > SAMPLE_SENTENCES:
    raise ValueError(f"{len(sentences)} sentences: sample at most {SAMPLE_SENTENCES} first")
  sentences = within_characters(list(sentences), SAMPLE_CHARACTERS, seed)
  spm.set_random_generator_seed(seed)
  model = io.BytesIO()
  try:
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(sentences), model_writer=model, vocab_size=vocab_size,
        model_type="unigram", character_coverage=1.0, pad_id=PAD_ID, eos_id=EOS_ID,
        unk_id=UNK_ID, bos_id=-1, input_sentence_size=_SPM_INPUT_SENTENCE_SIZE,
        shuffle_input_sentence=True, max_sentence_length=4096, num_threads=2, minloglevel=2,
        **({"user_defined_symbols": list(reserved)} if reserved else {}))
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
    self._sampler: SegmentationSampler | None = None

  @property
  def size(self) -> int:
    return self._sp.get_piece_size()

  def reserved_ids(self) -> tuple[int, ...]:
    """The ids of the reserved pieces this vocabulary holds (BT_TAG), which decoding never
    predicts."""
    tag = self._sp.piece_to_id(BT_TAG)
    return (tag,) if tag != UNK_ID and self._sp.id_to_piece(tag) == BT_TAG else ()

  def encode(self, text: str) -> list[int]:
    return self._sp.encode(text) + [EOS_ID]

  def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
    return [ids + [EOS_ID] for ids in self._sp.encode(list(texts))]

  def sample_batch(self, texts: Sequence[str], alpha: float, seed: int) -> list[list[int]]:
    """Subword regularization: each text's segmentation drawn from the unigram model's
    distribution over all its segmentations, sharpened by `alpha` (1: the model's
    probabilities; towards 0, more uniform), ending in EOS. The same texts, alpha and seed
    give the same ids (sampling.SegmentationSampler)."""
    if self._sampler is None:
      self._sampler = SegmentationSampler(self._sp)
    return [ids + [EOS_ID] for ids in self._sampler.sample(list(texts), alpha,
                                                           random.Random(seed))]

  def decode(self, ids: Iterable[int]) -> str:
    kept = []
    for token in ids:
      token = int(token)
      if token == EOS_ID:
        break
      if token != PAD_ID:
        kept.append(token)
    return self._sp.decode(kept)
