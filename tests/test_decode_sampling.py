"""Decoding by sampling (tensor2tensor's sampling_method=random, its temperature and top-k, and
nucleus sampling): the draws follow the model's distribution, stay in their set, are a
function of the seed alone, and go through both engines."""

import numpy as np
import pytest
import tensorflow as tf

from conftest import cli, tiny_hparams
from t2t_lite.core import registry
from t2t_lite.core.errors import UsageError
from t2t_lite.inference import decode, translator

VOCAB = 40
DRAWS = 4000


@pytest.fixture(scope="module")
def model():
  model = registry.model("transformer")(tiny_hparams(), VOCAB, seed=5)
  model.embedding[0].assign(tf.zeros([model.hidden]))
  return model


def _draws(model, sampling, count=DRAWS):
  """`count` draws for one source: (ids [count, T], the logits [count, T, V] each saw)."""
  source = tf.constant([[5, 9, 12, 7, 1]] * count, tf.int32)
  search = tf.function(lambda inputs, rows: decode.sample_search(
      model, inputs, tf.constant(6), rows, 0.0, sampling, return_logits=True), autograph=False)
  ids, _, logits = search(source, tf.range(count, dtype=tf.int64))
  return ids.numpy(), logits.numpy()


def test_the_first_token_follows_the_softmax_at_the_temperature(model):
  """Over 4,000 draws each token's share is within 5 standard errors (+ 0.002) of its
  probability softmax(logits / 0.7); the draws are a fixed function of the seed, so the
  bound is checked, not hoped for."""
  ids, logits = _draws(model, decode.Sampling(temperature=0.7, seed=3))
  masked = decode.mask_padding(tf.constant(logits[:1, 0])).numpy()[0]
  probs = tf.nn.softmax(masked / 0.7).numpy()
  shares = np.bincount(ids[:, 0], minlength=VOCAB) / DRAWS
  bound = 5 * np.sqrt(probs * (1 - probs) / DRAWS) + 0.002
  assert (np.abs(shares - probs) <= bound).all(), np.abs(shares - probs).max()
  assert (probs > 0.01).sum() >= 5  # a spread distribution, not one token
  assert shares[0] == 0  # padding is never drawn


@pytest.mark.parametrize("sampling", [decode.Sampling(top_k=3, seed=4),
                                      decode.Sampling(top_p=0.5, seed=4),
                                      decode.Sampling(top_k=5, top_p=0.6, temperature=1.3)])
def test_top_k_and_top_p_draws_never_leave_their_set(model, sampling):
  ids, logits = _draws(model, sampling, count=500)
  checked = 0
  for row_ids, row_logits in zip(ids, logits):
    for token, step in zip(row_ids, row_logits):
      masked = decode.mask_padding(tf.constant(step[None])).numpy()[0] / sampling.temperature
      order = np.argsort(-masked)
      allowed = set(order[:sampling.top_k].tolist()) if sampling.top_k else set(range(VOCAB))
      if sampling.top_p < 1:
        probs = tf.nn.softmax(masked).numpy()[order]
        nucleus = order[:max(int((np.cumsum(probs) - probs < sampling.top_p).sum()), 1)]
        allowed &= set(nucleus.tolist())
      assert token in allowed
      checked += 1
      if token == 1:
        break
  assert checked > 1000
  assert len(set(ids[:, 0].tolist())) > 1  # still a draw


def test_temperature_toward_zero_is_greedy(model):
  greedy = tf.function(lambda x: decode.greedy_search(model, x, tf.constant(8)),
                       autograph=False)
  source = tf.constant([[5, 9, 12, 7, 1], [8, 3, 1, 0, 0]], tf.int32)
  expected, scores = greedy(source)
  for temperature in (1e-4, 0.0):
    sampling = decode.Sampling(temperature=temperature, seed=9)
    ids, sampled_scores = decode.sample_search(model, source, tf.constant(8),
                                               tf.constant([0, 1], tf.int64), 0.0, sampling)
    np.testing.assert_array_equal(ids.numpy(), expected.numpy())
    np.testing.assert_allclose(sampled_scores.numpy(), scores.numpy(), rtol=1e-6)


def test_the_draws_are_a_function_of_the_seed_not_of_the_batch(model):
  """(Of equal length, so that every batch caps the output at the same length.)"""
  sources = [[5, 9, 12, 7, 1], [8, 3, 4, 9, 1], [20, 21, 22, 23, 1], [6, 30, 31, 2, 1]] * 3
  decoder = decode.Decoder(model, 64, 10)
  run = lambda seed, batch: decoder.translate_nbest(  # noqa: E731
      sources, alpha=0.6, batch_size=batch, sampling=decode.Sampling(seed=seed, samples=3))
  first = run(7, 100)
  ids = lambda nbests: [[draw for draw, _ in draws] for draws in nbests]  # noqa: E731
  for other in (run(7, 1), run(7, 5)):  # whatever the batches (the scores within rounding)
    assert ids(other) == ids(first)
    np.testing.assert_allclose([[s for _, s in d] for d in other],
                               [[s for _, s in d] for d in first], rtol=1e-5)
  assert ids(first) != ids(run(8, 100))
  assert first[0] != first[4]  # the same sentence twice: other draws
  assert all(len(draws) == 3 and draws == sorted(draws, key=lambda d: -d[1]) for draws in first)


@pytest.mark.parametrize("spec, message", [
    ("sampling_method=topk", "sampling_method=topk: choose argmax"),
    ("sampling_temp=0.5", "sampling_temp is read only with sampling_method=random"),
    ("sampling_method=random,beam_size=4", "draws one token at a time (beam_size=1"),
    ("sampling_method=random,sampling_keep_top_k=0", "sampling_keep_top_k must be -1"),
    ("sampling_method=random,sampling_keep_top_p=0", "sampling_keep_top_p must be in (0, 1]"),
    ("sampling_method=random,sampling_temp=-1", "sampling_temp must be at least 0"),
    ("sampling_method=random,samples_per_input=3", "set return_beams=true"),
])
def test_sampling_settings_that_mean_nothing_are_refused(spec, message):
  with pytest.raises(UsageError, match=message.replace("(", r"\(").replace(")", r"\)")
                     .replace("[", r"\[")):
    translator.decode_options(spec)
  options, _ = translator.decode_options(
      "sampling_method=random,sampling_keep_top_k=5,samples_per_input=2,return_beams=true")
  assert options.sampling() == decode.Sampling(1.0, 5, 1.0, 1, 2) and options.hypotheses == 2


def test_the_decoder_samples_the_same_file_twice_and_several_draws_a_line(tiny_run, tmp_path):
  source = tmp_path / "in.en"
  source.write_text("a man rides a bike .\ntwo dogs play in the snow .\n\na woman sings .\n")
  common = ["t2t-lite-decoder", f"--output_dir={tiny_run['output_dir']}",
            f"--decode_from_file={source}"]
  outputs = {}
  for name, spec in (("a", "sampling_seed=5"), ("b", "sampling_seed=5"), ("c", "sampling_seed=6"),
                     ("n", "sampling_seed=5,samples_per_input=3,return_beams=true")):
    out = tmp_path / f"{name}.de"
    cli(*common, f"--decode_hparams=sampling_method=random,{spec}",
        f"--decode_to_file={out}", check=True)
    outputs[name] = out.read_text().split("\n")
  assert outputs["a"] == outputs["b"] != outputs["c"]
  assert outputs["a"][2] == ""  # an empty line stays empty
  fields = [line.split("\t") for line in outputs["n"][:4]]
  assert [len(f) for f in fields] == [6, 6, 6, 6]
  for line in (fields[0], fields[1], fields[3]):
    scores = [float(s) for s in line[1::2]]
    assert scores == sorted(scores, reverse=True)
