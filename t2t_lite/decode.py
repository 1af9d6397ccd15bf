"""Greedy and beam search over a trained Transformer, with an incremental key/value cache.

Beam search follows tensor2tensor's: 2K candidates per step, the K best unfinished stay
alive, finished ones are scored log p / ((5 + length) / 6)^alpha, and the search stops when
no alive hypothesis can still beat the worst finished one. The output length is capped at
the longest input of the batch + `extra_length` tokens. Padding (id 0, also the start
symbol) is never predicted: its log-probability is -inf in both searches.
"""

from __future__ import annotations

import tensorflow as tf

from t2t_lite.problems.vocab import EOS_ID

INF = 1e7


def length_penalty(length, alpha: float):
  """tensor2tensor's (and GNMT's) ((5 + length) / 6) ^ alpha."""
  return tf.pow((5.0 + tf.cast(length, tf.float32)) / 6.0, alpha)


def log_probs(logits):
  """log_softmax of logits [N, V] with padding's log-probability at -inf."""
  masked = tf.concat([tf.fill([tf.shape(logits)[0], 1], -float("inf")), logits[:, 1:]], 1)
  return tf.nn.log_softmax(masked)


def _loose(structure):
  """Shape invariants: the rank is kept, every dimension may change."""
  return tf.nest.map_structure(lambda t: tf.TensorShape([None] * t.shape.rank), structure)


def _reorder(cache, origin, batch, beam):
  """Selects the self-attention cache of each new beam's parent: origin [B, K]."""
  def pick(t):
    shaped = tf.reshape(t, tf.concat([[batch, beam], tf.shape(t)[1:]], 0))
    return tf.reshape(tf.gather(shaped, origin, batch_dims=1), tf.shape(t))
  return [{"self": tf.nest.map_structure(pick, layer["self"]), "cross": layer["cross"]}
          for layer in cache]


def _lengths(ids):
  """Tokens up to and including the first EOS of each row of ids [..., T] (T if none)."""
  width = tf.shape(ids)[-1]
  is_eos = tf.equal(ids, EOS_ID)
  first = tf.argmax(tf.cast(is_eos, tf.int32), axis=-1, output_type=tf.int32)
  return tf.where(tf.reduce_any(is_eos, axis=-1), first + 1, width)


def greedy_search(model, inputs, decode_length, alpha: float = 0.0,
                  return_logits: bool = False):
  """Argmax decoding: (ids [B, T], scores [B]) and, when asked, the logits [B, T, V].

  A score is the summed log-probability up to and including EOS / length_penalty(its length,
  alpha). `model` is a Transformer (cached decoding) or Uncached(transformer).
  """
  memory, bias = model.encode(inputs)
  batch = tf.shape(inputs)[0]
  ids = tf.zeros([batch, 0], tf.int32)
  logits_all = tf.zeros([batch, 0, model.vocab_size])
  finished = tf.zeros([batch], tf.bool)
  logp_sum = tf.zeros([batch])
  cache = model.init_cache(memory, batch)

  def body(i, previous, ids, finished, logp_sum, cache, logits_all):
    logits, cache = model.decode_step(previous, i, cache, bias)
    logp = log_probs(logits)
    token = tf.where(finished, 0, tf.argmax(logp, axis=-1, output_type=tf.int32))
    picked = tf.gather(logp, token[:, None], batch_dims=1)[:, 0]
    logp_sum += tf.where(finished, 0.0, picked)
    ids = tf.concat([ids, token[:, None]], axis=1)
    if return_logits:
      logits_all = tf.concat([logits_all, logits[:, None]], axis=1)
    return (i + 1, token, ids, finished | tf.equal(token, EOS_ID), logp_sum, cache,
            logits_all)

  def cond(i, previous, ids, finished, logp_sum, cache, logits_all):
    return (i < decode_length) & ~tf.reduce_all(finished)

  loop_vars = (tf.constant(0), tf.zeros([batch], tf.int32), ids, finished, logp_sum, cache,
               logits_all)
  _, _, ids, _, logp_sum, _, logits_all = tf.while_loop(cond, body, loop_vars,
                                                        shape_invariants=_loose(loop_vars))
  scores = logp_sum / length_penalty(_lengths(ids), alpha)
  return (ids, scores, logits_all) if return_logits else (ids, scores)


def beam_search(model, inputs, decode_length, beam_size: int, alpha: float):
  """Beam search: (ids [B, K, T], scores [B, K]), the K best hypotheses per input, best first.

  Finished hypotheses (ending in EOS, then padding) come first; where fewer than K finished,
  the best unfinished ones fill the rest, scored by their length T.
  """
  memory, bias = model.encode(inputs)
  batch, beam = tf.shape(inputs)[0], beam_size
  memory = tf.repeat(memory, beam, axis=0)
  bias = tf.repeat(bias, beam, axis=0)
  cache = model.init_cache(memory, batch * beam)
  vocab = model.vocab_size
  alive_seq = tf.zeros([batch, beam, 0], tf.int32)
  alive_logp = tf.tile(tf.constant([[0.0] + [-INF] * (beam_size - 1)]), [batch, 1])
  finished_seq = tf.zeros([batch, beam, 0], tf.int32)
  finished_scores = tf.fill([batch, beam], -INF)
  finished_flags = tf.zeros([batch, beam], tf.bool)
  last = tf.zeros([batch * beam], tf.int32)
  max_penalty = length_penalty(decode_length, alpha)

  def body(i, alive_seq, alive_logp, finished_seq, finished_scores, finished_flags, last,
           cache):
    logits, cache = model.decode_step(last, i, cache, bias)
    logp = tf.reshape(log_probs(logits), [batch, beam, vocab])
    candidates = tf.reshape(alive_logp[:, :, None] + logp, [batch, beam * vocab])
    top_logp, top_index = tf.math.top_k(candidates, k=2 * beam_size)
    origin, token = top_index // vocab, top_index % vocab
    top_seq = tf.concat([tf.gather(alive_seq, origin, batch_dims=1), token[:, :, None]], 2)
    is_eos = tf.equal(token, EOS_ID)

    # The K best candidates that did not end stay alive.
    _, keep = tf.math.top_k(top_logp - tf.cast(is_eos, tf.float32) * INF, k=beam_size)
    alive_seq = tf.gather(top_seq, keep, batch_dims=1)
    alive_logp = tf.gather(top_logp, keep, batch_dims=1)
    last = tf.reshape(tf.gather(token, keep, batch_dims=1), [-1])
    cache = _reorder(cache, tf.gather(origin, keep, batch_dims=1), batch, beam)

    # Candidates that ended compete with the finished ones, by length-normalised score.
    scores = top_logp / length_penalty(i + 1, alpha) - tf.cast(~is_eos, tf.float32) * INF
    padded = tf.pad(finished_seq, [[0, 0], [0, 0], [0, 1]])
    all_seq = tf.concat([padded, top_seq], axis=1)
    all_scores = tf.concat([finished_scores, scores], axis=1)
    all_flags = tf.concat([finished_flags, is_eos], axis=1)
    finished_scores, best = tf.math.top_k(all_scores, k=beam_size)
    finished_seq = tf.gather(all_seq, best, batch_dims=1)
    finished_flags = tf.gather(all_flags, best, batch_dims=1)
    return (i + 1, alive_seq, alive_logp, finished_seq, finished_scores, finished_flags,
            last, cache)

  def cond(i, alive_seq, alive_logp, finished_seq, finished_scores, finished_flags, last,
           cache):
    # tensor2tensor's bound: stop when no alive hypothesis, even at the longest length's
    # penalty, can beat the lowest-scoring finished one (rows with none finished go on).
    best_alive = alive_logp[:, 0] / max_penalty
    lowest_finished = tf.reduce_min(
        tf.where(finished_flags, finished_scores, tf.fill(tf.shape(finished_scores), INF)),
        axis=1)
    lowest_finished = tf.where(tf.reduce_any(finished_flags, axis=1), lowest_finished, -INF)
    return (i < decode_length) & ~tf.reduce_all(lowest_finished > best_alive)

  loop_vars = (tf.constant(0), alive_seq, alive_logp, finished_seq, finished_scores,
               finished_flags, last, cache)
  out = tf.while_loop(cond, body, loop_vars, shape_invariants=_loose(loop_vars))
  steps, alive_seq, alive_logp, finished_seq, finished_scores, finished_flags, _, _ = out
  return _nbest(finished_seq, finished_scores, finished_flags, alive_seq,
                alive_logp / length_penalty(steps, alpha))


def _nbest(finished_seq, finished_scores, finished_flags, alive_seq, alive_scores):
  """Per row: its finished hypotheses (sorted, best first), then alive ones to make K."""
  beam = tf.shape(finished_seq)[1]
  count = tf.reduce_sum(tf.cast(finished_flags, tf.int32), axis=1, keepdims=True)  # [B, 1]
  slot = tf.range(beam)[None, :]
  from_finished = slot < count
  index = tf.where(from_finished, slot, slot - count)
  ids = tf.where(from_finished[:, :, None], tf.gather(finished_seq, index, batch_dims=1),
                 tf.gather(alive_seq, index, batch_dims=1))
  scores = tf.where(from_finished, tf.gather(finished_scores, index, batch_dims=1),
                    tf.gather(alive_scores, index, batch_dims=1))
  return ids, scores


def search(model, inputs, decode_length, beam_size: int, alpha: float):
  """(ids [B, K, T] int32, scores [B, K] float32): the K = beam_size best hypotheses of each
  input (0-padded ids [B, S] ending in EOS), best first; K = 1 with greedy (beam_size 1).

  Each hypothesis ends in EOS and 0 padding (or runs to the end without EOS); its score is its
  summed log-probability (EOS included) / length_penalty(its length with EOS, alpha). Only
  TensorFlow ops: traceable inside a tf.function and savable.
  """
  if beam_size <= 1:
    ids, scores = greedy_search(model, inputs, decode_length, alpha)
    return ids[:, None], scores[:, None]
  return beam_search(model, inputs, decode_length, beam_size, alpha)


class Uncached:
  """The model's decoding interface without a key/value cache: every step reruns the decoder
  over the whole prefix (for measuring what the cache saves, and for testing it)."""

  def __init__(self, model):
    self.model = model
    self.vocab_size = model.vocab_size

  def encode(self, inputs):
    return self.model.encode(inputs)

  def init_cache(self, memory, batch_size):
    return [{"self": {"ids": tf.zeros([batch_size, 0], tf.int32)}, "cross": {"memory": memory}}]

  def decode_step(self, ids, position, cache, memory_bias):
    prefix = tf.concat([cache[0]["self"]["ids"], ids[:, None]], axis=1)
    logits = self.model.decode(prefix, cache[0]["cross"]["memory"], memory_bias)[:, -1]
    return logits, [{"self": {"ids": prefix}, "cross": cache[0]["cross"]}]


class Decoder:
  """Batched translation of id sequences with a compiled search."""

  def __init__(self, model, max_length: int = 0, extra_length: int = 50):
    self.model = model
    self.max_length = max_length
    self.extra_length = extra_length
    self._compiled = {}

  def search_fn(self, beam_size: int, alpha: float, use_cache: bool = True):
    """The plain callable (inputs [B, S] int32, decode_length int32) -> `search`'s
    (ids [B, K, T], scores [B, K]), for wrapping in a tf.function (or exporting)."""
    model = self.model if use_cache else Uncached(self.model)

    def run(inputs, decode_length):
      return search(model, inputs, decode_length, beam_size, alpha)
    return run

  def _search(self, beam_size: int, alpha: float, use_cache: bool):
    key = (beam_size, alpha, use_cache)
    if key not in self._compiled:
      self._compiled[key] = tf.function(self.search_fn(beam_size, alpha, use_cache),
                                        input_signature=[tf.TensorSpec([None, None], tf.int32),
                                                         tf.TensorSpec([], tf.int32)])
    return self._compiled[key]

  def translate_nbest(self, sources, beam_size: int = 4, alpha: float = 0.6,
                      batch_size: int = 32, use_cache: bool = True
                      ) -> list[list[tuple[list[int], float]]]:
    """Per source (lists of ids ending in EOS), in the input order: its K = beam_size best
    (ids without EOS, score) pairs, best first (one pair with greedy)."""
    search = self._search(beam_size, alpha, use_cache)
    order = sorted(range(len(sources)), key=lambda i: len(sources[i]))
    results: list[list[tuple[list[int], float]]] = [[] for _ in sources]
    for start in range(0, len(order), batch_size):
      chunk = order[start:start + batch_size]
      rows = [list(sources[i]) for i in chunk]
      if self.max_length:
        rows = [r[:self.max_length - 1] + [EOS_ID] if len(r) > self.max_length else r
                for r in rows]
      width = max(len(r) for r in rows)
      padded = tf.constant([r + [0] * (width - len(r)) for r in rows], tf.int32)
      ids, scores = search(padded, tf.constant(width + self.extra_length, tf.int32))
      for i, hypotheses, row_scores in zip(chunk, ids.numpy().tolist(), scores.numpy()):
        results[i] = [(h[:h.index(EOS_ID)] if EOS_ID in h else h, float(score))
                      for h, score in zip(hypotheses, row_scores)]
    return results

  def translate_ids(self, sources, beam_size: int = 4, alpha: float = 0.6,
                    batch_size: int = 32, use_cache: bool = True) -> list[list[int]]:
    """The best translation of each of `sources` (lists of ids ending in EOS), in order."""
    return [nbest[0][0] for nbest in
            self.translate_nbest(sources, beam_size, alpha, batch_size, use_cache)]
