"""Decoding with a CTranslate2 export, as t2t-lite-decoder decodes with its own search.

What is the same: the batches (sources sorted by length, as inference.decode batches them), the
output cap (the batch's longest source + `extra_length` tokens), truncation of long sources,
padding never predicted (suppressed), EOS allowed from the first step, and the final choice
among the finished hypotheses by tensor2tensor's score, log p / ((5 + length) / 6)^alpha with
the EOS counted in the length. What differs, as ctranslate2 does not offer it: its beam search
ranks hypotheses by log p / length^alpha and stops once beam_size hypotheses have finished
(tensor2tensor's stops when no alive hypothesis can still beat the worst finished one), so
the hypotheses it hands back are re-ranked here, not searched for again.
"""

from __future__ import annotations

import math
import os

from t2t_lite.inference.batches import decode_batches
from t2t_lite.core.errors import UsageError
from t2t_lite.inference.export import VOCAB_FILE, read_info
from t2t_lite.data.vocab import EOS_ID, PAD_ID, SubwordVocab


def t2t_score(ctranslate2_score: float, length: int, alpha: float) -> float:
  """ctranslate2's log p / length^alpha as tensor2tensor's log p / ((5 + length) / 6)^alpha."""
  log_prob = ctranslate2_score * length ** alpha
  return log_prob / ((5.0 + length) / 6.0) ** alpha


class Ctranslate2Decoder:
  """translate_ids / translate_nbest with inference.decode.Decoder's arguments and results."""

  def __init__(self, export_dir: str, extra_length: int, threads: int = 0):
    self.info = read_info(export_dir, "ctranslate2")
    self.vocab_file = os.path.join(export_dir, VOCAB_FILE)
    self.max_length = int(self.info["max_length"])
    self.extra_length = extra_length
    if self.max_length + extra_length > self.info["max_positions"]:
      raise UsageError(f"extra_decode_length={extra_length} is beyond this export's positions "
                       f"({self.info['max_positions']} = max_length {self.max_length} + "
                       f"{self.info['max_positions'] - self.max_length}); lower it")
    self.export_dir, self.threads = export_dir, threads or len(os.sched_getaffinity(0))
    self.translator = self._translator()
    import sentencepiece as spm
    processor = spm.SentencePieceProcessor(model_file=self.vocab_file)
    self.pieces = [processor.id_to_piece(i) for i in range(processor.get_piece_size())]
    self.ids = {piece: i for i, piece in enumerate(self.pieces)}
    # never written: padding and the vocabulary's reserved pieces (the back-translation tag)
    self.never = [[self.pieces[i]] for i in (PAD_ID, *SubwordVocab(self.vocab_file)
                                             .reserved_ids())]

  def _translator(self, seed: int | None = None):
    """A CTranslate2 translator of the export; with `seed`, its sampler seeded (CTranslate2
    seeds a translator's worker threads as it starts them)."""
    import ctranslate2
    if seed is not None:
      ctranslate2.set_random_seed(seed)
    return ctranslate2.Translator(self.export_dir, device="cpu", intra_threads=self.threads)

  def translate_nbest(self, sources, beam_size: int = 4, alpha: float = 0.6,
                      batch_size: int = 32, use_cache: bool = True, batch_tokens: int = 0,
                      sampling=None) -> list[list[tuple[list[int], float]]]:
    """Per source (ids ending in EOS), in order: (ids without EOS, tensor2tensor score) pairs,
    best first; beam_size of them (one with greedy), or with `sampling` (a decode.Sampling)
    its draws, by CTranslate2's own sampler: seeded, so a rerun on the same sources draws
    the same, but not the same draws as --engine=tensorflow."""
    if not use_cache:
      raise UsageError("use_cache=false is a setting of --engine=tensorflow; CTranslate2 "
                       "always decodes with its cache")
    search = dict(beam_size=beam_size, num_hypotheses=beam_size)
    translator = self.translator
    if sampling is not None:  # a rerun draws the same: a translator seeded for this call
      translator = self._translator(sampling.seed)
      search = dict(beam_size=1, num_hypotheses=sampling.samples,
                    sampling_topk=sampling.top_k if sampling.temperature else 1,
                    sampling_topp=sampling.top_p,
                    sampling_temperature=sampling.temperature or 1.0)
    results: list[list[tuple[list[int], float]]] = [[] for _ in sources]
    for chunk in decode_batches(sources, self.max_length, batch_size, batch_tokens):
      # ctranslate2 appends the EOS itself (add_source_eos); long sources keep
      # max_length - 1 pieces, as the decoder keeps them.
      rows = [[self.pieces[t] for t in sources[i] if t != EOS_ID][:self.max_length - 1]
              for i in chunk]
      width = max(len(r) for r in rows) + 1
      outputs = translator.translate_batch(
          rows, **search, length_penalty=alpha,
          max_decoding_length=width + self.extra_length, min_decoding_length=0,
          max_input_length=0, suppress_sequences=self.never,
          return_end_token=True, return_scores=True)
      for i, output in zip(chunk, outputs):
        nbest = []
        for pieces, score in zip(output.hypotheses, output.scores):
          ids = [self.ids[p] for p in pieces]
          score = t2t_score(score, len(ids), alpha) if len(ids) else -math.inf
          nbest.append((ids[:-1] if ids and ids[-1] == EOS_ID else ids, score))
        results[i] = sorted(nbest, key=lambda pair: -pair[1])
    return results

  def translate_ids(self, sources, beam_size: int = 4, alpha: float = 0.6,
                    batch_size: int = 32, use_cache: bool = True, batch_tokens: int = 0,
                    sampling=None) -> list[list[int]]:
    """The best translation of each of `sources` (ids ending in EOS), in order."""
    return [nbest[0][0] for nbest in self.translate_nbest(
        sources, beam_size, alpha, batch_size, use_cache, batch_tokens, sampling)]

  def score(self, sources, targets, batch_size: int = 0, batch_tokens: int = 0
            ) -> list[float]:
    """Decoder.score through CTranslate2: log p(target | source), EOS included, in order."""
    results = [0.0] * len(sources)
    for chunk in decode_batches(sources, self.max_length, batch_size, batch_tokens):
      rows = [[self.pieces[t] for t in sources[i] if t != EOS_ID][:self.max_length - 1]
              for i in chunk]
      wanted = [[self.pieces[t] for t in targets[i] if t != EOS_ID] for i in chunk]
      for i, output in zip(chunk, self.translator.score_batch(rows, wanted,
                                                              max_input_length=0)):
        results[i] = float(sum(output.log_probs))
    return results
