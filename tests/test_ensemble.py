"""Decoding an ensemble: the mean of the members' log-probabilities at each step, in greedy and
beam search, sampling and forced decoding."""

import json
import os
import shutil

import numpy as np
import pytest
import tensorflow as tf

from conftest import cli, tiny_hparams
from t2t_lite.core import registry
from t2t_lite.inference import decode

VOCAB = 40
SOURCES = [[5, 9, 12, 7, 1], [8, 3, 1], [20, 21, 22, 23, 24, 25, 1], [6, 1]]


def _model(seed):
  model = registry.model("transformer")(tiny_hparams(), VOCAB, seed=seed)
  model.embedding[0].assign(tf.zeros([model.hidden]))
  return model


@pytest.fixture(scope="module")
def models():
  return _model(5), _model(6)


@pytest.mark.parametrize("beam, sampling", [(1, None), (3, None),
                                            (1, decode.Sampling(top_k=5, seed=2, samples=2))])
def test_a_model_ensembled_with_itself_is_the_model(models, beam, sampling):
  one = decode.Decoder(models[0], 64, 8).translate_nbest(SOURCES, beam, 0.6, sampling=sampling)
  two = decode.Decoder(decode.Ensemble([models[0], models[0]]), 64, 8).translate_nbest(
      SOURCES, beam, 0.6, sampling=sampling)
  assert [[ids for ids, _ in n] for n in one] == [[ids for ids, _ in n] for n in two]
  np.testing.assert_allclose([[s for _, s in n] for n in one], [[s for _, s in n] for n in two],
                             rtol=1e-5)


def _searched_log_prob(model, source, output):
  """log p(output | source) as the search sees it: padding is never a candidate, so each
  step's distribution is over the other tokens."""
  logits = model(tf.constant([source]), tf.constant([output]))[0]
  log_probs = tf.nn.log_softmax(decode.mask_padding(tf.cast(logits, tf.float32))).numpy()
  return float(sum(log_probs[t, token] for t, token in enumerate(output)))


def test_scores_are_the_mean_of_the_members_log_probabilities(models):
  """Forced decoding of two models gives the mean of each one's log p(target | source); the
  score of the ensemble's own output (alpha 0: no length penalty) is the mean of the
  members' log-probabilities of that output."""
  ensemble = decode.Decoder(decode.Ensemble(models), 64, 8)
  members = [decode.Decoder(model, 64, 8) for model in models]
  targets = [[7, 7, 3, 1], [9, 1], [4, 5, 6, 7, 8, 1], [11, 2, 1]]
  mean = np.mean([member.score(SOURCES, targets) for member in members], axis=0)
  np.testing.assert_allclose(ensemble.score(SOURCES, targets), mean, rtol=1e-5)
  cap = max(map(len, SOURCES)) + 8  # the search's output cap: an output this long has no EOS
  for beam in (1, 4):
    best = [nbest[0] for nbest in ensemble.translate_nbest(SOURCES, beam, 0.0)]
    expected = [np.mean([_searched_log_prob(model, source, ids + [1] * (len(ids) < cap))
                         for model in models]) for source, (ids, _) in zip(SOURCES, best)]
    np.testing.assert_allclose([score for _, score in best], expected, rtol=1e-4)
  # and the ensemble is not either member: its best output differs from one of theirs
  alone = [member.translate_ids(SOURCES, 4, 0.0) for member in members]
  assert alone[0] != alone[1]


def test_the_decoder_takes_an_ensemble_and_refuses_another_vocabulary(tiny_run, sampled_data,
                                                                     tmp_path):
  source = tmp_path / "in.en"
  source.write_text("a man rides a bike .\ntwo dogs play in the snow .\n")
  copy = str(tmp_path / "copy")
  shutil.copytree(tiny_run["output_dir"], copy)
  common = ["t2t-lite-decoder", f"--output_dir={tiny_run['output_dir']}",
            f"--decode_from_file={source}"]
  alone, both = tmp_path / "alone.de", tmp_path / "both.de"
  cli(*common, f"--decode_to_file={alone}", check=True)
  result = cli(*common, f"--decode_to_file={both}", f"--ensemble={copy}", check=True)
  assert "an ensemble of 2 models" in result.stderr
  assert both.read_text() == alone.read_text()  # the same model twice

  # the copy's record says it trained on other data, with another vocabulary
  meta_path = os.path.join(copy, "hparams.json")
  with open(meta_path) as f:
    meta = json.load(f)
  meta["data_dir"] = sampled_data
  meta["data"]["vocab_sha256"] = registry.problem("translate_ende_multi30k").snapshot(
      sampled_data, vocab_only=True).vocab_sha256()
  with open(meta_path, "w") as f:
    json.dump(meta, f)
  refused = cli(*common, f"--decode_to_file={tmp_path / 'x.de'}", f"--ensemble={copy}")
  assert refused.returncode == 2, refused.stderr[-2000:]
  assert refused.stderr.strip().splitlines()[-1].startswith(
      f"t2t-lite-decoder: error: --ensemble={copy} has another vocabulary than the first "
      "model's (sha256 "), refused.stderr[-2000:]
  assert "Traceback" not in refused.stderr
