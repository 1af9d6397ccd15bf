"""Greedy and beam search over a trained Transformer, with an incremental key/value cache.

Beam search follows tensor2tensor's: 2K candidates per step, the K best unfinished stay
alive, finished ones are scored log p / ((5 + length) / 6)^alpha, and the search stops when
no alive hypothesis can still beat the worst finished one. The output length is capped at
the longest input of the batch + `extra_length` tokens.
"""

from __future__ import annotations

import tensorflow as tf

from t2t_lite.problems.vocab import EOS_ID

INF = 1e7


def length_penalty(length, alpha: float):
  """tensor2tensor's (and GNMT's) ((5 + length) / 6) ^ alpha."""
  return tf.pow((5.0 + tf.cast(length, tf.float32)) / 6.0, alpha)


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


def greedy_search(model, inputs, decode_length, return_logits: bool = False):
  """Argmax decoding. Returns ids [B, T] (and logits [B, T, V] when asked).

  `model` is a Transformer (cached decoding) or Uncached(transformer).
  """
  memory, bias = model.encode(inputs)
  batch = tf.shape(inputs)[0]
  ids = tf.zeros([batch, 0], tf.int32)
  logits_all = tf.zeros([batch, 0, model.vocab_size])
  finished = tf.zeros([batch], tf.bool)
  cache = model.init_cache(memory, batch)

  def body(i, previous, ids, finished, cache, logits_all):
    logits, cache = model.decode_step(previous, i, cache, bias)
    token = tf.where(finished, 0, tf.argmax(logits, axis=-1, output_type=tf.int32))
    ids = tf.concat([ids, token[:, None]], axis=1)
    if return_logits:
      logits_all = tf.concat([logits_all, logits[:, None]], axis=1)
    return i + 1, token, ids, finished | tf.equal(token, EOS_ID), cache, logits_all

  def cond(i, previous, ids, finished, cache, logits_all):
    return (i < decode_length) & ~tf.reduce_all(finished)

  loop_vars = (tf.constant(0), tf.zeros([batch], tf.int32), ids, finished, cache, logits_all)
  _, _, ids, _, _, logits_all = tf.while_loop(cond, body, loop_vars,
                                              shape_invariants=_loose(loop_vars))
  return (ids, logits_all) if return_logits else ids


def beam_search(model, inputs, decode_length, beam_size: int, alpha: float):
  """Beam search; returns the best hypothesis per input, ids [B, T]."""
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
    logp = tf.reshape(tf.nn.log_softmax(logits), [batch, beam, vocab])
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
  _, alive_seq, _, finished_seq, _, finished_flags, _, _ = out
  any_finished = tf.reduce_any(finished_flags, axis=1)
  return tf.where(any_finished[:, None], finished_seq[:, 0], alive_seq[:, 0])


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

  def _search(self, beam_size: int, alpha: float, use_cache: bool):
    key = (beam_size, alpha, use_cache)
    if key not in self._compiled:
      model = self.model if use_cache else Uncached(self.model)

      def search(inputs, decode_length):
        if beam_size <= 1:
          return greedy_search(model, inputs, decode_length)
        return beam_search(model, inputs, decode_length, beam_size, alpha)
      self._compiled[key] = tf.function(search, input_signature=[
          tf.TensorSpec([None, None], tf.int32), tf.TensorSpec([], tf.int32)])
    return self._compiled[key]

  def translate_ids(self, sources, beam_size: int = 4, alpha: float = 0.6,
                    batch_size: int = 32, use_cache: bool = True) -> list[list[int]]:
    """Translations of `sources` (lists of ids ending in EOS), in the input order."""
    search = self._search(beam_size, alpha, use_cache)
    order = sorted(range(len(sources)), key=lambda i: len(sources[i]))
    results: list[list[int]] = [[] for _ in sources]
    for start in range(0, len(order), batch_size):
      chunk = order[start:start + batch_size]
      rows = [list(sources[i]) for i in chunk]
      if self.max_length:
        rows = [r[:self.max_length - 1] + [EOS_ID] if len(r) > self.max_length else r
                for r in rows]
      width = max(len(r) for r in rows)
      padded = tf.constant([r + [0] * (width - len(r)) for r in rows], tf.int32)
      out = search(padded, tf.constant(width + self.extra_length, tf.int32)).numpy()
      for i, row in zip(chunk, out):
        ids = [int(t) for t in row]
        results[i] = ids[:ids.index(EOS_ID)] if EOS_ID in ids else ids
    return results
