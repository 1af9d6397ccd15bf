"""Subword regularization (Kudo, 2018): segmentations sampled from a unigram vocabulary.

A unigram sentencepiece model gives every segmentation of a sentence the sum of its pieces'
log-probabilities; sampling draws one with probability proportional to exp(alpha x that
sum), by forward filtering and backward sampling over the lattice of all pieces that match
the text. alpha = 1 keeps the model's probabilities; towards 0 the draw grows uniform.

Sentencepiece samples this way too, but its generator cannot be seeded reliably from Python
(two processes given one seed draw differently), and datagen must write the same bytes for
the same inputs. So the lattice is built here, from the model's pieces and scores, on the
text as sentencepiece normalizes it (its one-best pieces, joined). Pieces never span a word
start ("▁"), so every word is a lattice of its own and is sampled on its own; a word's
forward pass is computed once and kept (up to CACHE_WORDS words), since most words recur.
A word with a character that no piece covers keeps its one-best segmentation.
"""

from __future__ import annotations

import math
import random

_WORD_START = "\u2581"
CACHE_WORDS = 20_000  # forward passes kept (~4 kB each); beyond, the cache starts again


class SegmentationSampler:
  """Draws segmentations of text from a sentencepiece unigram model, seeded."""

  def __init__(self, processor):
    self._sp = processor
    self._pieces: dict[str, tuple[int, float]] = {}
    for index in range(processor.get_piece_size()):
      if not (processor.is_control(index) or processor.is_unknown(index)
              or processor.is_unused(index)):
        self._pieces[processor.id_to_piece(index)] = (index, processor.get_score(index))
    self._longest = max(map(len, self._pieces))
    self._words: dict[tuple[str, float], list | None] = {}

  def sample(self, texts: list[str], alpha: float, rng: random.Random) -> list[list[int]]:
    """One sampled segmentation (piece ids) of each of `texts`, drawn with `rng`."""
    out = []
    for pieces in self._sp.encode(texts, out_type=str):
      ids = []
      for word in _words(pieces):
        ids.extend(self._sample_word(word, alpha, rng))
      out.append(ids)
    return out

  def best(self, text: str) -> list[int] | None:
    """The highest-scoring segmentation of `text` taken literally (a piece string, "▁"
    included) into this model's pieces, by Viterbi over the lattice; None if some character
    is in no piece."""
    n = len(text)
    score = [0.0] + [-math.inf] * n
    back: list[tuple[int, int] | None] = [None] * (n + 1)
    for end in range(1, n + 1):
      for start in range(max(0, end - self._longest), end):
        hit = self._pieces.get(text[start:end])
        if hit is not None and score[start] + hit[1] > score[end]:
          score[end], back[end] = score[start] + hit[1], (start, hit[0])
    if back[n] is None and n:
      return None
    ids, end = [], n
    while end > 0:
      start, index = back[end]
      ids.append(index)
      end = start
    return ids[::-1]

  def _sample_word(self, word: list[str], alpha: float, rng: random.Random) -> list[int]:
    text = "".join(word)
    lattice = self._words.get((text, alpha))
    if lattice is None and (text, alpha) not in self._words:
      if len(self._words) >= CACHE_WORDS:
        self._words.clear()
      lattice = self._words[(text, alpha)] = self._forward(text, alpha)
    if lattice is None:  # a character no piece covers: the one best
      return [self._sp.piece_to_id(piece) for piece in word]
    ends, log_total = lattice
    ids, end = [], len(text)
    while end > 0:
      arcs = ends[end]
      weights = [math.exp(log_total[start] + score - log_total[end]) for start, _, score in arcs]
      start, index, _ = arcs[_choose(weights, rng)]
      ids.append(index)
      end = start
    ids.reverse()
    return ids

  def _forward(self, text: str, alpha: float):
    """Arcs (start, id, alpha x score) ending at each position, and the log of the summed
    weight of all segmentations of each prefix; None if some position has no arc."""
    n = len(text)
    ends: list[list[tuple[int, int, float]]] = [[] for _ in range(n + 1)]
    for start in range(n):
      for end in range(start + 1, min(n, start + self._longest) + 1):
        hit = self._pieces.get(text[start:end])
        if hit is not None:
          ends[end].append((start, hit[0], alpha * hit[1]))
    log_total = [0.0] + [-math.inf] * n
    for end in range(1, n + 1):
      terms = [log_total[start] + score for start, _, score in ends[end]
               if log_total[start] > -math.inf]
      if not terms:
        return None
      top = max(terms)
      log_total[end] = top + math.log(sum(math.exp(t - top) for t in terms))
    return ends, log_total


def _words(pieces: list[str]) -> list[list[str]]:
  """The one-best pieces grouped by word: a new word at each piece that starts with ▁."""
  words: list[list[str]] = []
  for piece in pieces:
    if piece.startswith(_WORD_START) or not words:
      words.append([piece])
    else:
      words[-1].append(piece)
  return words


def _choose(weights: list[float], rng: random.Random) -> int:
  point = rng.random() * sum(weights)
  for index, weight in enumerate(weights):
    point -= weight
    if point < 0:
      return index
  return len(weights) - 1
