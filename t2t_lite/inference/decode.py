"""Greedy and beam search over a trained Transformer, with an incremental key/value cache.

Beam search follows tensor2tensor's: 2K candidates per step, the K best unfinished stay
alive, finished ones are scored log p / ((5 + length) / 6)^alpha, and an input is done when
no alive hypothesis can still beat the worst finished one. The output length is capped at
the longest input of the batch + `extra_length` tokens. Padding (id 0, also the start
symbol) is never predicted: its log-probability is -inf in both searches.

What makes it fast on a CPU (see the model's init_cache for the cache): the 2K candidates
are found through chunk maxima rather than a top_k over K x V; done inputs leave the batch;
batches are counted in source tokens; the search is compiled without autograph.
"""

from __future__ import annotations

import dataclasses

import tensorflow as tf

from t2t_lite.inference.batches import decode_batches
from t2t_lite.data.vocab import EOS_ID

INF = 1e7
CHUNK = 64  # candidate selection: vocabulary positions per chunk (see _top_candidates)


def length_penalty(length, alpha: float):
  """tensor2tensor's (and GNMT's) ((5 + length) / 6) ^ alpha."""
  return tf.pow((5.0 + tf.cast(length, tf.float32)) / 6.0, alpha)


def mask_padding(logits):
  """Logits [N, V] with padding's (id 0, the start symbol, never an output) at -inf."""
  vocab = logits.shape[-1]
  return logits + tf.constant([-float("inf")] + [0.0] * (vocab - 1))


def _log_z(model, masked):
  """The log of the normalizer of `masked` [N, V] logits: 0 where `model`'s steps give
  log-probabilities already (an Ensemble's mean, which stays as it is)."""
  if getattr(model, "gives_log_probs", False):
    return tf.zeros(tf.shape(masked)[:1])
  return tf.reduce_logsumexp(masked, axis=-1)


def _top_candidates(masked, offset, beam: int, count: int):
  """The `count` best (value, index) of masked[b * K + k, v] + offset[b, k] over k * V + v.

  Equal to tf.math.top_k on the [B, K * V] sums, but a full top_k over K * V is slow on a CPU
  (tens of ms for 4 x 8,000): the maxima of CHUNK-wide chunks pick the `count` chunks that
  must hold the winners (each winner is at most its chunk's maximum), then a small top_k.
  """
  batch, vocab = tf.shape(offset)[0], masked.shape[-1]
  if beam * vocab <= 4 * count * CHUNK:
    sums = tf.reshape(masked, [batch, beam, vocab]) + offset[:, :, None]
    return tf.math.top_k(tf.reshape(sums, [batch, beam * vocab]), k=count)
  width = -(-vocab // CHUNK) * CHUNK
  if width != vocab:
    masked = tf.pad(masked, [[0, 0], [0, width - vocab]], constant_values=-float("inf"))
  per_beam = width // CHUNK
  chunks = tf.reshape(masked, [batch, beam * per_beam, CHUNK])
  chunk_offset = tf.repeat(offset, per_beam, axis=1)  # [B, K * per_beam]
  _, picked = tf.math.top_k(tf.reduce_max(chunks, axis=-1) + chunk_offset, k=count)
  picked = tf.sort(picked, axis=-1)  # in index order, so ties resolve as top_k's do
  values = (tf.gather(chunks, picked, batch_dims=1) +
            tf.gather(chunk_offset, picked, batch_dims=1)[:, :, None])
  top_values, position = tf.math.top_k(tf.reshape(values, [batch, count * CHUNK]), k=count)
  index = tf.gather(picked, position // CHUNK, batch_dims=1) * CHUNK + position % CHUNK
  beam_index, token = index // width, index % width
  return top_values, beam_index * vocab + token


def _loose(structure):
  """Shape invariants: the rank is kept, every dimension may change."""
  return tf.nest.map_structure(lambda t: tf.TensorShape([None] * t.shape.rank), structure)


def _lengths(ids):
  """Tokens up to and including the first EOS of each row of ids [..., T] (T if none)."""
  width = tf.shape(ids)[-1]
  is_eos = tf.equal(ids, EOS_ID)
  first = tf.argmax(tf.cast(is_eos, tf.int32), axis=-1, output_type=tf.int32)
  return tf.where(tf.reduce_any(is_eos, axis=-1), first + 1, width)


@dataclasses.dataclass(frozen=True)
class Sampling:
  """Decoding by sampling each next token from the model's distribution (tensor2tensor's
  sampling_method=random), at `temperature` (0: argmax, tensor2tensor's meaning), from the
  `top_k` most likely tokens only (0: all) and from the smallest set holding `top_p` of the
  probability (nucleus sampling; 1: all), `samples` draws per input.

  The draws are a pure function of (`seed`, the input's index in what is translated, the
  draw, the position, the token), not of the other inputs of its batch or the number of
  threads: a rerun writes the same output. (As in every search here, an output that does
  not end is cut at its batch's longest source + extra_decode_length tokens.)"""

  temperature: float = 1.0
  top_k: int = 0
  top_p: float = 1.0
  seed: int = 0
  samples: int = 1


def _mix(x):
  """A 32-bit integer hash (uint32 -> uint32 with every input bit reaching every output bit)."""
  shift = lambda value, bits: tf.bitwise.right_shift(value, tf.constant(bits, tf.uint32))  # noqa: E731
  x = tf.bitwise.bitwise_xor(x, shift(x, 16)) * tf.constant(0x7FEB352D, tf.uint32)
  x = tf.bitwise.bitwise_xor(x, shift(x, 15)) * tf.constant(0x846CA68B, tf.uint32)
  return tf.bitwise.bitwise_xor(x, shift(x, 16))


def uniform_noise(seed: int, rows, step, tokens):
  """[len(rows), T] numbers in (0, 1) for the token ids `tokens` ([T], or [len(rows), T]),
  a hash of (seed, row, step, token): the same for the same four whatever else is decoded
  alongside, and whichever tokens are asked for with it."""
  key = _mix(tf.bitwise.bitwise_xor(tf.cast(rows, tf.uint32),
                                    _mix(tf.constant(seed % 2 ** 32, tf.uint32))))
  key = _mix(tf.bitwise.bitwise_xor(key, tf.cast(step, tf.uint32)))
  tokens = tf.cast(tokens, tf.uint32) * tf.constant(0x9E3779B9, tf.uint32)
  if tokens.shape.rank == 1:
    tokens = tokens[None, :]
  bits = _mix(tf.bitwise.bitwise_xor(key[:, None], tokens))
  top24 = tf.bitwise.right_shift(bits, tf.constant(8, tf.uint32))
  return (tf.cast(top24, tf.float32) + 0.5) / float(2 ** 24)


def allowed_logits(masked, sampling: Sampling):
  """(The logits [N, C] at the sampling temperature with those outside the top_p nucleus at
  -inf (the most likely token always stays), their token ids [N, C] or None for all V): C is
  top_k where it is set (the k likeliest only), else the vocabulary."""
  logits, tokens = masked / sampling.temperature, None
  if sampling.top_k:
    logits, tokens = tf.math.top_k(logits, k=min(sampling.top_k, logits.shape[-1]))
  if sampling.top_p < 1.0:
    probs = tf.nn.softmax(logits)
    ordered = tf.sort(probs, axis=-1, direction="DESCENDING")
    before = tf.math.cumsum(ordered, axis=-1, exclusive=True)  # mass of the likelier ones
    kept = tf.maximum(tf.reduce_sum(tf.cast(before < sampling.top_p, tf.int32), axis=-1), 1)
    least = tf.gather(ordered, kept[:, None] - 1, batch_dims=1)
    logits = tf.where(probs < least, -float("inf"), logits)
  return logits, tokens


def sampled_tokens(masked, rows, step, sampling: Sampling):
  """One token per row of `masked` [N, V], drawn from softmax(allowed_logits) by the Gumbel-max
  rule with `uniform_noise` (argmax at temperature 0)."""
  if sampling.temperature == 0:
    return tf.argmax(masked, axis=-1, output_type=tf.int32)
  logits, tokens = allowed_logits(masked, sampling)
  # with top_k, the noise of the k candidates only: the same draw as over the whole
  # vocabulary (the noise is a function of the token id, the others are at -inf)
  noise = uniform_noise(sampling.seed, rows, step,
                        tf.range(masked.shape[-1]) if tokens is None else tokens)
  best = tf.argmax(logits - tf.math.log(-tf.math.log(noise)), axis=-1, output_type=tf.int32)
  return best if tokens is None else tf.gather(tokens, best[:, None], batch_dims=1)[:, 0]


def sample_search(model, inputs, decode_length, rows, alpha: float, sampling: Sampling,
                  return_logits: bool = False):
  """As greedy_search, each token drawn by `sampling`; `rows` [B] (int) numbers the inputs'
  draws (input index x samples + draw) for the noise."""
  return greedy_search(model, inputs, decode_length, alpha, return_logits,
                       choose=lambda masked, step: sampled_tokens(masked, rows, step, sampling))


def greedy_search(model, inputs, decode_length, alpha: float = 0.0,
                  return_logits: bool = False, choose=None):
  """Argmax decoding: (ids [B, T], scores [B]) and, when asked, the logits [B, T, V].

  A score is the summed log-probability up to and including EOS / length_penalty(its length,
  alpha). `model` is a Transformer (cached decoding) or Uncached(transformer). `choose(masked
  logits [B, V], position)` picks the tokens instead of the argmax (see sample_search).
  """
  memory, bias = model.encode(inputs)
  batch = tf.shape(inputs)[0]
  ids = tf.zeros([batch, 0], tf.int32)
  logits_all = tf.zeros([batch, 0, model.vocab_size])
  finished = tf.zeros([batch], tf.bool)
  logp_sum = tf.zeros([batch])
  cache = model.init_cache(memory, 1, decode_length)

  def body(i, previous, ids, finished, logp_sum, cache, logits_all):
    logits, cache = model.decode_step(previous, i, cache, bias)
    masked = mask_padding(logits)
    chosen = (tf.argmax(masked, axis=-1, output_type=tf.int32) if choose is None
              else choose(masked, i))
    token = tf.where(finished, 0, chosen)
    picked = tf.gather(masked, token[:, None], batch_dims=1)[:, 0] - _log_z(model, masked)
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
  the best unfinished ones fill the rest, scored by their length. An input is settled once no
  alive hypothesis can beat its finished ones (tensor2tensor's bound, per input): its result
  is written then, so it does not depend on how long the other inputs of the batch run (the
  best hypothesis is the one the whole-batch loop finds), and settled inputs leave the batch
  (as soon as a quarter of it has settled), so the work shrinks as it goes.
  """
  decode_length = tf.maximum(decode_length, 1)
  memory, bias = model.encode(inputs)
  batch, beam = tf.shape(inputs)[0], beam_size
  cache = model.init_cache(memory, beam, decode_length)
  vocab = model.vocab_size
  max_penalty = length_penalty(decode_length, alpha)
  state = {
      "rows": tf.range(batch),  # the input each row of the state below stands for
      "alive_seq": tf.zeros([batch, beam, 0], tf.int32),
      "alive_logp": tf.tile(tf.constant([[0.0] + [-INF] * (beam_size - 1)]), [batch, 1]),
      "finished_seq": tf.zeros([batch, beam, 0], tf.int32),
      "finished_scores": tf.fill([batch, beam], -INF),
      "finished_flags": tf.zeros([batch, beam], tf.bool),
      "settled": tf.zeros([batch], tf.bool),
      "last": tf.zeros([batch * beam], tf.int32),
      "bias": bias,
      "cache": cache,
  }
  out_ids = tf.zeros([batch, beam, decode_length], tf.int32)
  out_scores = tf.zeros([batch, beam])

  def grow(s, i):
    """One step: 2K candidates, the K best unfinished stay alive, the ended ones compete."""
    logits, cache = model.decode_step(s["last"], i, s["cache"], s["bias"])
    rows = tf.shape(s["rows"])[0]
    masked = mask_padding(logits)
    log_z = tf.reshape(_log_z(model, masked), [rows, beam])
    top_logp, top_index = _top_candidates(masked, s["alive_logp"] - log_z, beam, 2 * beam)
    origin, token = top_index // vocab, top_index % vocab
    top_seq = tf.concat([tf.gather(s["alive_seq"], origin, batch_dims=1), token[:, :, None]], 2)
    is_eos = tf.equal(token, EOS_ID)

    _, keep = tf.math.top_k(top_logp - tf.cast(is_eos, tf.float32) * INF, k=beam)
    scores = top_logp / length_penalty(i + 1, alpha) - tf.cast(~is_eos, tf.float32) * INF
    padded = tf.pad(s["finished_seq"], [[0, 0], [0, 0], [0, 1]])
    finished_scores, best = tf.math.top_k(tf.concat([s["finished_scores"], scores], 1), k=beam)
    return {**s,
            "alive_seq": tf.gather(top_seq, keep, batch_dims=1),
            "alive_logp": tf.gather(top_logp, keep, batch_dims=1),
            "last": tf.reshape(tf.gather(token, keep, batch_dims=1), [-1]),
            "cache": model.reorder_cache(cache, tf.gather(origin, keep, batch_dims=1)),
            "finished_seq": tf.gather(tf.concat([padded, top_seq], 1), best, batch_dims=1),
            "finished_scores": finished_scores,
            "finished_flags": tf.gather(tf.concat([s["finished_flags"], is_eos], 1), best,
                                        batch_dims=1)}

  def bound_met(s):
    # tensor2tensor's bound: no alive hypothesis, even at the longest length's penalty, can
    # beat the lowest-scoring finished one (a row with none finished goes on).
    best_alive = s["alive_logp"][:, 0] / max_penalty
    lowest_finished = tf.reduce_min(
        tf.where(s["finished_flags"], s["finished_scores"], INF), axis=1)
    return tf.reduce_any(s["finished_flags"], axis=1) & (lowest_finished > best_alive)

  def settle(s, i, out_ids, out_scores):
    """Writes the results of the rows that settle now (at step i or at the length limit)."""
    now = ~s["settled"] & (bound_met(s) | (i >= decode_length))

    def write():
      ids, scores = _nbest(s["finished_seq"], s["finished_scores"], s["finished_flags"],
                           s["alive_seq"], s["alive_logp"] / length_penalty(i, alpha))
      where = tf.where(now)[:, 0]
      targets = tf.gather(s["rows"], where)[:, None]
      ids = tf.pad(tf.gather(ids, where), [[0, 0], [0, 0], [0, decode_length - i]])
      return (tf.tensor_scatter_nd_update(out_ids, targets, ids),
              tf.tensor_scatter_nd_update(out_scores, targets, tf.gather(scores, where)))

    out_ids, out_scores = tf.cond(tf.reduce_any(now), write, lambda: (out_ids, out_scores))
    return {**s, "settled": s["settled"] | now}, out_ids, out_scores

  def shrink(s):
    """The state of the unsettled rows only."""
    keep = tf.cast(tf.where(~s["settled"])[:, 0], tf.int32)
    gather = lambda t: tf.gather(t, keep)  # noqa: E731
    beams = tf.reshape(keep[:, None] * beam + tf.range(beam), [-1])
    return {**{name: gather(s[name]) for name in
               ("rows", "alive_seq", "alive_logp", "finished_seq", "finished_scores",
                "finished_flags", "settled", "bias")},
            "last": tf.gather(s["last"], beams),
            "cache": model.select_rows(s["cache"], keep)}

  def body(i, s, out_ids, out_scores):
    s = grow(s, i)
    s, out_ids, out_scores = settle(s, i + 1, out_ids, out_scores)
    count = tf.shape(s["rows"])[0]
    settled = tf.reduce_sum(tf.cast(s["settled"], tf.int32))
    s = tf.cond((4 * settled >= count) & (settled < count), lambda: shrink(s), lambda: s)
    return i + 1, s, out_ids, out_scores

  def cond(i, s, out_ids, out_scores):
    return ~tf.reduce_all(s["settled"])

  loop_vars = (tf.constant(0), state, out_ids, out_scores)
  steps, _, out_ids, out_scores = tf.while_loop(cond, body, loop_vars,
                                                shape_invariants=_loose(loop_vars))
  return out_ids[:, :, :steps], out_scores


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

  def init_cache(self, memory, beam_size: int, max_length):
    del max_length  # the prefix grows as needed
    return {"ids": tf.zeros([tf.shape(memory)[0], beam_size, 0], tf.int32), "memory": memory}

  def reorder_cache(self, cache, origin):
    return {"ids": tf.gather(cache["ids"], origin, batch_dims=1), "memory": cache["memory"]}

  def select_rows(self, cache, keep):
    return {"ids": tf.gather(cache["ids"], keep), "memory": tf.gather(cache["memory"], keep)}

  def decode_step(self, ids, position, cache, memory_bias):
    batch, beam = tf.unstack(tf.shape(cache["ids"])[:2])
    prefix = tf.concat([cache["ids"], tf.reshape(ids, [batch, beam, 1])], axis=2)
    rows = tf.reshape(prefix, [batch * beam, -1])
    logits = self.model.decode(rows, tf.repeat(cache["memory"], beam, axis=0),
                               tf.repeat(memory_bias, beam, axis=0))[:, -1]
    return logits, {"ids": prefix, "memory": cache["memory"]}


class Ensemble:
  """Several models over one vocabulary, decoded as one (the models' decoding interface): at
  each step the mean of their log-probabilities, padding excluded, as Marian ensembles with
  equal weights (fairseq averages the probabilities instead). The mean is not normalized
  again, so a translation's score is the mean of the members' scores of it, and --score_file
  writes the mean of their log p(target | source). Models of other sizes may be mixed; their
  vocabularies must be the same (the caller checks)."""

  gives_log_probs = True

  def __init__(self, models):
    self.models = list(models)
    self.vocab_size = self.models[0].vocab_size

  def uncached(self) -> "Ensemble":
    return Ensemble([Uncached(model) for model in self.models])

  def encode(self, inputs):
    encoded = [model.encode(inputs) for model in self.models]
    return tuple(memory for memory, _ in encoded), encoded[0][1]

  def init_cache(self, memory, beam_size: int, max_length):
    return tuple(model.init_cache(part, beam_size, max_length)
                 for model, part in zip(self.models, memory))

  def reorder_cache(self, cache, origin):
    return tuple(model.reorder_cache(part, origin) for model, part in zip(self.models, cache))

  def select_rows(self, cache, keep):
    return tuple(model.select_rows(part, keep) for model, part in zip(self.models, cache))

  def decode_step(self, ids, position, cache, memory_bias):
    steps = [model.decode_step(ids, position, part, memory_bias)
             for model, part in zip(self.models, cache)]
    log_probs = [tf.nn.log_softmax(mask_padding(tf.cast(logits, tf.float32)))
                 for logits, _ in steps]
    return tf.add_n(log_probs) / len(self.models), tuple(part for _, part in steps)

  def __call__(self, inputs, targets):
    """Teacher-forced: the members' mean log-probabilities [B, T, V] (as Decoder.score reads
    a model's)."""
    return tf.add_n([tf.nn.log_softmax(tf.cast(model(inputs, targets), tf.float32))
                     for model in self.models]) / len(self.models)


class Suppressed:
  """A model's decoding interface with the pieces `ids` never predicted (reserved pieces,
  such as the back-translation tag a vocabulary holds for training sources): their logits at
  -inf at every step, as padding's. Forced decoding reads the model as it is."""

  def __init__(self, model, ids):
    self.model, self.ids = model, tuple(ids)
    self.vocab_size = model.vocab_size
    self.gives_log_probs = getattr(model, "gives_log_probs", False)
    self._mask = tf.constant([-float("inf") if i in self.ids else 0.0
                              for i in range(self.vocab_size)])

  def uncached(self) -> "Suppressed":
    return Suppressed(_without_cache(self.model), self.ids)

  def encode(self, inputs):
    return self.model.encode(inputs)

  def init_cache(self, memory, beam_size: int, max_length):
    return self.model.init_cache(memory, beam_size, max_length)

  def reorder_cache(self, cache, origin):
    return self.model.reorder_cache(cache, origin)

  def select_rows(self, cache, keep):
    return self.model.select_rows(cache, keep)

  def decode_step(self, ids, position, cache, memory_bias):
    logits, cache = self.model.decode_step(ids, position, cache, memory_bias)
    return tf.cast(logits, tf.float32) + self._mask, cache

  def __call__(self, inputs, targets):
    return self.model(inputs, targets)


def _without_cache(model):
  return model.uncached() if isinstance(model, (Ensemble, Suppressed)) else Uncached(model)


class Decoder:
  """Batched translation of id sequences with a compiled search (`model`: a Transformer, or
  an Ensemble of several). `never`: ids no output holds (the vocabulary's reserved pieces,
  SubwordVocab.reserved_ids)."""

  def __init__(self, model, max_length: int = 0, extra_length: int = 50, never=()):
    self.model = Suppressed(model, never) if never else model
    self.max_length = max_length
    self.extra_length = extra_length
    self._compiled = {}

  def search_fn(self, beam_size: int, alpha: float, use_cache: bool = True):
    """The plain callable (inputs [B, S] int32, decode_length int32) -> `search`'s
    (ids [B, K, T], scores [B, K]), for wrapping in a tf.function (or exporting); it needs
    no autograph (tf.function(..., autograph=False) traces it in half the time)."""
    model = self.model if use_cache else _without_cache(self.model)

    def run(inputs, decode_length):
      return search(model, inputs, decode_length, beam_size, alpha)
    return run

  def _search(self, beam_size: int, alpha: float, use_cache: bool):
    key = (beam_size, alpha, use_cache)
    if key not in self._compiled:
      # No autograph: the search is written with tf.while_loop and tf.cond, and converting
      # it (and the model it calls) doubled the first trace, a large part of start-up.
      self._compiled[key] = tf.function(
          self.search_fn(beam_size, alpha, use_cache), autograph=False,
          input_signature=[tf.TensorSpec([None, None], tf.int32), tf.TensorSpec([], tf.int32)])
    return self._compiled[key]

  def batches(self, sources, batch_size: int = 32, batch_tokens: int = 0):
    """batching.decode_batches with this decoder's max_length."""
    return decode_batches(sources, self.max_length, batch_size, batch_tokens)

  def _sampler(self, alpha: float, sampling: Sampling, use_cache: bool):
    """The compiled sample_search: (inputs [N, S], decode_length, rows [N] int64) -> (ids
    [N, 1, T], scores [N, 1])."""
    key = ("sample", alpha, sampling, use_cache)
    if key not in self._compiled:
      model = self.model if use_cache else _without_cache(self.model)

      def run(inputs, decode_length, rows):
        ids, scores = sample_search(model, inputs, decode_length, rows, alpha, sampling)
        return ids[:, None], scores[:, None]
      self._compiled[key] = tf.function(run, autograph=False, input_signature=[
          tf.TensorSpec([None, None], tf.int32), tf.TensorSpec([], tf.int32),
          tf.TensorSpec([None], tf.int64)])
    return self._compiled[key]

  def translate_nbest(self, sources, beam_size: int = 4, alpha: float = 0.6,
                      batch_size: int = 32, use_cache: bool = True, batch_tokens: int = 0,
                      sampling: Sampling | None = None
                      ) -> list[list[tuple[list[int], float]]]:
    """Per source (lists of ids ending in EOS), in the input order: its K = beam_size best
    (ids without EOS, score) pairs, best first (one pair with greedy); with `sampling`, its
    sampling.samples draws, the best scored first. Batches: `batches` (of sources)."""
    draws = sampling.samples if sampling is not None else 1
    search = (self._search(beam_size, alpha, use_cache) if sampling is None
              else self._sampler(alpha, sampling, use_cache))
    results: list[list[tuple[list[int], float]]] = [[] for _ in sources]
    for chunk in self.batches(sources, batch_size, batch_tokens):
      rows = self._truncated([list(sources[i]) for i in chunk for _ in range(draws)])
      width = max(len(r) for r in rows)
      padded = tf.constant([r + [0] * (width - len(r)) for r in rows], tf.int32)
      length = tf.constant(width + self.extra_length, tf.int32)
      if sampling is None:
        ids, scores = search(padded, length)
      else:  # draw d of source i is row i x draws + d of the noise
        numbers = tf.constant([i * draws + d for i in chunk for d in range(draws)], tf.int64)
        ids, scores = search(padded, length, numbers)
      hypotheses = [(h[:h.index(EOS_ID)] if EOS_ID in h else h, float(score))
                    for row_ids, row_scores in zip(ids.numpy().tolist(), scores.numpy())
                    for h, score in zip(row_ids, row_scores)]
      per_source = len(hypotheses) // len(chunk)
      for n, i in enumerate(chunk):
        found = hypotheses[n * per_source:(n + 1) * per_source]
        results[i] = sorted(found, key=lambda pair: -pair[1]) if sampling else found
    return results

  def translate_ids(self, sources, beam_size: int = 4, alpha: float = 0.6,
                    batch_size: int = 32, use_cache: bool = True, batch_tokens: int = 0,
                    sampling: Sampling | None = None) -> list[list[int]]:
    """The best translation of each of `sources` (lists of ids ending in EOS), in order."""
    return [nbest[0][0] for nbest in self.translate_nbest(
        sources, beam_size, alpha, batch_size, use_cache, batch_tokens, sampling)]

  def _truncated(self, rows):
    if not self.max_length:
      return rows
    return [r[:self.max_length - 1] + [EOS_ID] if len(r) > self.max_length else r for r in rows]

  def score(self, sources, targets, batch_size: int = 0, batch_tokens: int = 0
            ) -> list[float]:
    """Forced decoding: log p(target | source), summed over the target's tokens, its EOS
    included (no length penalty, no label smoothing), for each pair of id lists ending in
    EOS, in order. Sources are truncated as for translation; batches: `batches`."""
    if "score" not in self._compiled:
      spec = tf.TensorSpec([None, None], tf.int32)
      self._compiled["score"] = tf.function(self._score_batch, autograph=False,
                                            input_signature=[spec, spec])
    results = [0.0] * len(sources)
    for chunk in self.batches(sources, batch_size, batch_tokens):
      rows = self._truncated([list(sources[i]) for i in chunk])
      wanted = [list(targets[i]) for i in chunk]
      padded = [tf.constant([r + [0] * (max(map(len, group)) - len(r)) for r in group],
                            tf.int32) for group in (rows, wanted)]
      for i, value in zip(chunk, self._compiled["score"](*padded).numpy()):
        results[i] = float(value)
    return results

  def _score_batch(self, inputs, targets):
    logits = tf.cast(self.model(inputs, targets), tf.float32)
    if not getattr(self.model, "gives_log_probs", False):
      logits = tf.nn.log_softmax(logits)
    log_probs = tf.gather(logits, targets, batch_dims=2)
    return tf.reduce_sum(tf.where(tf.not_equal(targets, 0), log_probs, 0.0), axis=1)
