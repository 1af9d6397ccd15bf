"""Tagged back-translation: datagen marks a corpus as back-translated, its sources begin with
the reserved piece <BT>, the run records it, and decoding never writes the piece."""

import json

import numpy as np
import pytest
import tensorflow as tf

from conftest import cli, multi30k_subset, tiny_hparams
from t2t_lite.core import registry
from t2t_lite.data.vocab import BT_TAG
from t2t_lite.inference import decode

PROBLEM = "translate_ende_multi30k"


@pytest.fixture(scope="module")
def tagged_data(tmp_path_factory):
  """Multi30k's first 1,000 training pairs ("flickr") and pairs 20,000-20,499 as a
  back-translated corpus ("bt"); dev and test 100 lines."""
  root = tmp_path_factory.mktemp("tagged")
  raw, bt = root / "raw", root / "bt"
  multi30k_subset(raw, 1000, 100, bt, (20000, 20500))
  data_dir = str(root / "data")
  result = cli("t2t-lite-datagen", f"--problem={PROBLEM}", "--vocab_size=600",
               "--corpus=flickr:1", f"--corpus=bt:1:{bt}", "--back_translated=bt",
               f"--data_dir={data_dir}", f"--tmp_dir={raw}", check=True)
  return {"data_dir": data_dir, "stdout": result.stdout, "raw": str(raw), "bt": str(bt)}


def test_a_back_translated_corpus_has_its_sources_tagged_and_the_run_records_it(tagged_data):
  data_dir = tagged_data["data_dir"]
  assert "bt 1 (50.0% of the batches; 500 pairs, back-translated: sources tagged <BT>)" in \
      tagged_data["stdout"]
  problem = registry.problem(PROBLEM)
  snapshot = problem.snapshot(data_dir)
  vocab = snapshot.vocab()
  (tag,) = vocab.reserved_ids()
  assert vocab.encode(BT_TAG)[-2:] == [tag, 1] and vocab.decode([tag]) == BT_TAG  # one piece
  assert [c.get("back_translated", False) for c in snapshot.corpora] == [False, True]
  for split, tagged in (("train.bt", True), ("train", False)):
    store = problem.training_store(data_dir, split)
    sources = store.batch(np.arange(len(store.lengths)))["inputs"]
    assert (sources[:, 0] == tag).all() == tagged and (sources[:, 1:] != tag).all()
    if not tagged:
      assert not (sources == tag).any()
  from t2t_lite.runs import rundir
  assert rundir.data_record(snapshot)["corpora"] == [
      {"name": "flickr", "weight": 1.0}, {"name": "bt", "weight": 1.0, "back_translated": True}]
  with open(problem.manifest_file(data_dir)) as f:
    assert json.load(f)["settings"]["corpora"][1] == {"name": "bt", "weight": 1.0,
                                                     "back_translated": True}


def test_a_back_translated_name_that_is_no_corpus_is_refused(tagged_data, tmp_path):
  result = cli("t2t-lite-datagen", f"--problem={PROBLEM}", "--corpus=flickr:1",
               f"--corpus=bt:1:{tagged_data['bt']}", "--back_translated=btt",
               f"--data_dir={tmp_path / 'data'}", f"--tmp_dir={tagged_data['raw']}")
  assert result.returncode == 2
  assert result.stderr.strip().splitlines()[-1] == (
      "t2t-lite-datagen: error: --back_translated=btt names no corpus of --corpus (flickr, "
      "bt); name one of them, each given with --corpus=NAME:WEIGHT[:DIR]")


def test_decoding_never_writes_a_reserved_piece():
  model = registry.model("transformer")(tiny_hparams(), 40, seed=5)
  model.embedding[0].assign(tf.zeros([model.hidden]))
  sources = [[5, 9, 12, 7, 1], [8, 3, 4, 9, 1], [20, 21, 22, 23, 1]]
  plain = decode.Decoder(model, 64, 10)
  favourite = np.bincount(sum(plain.translate_ids(sources, 1, 0.6), [])).argmax()
  never = decode.Decoder(model, 64, 10, never=(int(favourite),))
  for beam, sampling in ((1, None), (4, None), (1, decode.Sampling(seed=3, samples=4))):
    for nbest in never.translate_nbest(sources, beam, 0.6, sampling=sampling):
      assert all(favourite not in ids for ids, _ in nbest)
  targets = [[favourite, 3, 1]] * 3  # forced decoding scores the model as it is
  np.testing.assert_allclose(never.score(sources, targets), plain.score(sources, targets))
