"""Subword sampling: the sampler draws from the distribution it claims, as sentencepiece's
does, reproducibly and in bounded memory."""

import collections
import math
import os
import random

import numpy as np
import pytest

from conftest import multi30k_dir
from t2t_lite.problems import sampling
from t2t_lite.problems.base import read_lines


@pytest.fixture(scope="module")
def processor(multi30k_data):
  import sentencepiece as spm
  from t2t_lite import registry
  return spm.SentencePieceProcessor(
      model_file=registry.problem("translate_ende_multi30k").vocab_file(multi30k_data))


def _segmentations(word, pieces):
  """Every segmentation of `word` into `pieces` (a dict piece -> (id, score))."""
  if not word:
    return [()]
  found = []
  for end in range(1, len(word) + 1):
    if word[:end] in pieces:
      found += [(pieces[word[:end]][0],) + rest for rest in _segmentations(word[end:], pieces)]
  return found


def test_a_words_draws_follow_exp_alpha_times_its_log_probability(processor):
  """For one word, the frequencies of 20,000 draws match the exact distribution: every
  segmentation's probability is proportional to exp(alpha x the sum of its pieces' scores)."""
  sampler = sampling.SegmentationSampler(processor)
  pieces = {processor.id_to_piece(i): (i, processor.get_score(i))
            for i in range(processor.get_piece_size())
            if not (processor.is_control(i) or processor.is_unknown(i))}
  word, alpha = "\u2581Schwimmbecken", 0.3
  exact = {}
  for seg in _segmentations(word, pieces):
    exact[seg] = math.exp(alpha * sum(pieces[processor.id_to_piece(i)][1] for i in seg))
  total = sum(exact.values())
  assert len(exact) > 100
  rng = random.Random(3)
  draws = collections.Counter(
      tuple(ids) for ids in sampler.sample(["Schwimmbecken"] * 20000, alpha, rng))
  assert set(draws) <= set(exact)
  for seg, weight in sorted(exact.items(), key=lambda kv: -kv[1])[:5]:
    p = weight / total
    assert abs(draws[seg] / 20000 - p) < 4 * math.sqrt(p * (1 - p) / 20000) + 1e-3, (seg, p)


def test_draws_decode_to_the_text_and_match_sentencepiece_in_length_and_variety(processor):
  """On 10,000 Multi30k sentences of each language at alpha 0.3, our draws decode to what the
  one best decodes to, and their mean length and the share of sentences segmented other than
  the one best are within 3% of sentencepiece's own sampler's (which is not seeded: the
  share's standard error is ~0.9% of it; alpha 0.2 or 0.4 moves it by over 15%)."""
  sampler = sampling.SegmentationSampler(processor)
  for lang in ("en", "de"):
    texts = read_lines(os.path.join(multi30k_dir(), f"train.{lang}.gz"))[:10000]
    best = processor.encode(texts)
    ours = sampler.sample(texts, 0.3, random.Random(1))
    theirs = processor.encode(texts, enable_sampling=True, alpha=0.3, nbest_size=-1)
    assert processor.decode(ours) == processor.decode(best)
    for a, b in ((np.mean([len(x) for x in ours]), np.mean([len(x) for x in theirs])),
                 (np.mean([x != y for x, y in zip(ours, best)]),
                  np.mean([x != y for x, y in zip(theirs, best)]))):
      assert abs(a / b - 1) < 0.03, (lang, a, b)
    assert np.mean([len(x) for x in ours]) > 1.05 * np.mean([len(x) for x in best])


def test_the_same_seed_draws_the_same_and_the_cache_stays_bounded(processor, monkeypatch):
  monkeypatch.setattr(sampling, "CACHE_WORDS", 50)
  texts = read_lines(os.path.join(multi30k_dir(), "train.de.gz"))[:500]
  first = sampling.SegmentationSampler(processor)
  draws = first.sample(texts, 0.3, random.Random(5))
  assert len(first._words) <= 50  # noqa: SLF001 (the cache is what is bounded)
  again = sampling.SegmentationSampler(processor).sample(texts, 0.3, random.Random(5))
  other = sampling.SegmentationSampler(processor).sample(texts, 0.3, random.Random(6))
  assert draws == again and draws != other


def test_a_word_no_piece_covers_keeps_its_one_best(processor):
  sampler = sampling.SegmentationSampler(processor)
  text = "Ein Hund \u4e2d\u6587 läuft."  # characters Multi30k's vocabulary lacks
  best = processor.encode(text)
  assert processor.unk_id() in best
  for seed in range(5):
    (ids,) = sampler.sample([text], 0.3, random.Random(seed))
    assert processor.unk_id() in ids and processor.decode(ids) == processor.decode(best)
