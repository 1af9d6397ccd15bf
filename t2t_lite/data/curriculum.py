"""Several training corpora, sampled by weight: the curriculum and each batch's corpus.

Datagen may write several named training corpora into one data directory, each with a
weight (the manifest's `corpora`). The run's weights are those, or the hparam
`corpus_weights`, a curriculum of phases "name:w/name:w@U;...": each phase's weights hold
from the update after U on (the first phase's "@0" may be left out; a corpus a phase does
not name has weight 0 in it). So "general:1/water:1;water:1@2000" mixes the two evenly for
2,000 updates, then reads only water.

Batch g of the training stream comes whole from one corpus, drawn with probability
proportional to the weights in force at the update that reads it, by a hash of (seed, g):
the draw needs no state and is the same on every worker. A corpus's batches are its own
planned stream (stream.SplitPlan, one per corpus and segmentation), read in turn, so the
data position of a run is, per corpus and segmentation, the number of its batches read so
far: a few integers in the checkpoint (`corpus_batches`, with the target tokens read per
corpus, `corpus_tokens`). Every process advances them for all replicas' batches, from the
examples' lengths alone, so they agree without communication and a run resumes exactly on
any layout, and across a change of the weights.

Batches are cut by tokens, so a corpus's share of the batches is its share of the tokens
trained, within the padding (a few percent): weights are proportions of tokens, not of
sentence pairs. (The stream itself is mixing.MixedStream; this module needs no TensorFlow.)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from t2t_lite.core.errors import UsageError
from t2t_lite.core.hparams_check import CORPUS_WEIGHTS as HPARAM
from t2t_lite.core.hparams_check import parse_corpus_weights

_GOLDEN, _MIX1, _MIX2 = 0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB


@dataclass(frozen=True)
class Curriculum:
  """The weights of the corpora `names` by update: `phases` = ((after, weights), ...), the
  weights normalized to sum to 1, in the order of `names`."""
  names: tuple[str, ...]
  phases: tuple[tuple[int, tuple[float, ...]], ...]

  @classmethod
  def of(cls, text: str, corpora: list[dict]) -> "Curriculum":
    """The curriculum of hparam text `text` over the data's `corpora` (the manifest's
    entries: name, weight), or, with no text, the data's own weights throughout."""
    names = tuple(corpus["name"] for corpus in corpora)
    given = (parse_corpus_weights(text) if text.strip()
             else [(0, {c["name"]: c["weight"] for c in corpora})])
    phases = []
    for after, weights in given:
      unknown = sorted(set(weights) - set(names))
      if unknown:
        raise UsageError(f"{HPARAM}: the data has no corpus {', '.join(unknown)}; its corpora "
                         f"are {', '.join(names)}")
      total = sum(weights.values())
      phases.append((after, tuple(weights.get(name, 0.0) / total for name in names)))
    return cls(names, tuple(phases))

  def weights_at(self, update: int) -> tuple[float, ...]:
    """The weights of update `update` (1-based)."""
    current = self.phases[0][1]
    for after, weights in self.phases:
      if after < update:
        current = weights
    return current

  def differ(self, first: int, last: int) -> bool:
    """Whether some update of `first`..`last` has other weights than `first`."""
    return any(first <= after < last for after, _ in self.phases[1:])

  def lines(self) -> list[str]:
    """The curriculum, a line a phase, for the log."""
    out = []
    for number, (after, weights) in enumerate(self.phases):
      end = (f"-{self.phases[number + 1][0]}" if number + 1 < len(self.phases) else " on")
      shares = ", ".join(f"{name} {100 * w:.1f}%" for name, w in zip(self.names, weights))
      out.append(f"corpora, updates {after + 1}{end}: {shares} of the batches")
    return out


def batch_corpora(seed: int, numbers: np.ndarray, weights) -> np.ndarray:
  """The corpus of each global batch in `numbers`: a draw with probabilities `weights` from a
  uniform number hashed from (seed, batch number) by splitmix64 (the same on every platform
  and process)."""
  with np.errstate(over="ignore"):
    x = (np.uint64(seed) * np.uint64(_GOLDEN) + np.asarray(numbers, np.uint64)
         * np.uint64(_MIX2) + np.uint64(_GOLDEN))
    x = (x ^ (x >> np.uint64(30))) * np.uint64(_MIX1)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(_MIX2)
    x = x ^ (x >> np.uint64(31))
  uniform = (x >> np.uint64(11)).astype(np.float64) * 2.0 ** -53
  bounds = np.cumsum(np.asarray(weights, np.float64))
  chosen = np.searchsorted(bounds / bounds[-1], uniform, side="right")
  # (never past the last corpus with a positive weight)
  last = int(np.flatnonzero(np.asarray(weights) > 0)[-1])
  return np.minimum(chosen, last)
