"""Greedy and beam search, the cache, BLEU, checkpoint averaging and the decoder CLI."""

import os

import numpy as np
import pytest
import sacrebleu
import tensorflow as tf

from conftest import cli, tiny_hparams
from t2t_lite.inference import decode
from t2t_lite.core import registry

VOCAB = 50


def compiled(search):
  """tf.function without autograph, as Decoder compiles its search (twice as fast to trace)."""
  return tf.function(search, autograph=False)


@pytest.fixture(scope="module")
def model():
  # A random model over a small vocabulary; a zero padding embedding keeps it from
  # predicting padding everywhere, so the outputs are varied.
  model = registry.model("transformer")(tiny_hparams(), VOCAB, seed=21)
  model.embedding[0].assign(tf.zeros([model.hidden]))
  return model


@pytest.fixture(scope="module")
def inputs():
  rng = np.random.RandomState(3)
  ids = rng.randint(3, VOCAB, size=(6, 9)).astype(np.int32)
  ids[2, 4:] = 0
  ids[2, 3] = 1
  return tf.constant(ids)


def eos_leaning(vocab: int, seed: int, lean: float = 2.0):
  """A random model whose final layer norm leans towards EOS (its embedding is also its output
  row): hypotheses end at varied lengths, so beam search's bookkeeping is exercised."""
  # two layers a stack, as transformer_tiny: the seeds below give hypotheses that end early
  hparams = tiny_hparams(num_encoder_layers=2, num_decoder_layers=2)
  model = registry.model("transformer")(hparams, vocab, seed=seed)
  model.embedding[0].assign(tf.zeros([model.hidden]))
  eos = model.embedding[1]
  model.decoder_norm.bias.assign(eos * lean / tf.norm(eos))
  model.teacher_forced = tf.function(model.decode, autograph=False, input_signature=[
      tf.TensorSpec([None, None], tf.int32), tf.TensorSpec([None, None, model.hidden]),
      tf.TensorSpec([None, 1, 1, None])])
  return model


@pytest.fixture(scope="module")
def eos_model():
  return eos_leaning(VOCAB, 21)


def teacher_forced_log_probs(model, source, targets_in):
  """float64 log-probabilities [N, T, V] of the next tokens after targets_in [N, T] (start
  symbol first) given `source`, padding at -inf: the slow way, no cache."""
  targets_in = tf.constant(targets_in, tf.int32)
  memory, bias = model.encode(tf.constant([source], tf.int32))
  rows = tf.shape(targets_in)[0]
  logits = model.teacher_forced(targets_in, tf.repeat(memory, rows, 0),
                                tf.repeat(bias, rows, 0)).numpy().astype(np.float64)
  logits[..., 0] = -np.inf
  top = logits.max(-1, keepdims=True)
  return logits - top - np.log(np.exp(logits - top).sum(-1, keepdims=True))


def reference_beam_search(model, source, decode_length, beam, alpha):
  """tensor2tensor's beam search on one sentence, written plainly: every step reruns the
  decoder over the prefixes. Returns the K (ids, score) pairs, best first."""
  penalty = lambda length: ((5.0 + length) / 6.0) ** alpha  # noqa: E731
  alive = [((), 0.0)] + [((), -decode.INF)] * (beam - 1)
  finished = []  # (ids ending in EOS, score), best first
  for step in range(1, decode_length + 1):
    logp = teacher_forced_log_probs(model, source, [(0,) + ids for ids, _ in alive])[:, -1]
    sums = (np.array([lp for _, lp in alive])[:, None] + logp).ravel()
    top = np.argsort(-sums, kind="stable")[:2 * beam]  # ties: the lower index, as top_k
    vocab = logp.shape[1]
    candidates = [(alive[i // vocab][0] + (i % vocab,), sums[i]) for i in top]
    ended = [(ids, lp / penalty(step)) for ids, lp in candidates if ids[-1] == 1]
    finished = sorted(finished + ended, key=lambda pair: -pair[1])[:beam]
    alive = [(ids, lp) for ids, lp in candidates if ids[-1] != 1][:beam]
    if finished and min(sc for _, sc in finished) > alive[0][1] / penalty(decode_length):
      break
  return finished + [(ids, lp / penalty(step)) for ids, lp in alive][:beam - len(finished)]


def rows_of(ids, scores):
  """search() output -> per input, its [(ids up to and including EOS, score)]."""
  out = []
  for hypotheses, row_scores in zip(ids.numpy().tolist(), scores.numpy()):
    out.append([(tuple(h[:h.index(1) + 1] if 1 in h else h), float(sc))
                for h, sc in zip(hypotheses, row_scores)])
  return out


@pytest.mark.parametrize("beam,alpha,vocab", [(3, 1.0, VOCAB), (4, 0.6, 700)])
def test_beam_search_equals_a_plain_reference(eos_model, inputs, beam, alpha, vocab):
  # vocab 700 takes the chunked candidate selection (and pads 700 to a multiple of 64).
  model = eos_model if vocab == VOCAB else eos_leaning(vocab, 5, lean=2.5)
  sources = [[t for t in row if t] for row in inputs.numpy().tolist()]
  got = rows_of(*compiled(lambda x: decode.search(model, x, 12, beam, alpha))(inputs))
  settled_early = ended = 0
  for source, hypotheses in zip(sources, got):
    expected = reference_beam_search(model, source, 12, beam, alpha)
    assert [ids for ids, _ in hypotheses] == [tuple(ids) for ids, _ in expected]
    np.testing.assert_allclose([sc for _, sc in hypotheses], [sc for _, sc in expected],
                               rtol=0, atol=1e-4)
    assert all(0 not in ids for ids, _ in hypotheses)
    settled_early += max(len(ids) for ids, _ in hypotheses) < 12
    ended += sum(ids[-1] == 1 for ids, _ in hypotheses)
  assert settled_early and ended, "some inputs should end, and settle before the limit"


def test_scores_are_the_teacher_forced_log_probs(eos_model, inputs):
  model = eos_model
  sources = [[t for t in row if t] for row in inputs.numpy().tolist()]
  ended = 0
  for beam in (1, 3):
    ids, scores = compiled(lambda x: decode.search(model, x, 12, beam, 0.6))(inputs)
    assert ids.dtype == tf.int32 and scores.dtype == tf.float32
    assert ids.shape[:2] == (6, beam) and scores.shape == (6, beam)
    for source, hypotheses in zip(sources, rows_of(ids, scores)):
      # Best first: the ended ones by score, then (tensor2tensor's preference) unended ones.
      key = [(hyp[-1] == 1, score) for hyp, score in hypotheses]
      assert key == sorted(key, reverse=True)
      for hyp, score in hypotheses:
        logp = teacher_forced_log_probs(model, source, [(0,) + hyp[:-1]])[0]
        total = sum(logp[i, token] for i, token in enumerate(hyp))
        assert score == pytest.approx(total / ((5 + len(hyp)) / 6) ** 0.6, abs=1e-4)
        ended += hyp[-1] == 1
    for row in ids.numpy().reshape(-1, ids.shape[-1]).tolist():  # after EOS only padding
      if 1 in row:
        assert not any(row[row.index(1) + 1:])
  assert ended, "some hypotheses should end in EOS"


def test_top_candidates_equal_top_k():
  rng = np.random.RandomState(0)
  for vocab, integer in ((1000, False), (1000, True), (4096, True)):
    # Integer logits make many ties: the order must still be top_k's (lower index first).
    logits = rng.randint(-20, 5, size=(3 * 4, vocab)) if integer else rng.randn(3 * 4, vocab)
    offset = rng.randint(-3, 0, size=(3, 4)) if integer else rng.randn(3, 4)
    logits, offset = tf.constant(logits, tf.float32), tf.constant(offset, tf.float32)
    values, index = decode._top_candidates(logits, offset, 4, 8)
    sums = tf.reshape(tf.reshape(logits, [3, 4, vocab]) + offset[:, :, None], [3, 4 * vocab])
    expected = tf.math.top_k(sums, k=8)
    np.testing.assert_array_equal(values.numpy(), expected.values.numpy())
    np.testing.assert_array_equal(index.numpy(), expected.indices.numpy())


def test_padding_is_never_predicted(inputs):
  # A model that prefers padding (id 0) at every step: the layer norm's bias points the
  # final hidden state at padding's embedding, which is also its output row.
  model = registry.model("transformer")(tiny_hparams(), VOCAB, seed=21)
  pad = model.embedding[0]
  model.decoder_norm.bias.assign(pad * 50.0 / tf.norm(pad))
  logits = model(inputs, tf.ones([6, 8], tf.int32))
  assert np.mean(np.argmax(logits.numpy(), -1) == 0) > 0.9, "the model should prefer padding"
  for beam in (1, 4):
    ids, scores = compiled(lambda x: decode.search(model, x, 8, beam, 0.6))(inputs)
    ids = ids.numpy()
    assert ids.shape[2] == 8 and np.isfinite(scores.numpy()).all()
    for row in ids.reshape(-1, 8).tolist():
      body = row[:row.index(1)] if 1 in row else row
      assert body and 0 not in body


def test_cached_decoding_matches_uncached(model, inputs):
  cached = compiled(lambda x: decode.greedy_search(model, x, 15, return_logits=True))(inputs)
  uncached = compiled(lambda x: decode.greedy_search(
      decode.Uncached(model), x, 15, return_logits=True))(inputs)
  np.testing.assert_array_equal(cached[0].numpy(), uncached[0].numpy())
  np.testing.assert_allclose(cached[2].numpy(), uncached[2].numpy(), atol=1e-5, rtol=0)
  steps = cached[2].numpy()
  assert steps.shape[1] == 15 and np.abs(np.diff(steps, axis=1)).max() > 1e-2, \
      "each step's logits should depend on the position and prefix"


def test_uncached_beam_search_matches_cached(model, inputs):
  cached = compiled(lambda x: decode.beam_search(model, x, 12, 3, 0.6))(inputs)
  uncached = compiled(lambda x: decode.beam_search(decode.Uncached(model), x, 12, 3, 0.6))(
      inputs)
  np.testing.assert_array_equal(cached[0].numpy(), uncached[0].numpy())
  np.testing.assert_allclose(cached[1].numpy(), uncached[1].numpy(), atol=1e-5, rtol=0)


def test_beam_of_one_is_greedy(model, inputs):
  greedy = compiled(lambda x: decode.greedy_search(model, x, 15))(inputs)[0].numpy()
  beam = compiled(lambda x: decode.beam_search(model, x, 15, 1, 0.0))(inputs)[0].numpy()
  np.testing.assert_array_equal(beam[:, 0], greedy)


def test_beam_search_finds_a_likelier_sequence_than_greedy(model, inputs):
  def log_prob(ids):
    padded = tf.constant(ids)
    logits = model(inputs, padded)
    logp = tf.nn.log_softmax(logits)
    picked = tf.gather(logp, padded[..., None], batch_dims=2)[..., 0]
    return (picked * tf.cast(padded > 0, tf.float32)).numpy().sum(axis=1)

  def pad(rows, width=16):
    out = np.zeros([len(rows), width], np.int32)
    for i, row in enumerate(rows):
      row = list(row) + ([1] if 1 not in list(row) else [])
      row = row[:row.index(1) + 1]
      out[i, :len(row)] = row
    return out

  greedy = compiled(lambda x: decode.greedy_search(model, x, 15))(inputs)[0].numpy()
  beam = compiled(lambda x: decode.beam_search(model, x, 15, 4, 0.0))(inputs)[0][:, 0].numpy()
  ended = [1 in g.tolist() and 1 in b.tolist() for g, b in zip(greedy, beam)]
  lp_greedy, lp_beam = log_prob(pad(greedy)), log_prob(pad(beam))
  assert all(b >= g - 1e-4 for b, g, e in zip(lp_beam, lp_greedy, ended) if e)


def test_length_penalty_is_tensor2tensors():
  for length in (1, 5, 20):
    for alpha in (0.0, 0.6, 1.0):
      assert float(decode.length_penalty(length, alpha)) == pytest.approx(
          ((5 + length) / 6) ** alpha)
  # log p -6 over 10 tokens against -5 over 4: alpha 0 prefers the short one, alpha 1 the long.
  score = lambda logp, length, alpha: logp / float(decode.length_penalty(length, alpha))  # noqa
  assert score(-5, 4, 0.0) > score(-6, 10, 0.0)
  assert score(-6, 10, 1.0) > score(-5, 4, 1.0)


def test_decoder_keeps_order_and_empty_lines(tiny_run, tmp_path):
  lines = ["A man is riding a bike.", "", "Two dogs play in the snow.",
           "A very long line " + "with many words " * 40, "Kids."]
  (tmp_path / "in.txt").write_text("\n".join(lines) + "\n")
  (tmp_path / "rev.txt").write_text("\n".join(reversed(lines)) + "\n")
  for name in ("in", "rev"):
    result = cli("t2t-lite-decoder", f"--output_dir={tiny_run['output_dir']}",
        # One sentence per batch: each line's translation cannot depend on its neighbours.
        "--decode_hparams=beam_size=2,batch_size=1", f"--decode_from_file={tmp_path / name}.txt",
        f"--decode_to_file={tmp_path / name}.out", check=True)
    assert "only the first 64 are translated" in result.stderr
  out = (tmp_path / "in.out").read_text().split("\n")
  rev = (tmp_path / "rev.out").read_text().split("\n")
  assert len(out) == len(lines) + 1 and out[-1] == ""
  assert out[1] == ""
  assert out[:-1] == list(reversed(rev[:-1]))
  assert not [f for f in os.listdir(tmp_path) if ".tmp" in f]


def test_batched_translation_restores_the_input_order(model, monkeypatch):
  decoder = decode.Decoder(model, max_length=6)
  # An echo search: the "translation" of a row is the row itself, so order is visible.
  monkeypatch.setattr(decoder, "_search", lambda *args: lambda inputs, length: (
      inputs[:, None], tf.zeros([tf.shape(inputs)[0], 1])))
  sources = [[5, 6, 7, 1], [8, 1], [9, 10, 11, 12, 13, 14, 15, 1], [16, 17, 1], [18, 1]]
  out = decoder.translate_ids(sources, beam_size=4, batch_size=2)
  assert out == [[5, 6, 7], [8], [9, 10, 11, 12, 13], [16, 17], [18]]  # long one cut to 6


def test_batches_count_sentences_and_tokens():
  decoder = decode.Decoder(None, max_length=6)
  sources = [[1] * n for n in (3, 9, 2, 5, 5, 4, 1)]  # lengths with EOS; 9 is cut to 6
  # rows x longest row <= 10 tokens; a source longer than that would go alone.
  assert decoder.batches(sources, 0, 10) == [[6, 2, 0], [5, 3], [4], [1]]
  assert decoder.batches(sources, 2, 0) == [[6, 2], [0, 5], [3, 4], [1]]
  assert decoder.batches(sources, 3, 12) == [[6, 2, 0], [5, 3], [4, 1]]
  assert decoder.batches(sources, 1, 1) == [[i] for i in (6, 2, 0, 5, 3, 4, 1)]


def test_decoder_rejects_an_empty_input(tiny_run, tmp_path):
  (tmp_path / "empty.txt").write_text("")
  result = cli("t2t-lite-decoder", f"--output_dir={tiny_run['output_dir']}",
               f"--decode_from_file={tmp_path / 'empty.txt'}",
               f"--decode_to_file={tmp_path / 'out.txt'}")
  assert result.returncode == 2
  assert "is empty; nothing to decode" in result.stderr
  assert not (tmp_path / "out.txt").exists()


def test_bleu_cli_equals_sacrebleu(tmp_path):
  hyps = ["Ein Mann fährt Fahrrad.", "Zwei Hunde spielen im Schnee.", "Ein Kind lacht."]
  refs = ["Ein Mann fährt ein Fahrrad.", "Zwei Hunde spielen im Schnee.", "Ein Kind lächelt."]
  (tmp_path / "hyp").write_text("\n".join(hyps) + "\n")
  (tmp_path / "ref").write_text("\n".join(refs) + "\n")
  out = cli("t2t-lite-bleu", f"--translation={tmp_path / 'hyp'}",
            f"--reference={tmp_path / 'ref'}", check=True).stdout
  expected = sacrebleu.corpus_bleu(hyps, [refs])
  assert out.startswith(f"BLEU = {expected.score:.2f}")
  assert "tok:13a" in out and "case:mixed" in out
  (tmp_path / "short").write_text("one line\n")
  bad = cli("t2t-lite-bleu", f"--translation={tmp_path / 'short'}",
            f"--reference={tmp_path / 'ref'}")
  assert bad.returncode == 2 and "line counts differ" in bad.stderr


def test_averaged_checkpoint_is_the_mean(tiny_run, tmp_path):
  output_dir = tiny_run["output_dir"]
  avg_dir = tmp_path / "avg"
  cli("t2t-lite-avg-checkpoints", f"--output_dir={output_dir}", "--num_last_checkpoints=2",
      f"--avg_dir={avg_dir}", check=True)
  paths = list(tf.train.get_checkpoint_state(output_dir).all_model_checkpoint_paths)[-2:]
  readers = [tf.train.load_checkpoint(p) for p in paths]
  averaged = tf.train.load_checkpoint(tf.train.latest_checkpoint(str(avg_dir)))
  names = [n for n, _ in tf.train.list_variables(paths[0])
           if n.startswith("model/") and n.endswith("VARIABLE_VALUE")]
  assert len(names) > 20
  differ = 0
  for name in names:
    a, b = (r.get_tensor(name) for r in readers)
    differ += int(not np.array_equal(a, b))
    np.testing.assert_allclose(averaged.get_tensor(name), (a + b) / 2, rtol=1e-6, atol=1e-7)
  assert differ > 10, "the two checkpoints should differ"
  assert os.path.isfile(avg_dir / "hparams.json")


def test_decode_hparams_batch_size_counts_sentences_as_in_tensor2tensor():
  """batch_size is sentences per batch (tensor2tensor's meaning), batch_tokens source
  tokens; with neither, batches hold up to DEFAULT_BATCH_TOKENS source tokens."""
  from t2t_lite.inference import translator

  class Recorder:
    """A decoder that records the batches the Translator's options make."""

    def __init__(self):
      self.batches = []

    def translate_nbest(self, sources, beam_size, alpha, batch_size, use_cache, batch_tokens,
                        sampling=None):
      from t2t_lite.inference.batches import decode_batches
      self.batches = decode_batches(sources, 256, batch_size, batch_tokens)
      return [[(list(ids[:-1]), 0.0)] for ids in sources]

  class Words:
    def encode(self, line):
      return [5] * len(line.split()) + [1]

    def decode(self, ids):
      return " ".join("w" for _ in ids)

  lines = [" ".join(["w"] * 9)] * 64  # 64 sentences of 10 tokens with EOS
  sizes = {}
  for spec in ("", "batch_size=16", "batch_tokens=200", "batch_size=16,batch_tokens=60"):
    options, given = translator.decode_options(spec)
    recorder = Recorder()
    translated = translator.Translator(recorder, Words(), 256, options)(lines)
    assert translated == [" ".join(["w"] * 9)] * 64
    sizes[spec] = sorted({len(batch) for batch in recorder.batches})
  assert sizes == {"": [64],  # 640 tokens: one batch within the default 1024
                   "batch_size=16": [16], "batch_tokens=200": [4, 20],
                   "batch_size=16,batch_tokens=60": [4, 6]}
  assert translator.decode_options("batch_size=16")[0].batching() == (16, 0)
  assert translator.decode_options("")[0].batching() == (0, translator.DEFAULT_BATCH_TOKENS)


@pytest.mark.parametrize("spec, message", [
    ("batch_size=-1", "--decode_hparams: batch_size must be at least 0"),
    ("beam_size=0", "--decode_hparams: beam_size must be at least 1"),
    ("batch=64", "unknown hparam 'batch'"),
])
def test_decode_hparams_errors_name_the_setting(spec, message):
  from t2t_lite.inference import translator
  from t2t_lite.core.errors import UsageError
  with pytest.raises(UsageError, match=message):
    translator.decode_options(spec)
