"""Several training corpora sampled by weight: datagen, the draw, the stream, resume."""

import os

import numpy as np
import pytest

from conftest import MIXED_DATAGEN, cli, tiny_hparams
from t2t_lite.data.curriculum import Curriculum, batch_corpora
from t2t_lite.core import registry
from t2t_lite.core.hparams_check import parse_corpus_weights
from t2t_lite.runs import rundir
from t2t_lite.core.errors import UsageError
from t2t_lite.data.mixing import corpus_splits
from t2t_lite.data.corpora import parse as parse_corpora
from t2t_lite.data.stream import Batching, SplitPlan
from t2t_lite.data.mixing import MixedStream

PROBLEM = registry.problem("translate_ende_multi30k")


def _stores(data_dir, kinds=("train",)):
  snapshot = PROBLEM.snapshot(data_dir)
  return [[snapshot.store(split) for split in corpus_splits(corpus, list(kinds))]
          for corpus in snapshot.corpora]


# --- datagen ----------------------------------------------------------------------------------
def test_datagen_writes_each_corpus_with_its_weight_into_one_data_directory(mixed_data):
  manifest = PROBLEM.manifest(mixed_data)
  assert manifest["corpora"] == [
      {"name": "flickr", "weight": 3.0, "split": "train"},
      {"name": "other", "weight": 1.0, "split": "train.other"}]
  splits = manifest["splits"]
  assert sorted(splits) == ["dev", "test", "train", "train.other", "train_sampled",
                            "train_sampled.other"]
  assert (splits["train"]["kept"], splits["train.other"]["kept"]) == (3000, 1000)
  assert len(PROBLEM.training_store(mixed_data, "train_sampled.other")) == 2000  # 2 copies
  assert "other/train.de" in manifest["inputs"] and "train.de.gz" in manifest["inputs"]
  # one vocabulary of both: the other corpus's pairs decode to its text
  vocab = PROBLEM.get_vocab(mixed_data)
  other = PROBLEM.training_store(mixed_data, "train.other")
  with open(os.path.join(os.path.dirname(mixed_data), "other", "train.de"),
            encoding="utf-8") as f:
    lines = set(f.read().splitlines())
  for index in (0, 1, 999):
    ids = other.batch(np.array([index]))["targets"][0].tolist()
    assert vocab.decode([i for i in ids if i > 1]).strip() in lines


@pytest.mark.parametrize("entries, message", [
    (["a:1"], "one corpus is the problem's own training split; add another"),
    (["a"], "--corpus=a: write NAME:WEIGHT[:DIR]"),
    (["A:1:/tmp"], "--corpus=A:1:/tmp: write NAME:WEIGHT[:DIR]"),
    (["a:0:/tmp"], "a weight above 0"),
    (["a:inf:/tmp"], "a weight above 0"),
    (["a:1:/tmp", "a:2"], "the name a is given twice"),
    (["a:1", "b:2"], "a and b both name the problem's own training split"),
    (["main:1:/tmp"], "main names the problem's own training split"),
    (["a:1:/no/such/dir"], "/no/such/dir is not a folder"),
])
def test_bad_corpus_entries_are_refused_in_one_line(entries, message):
  with pytest.raises(UsageError) as err:
    parse_corpora(entries)
  assert message in str(err.value), str(err.value)


def test_corpora_order_puts_the_problem_s_own_first(tmp_path):
  got = parse_corpora([f"x:2:{tmp_path}", "own:0.5"])
  assert [(c["name"], c["weight"], bool(c["dir"])) for c in got] == [
      ("own", 0.5, False), ("x", 2.0, True)]
  assert [c["name"] for c in parse_corpora([f"x:2:{tmp_path}"])] == ["main", "x"]


def test_datagen_again_is_up_to_date_and_other_weights_are_not_replaced_unasked(mixed_data):
  raw = os.path.join(os.path.dirname(mixed_data), "raw")
  other = os.path.join(os.path.dirname(mixed_data), "other")
  same = cli("t2t-lite-datagen", *MIXED_DATAGEN, f"--corpus=other:1:{other}",
             f"--data_dir={mixed_data}", f"--tmp_dir={raw}")
  assert same.returncode == 0 and "up to date" in same.stdout, same.stderr[-2000:]
  changed = cli("t2t-lite-datagen", *MIXED_DATAGEN, f"--corpus=other:2:{other}",
                f"--data_dir={mixed_data}", f"--tmp_dir={raw}")
  assert changed.returncode == 2
  assert "made from other inputs or settings (corpora" in changed.stderr.strip().splitlines()[-1]


# --- the curriculum and the draw ------------------------------------------------------------
@pytest.mark.parametrize("text, message", [
    ("a", "'a' is not name:weight"),
    ("a:x", "'a:x' is not name:weight"),
    ("a:-1", "'a:-1' is not name:weight"),
    ("a:inf", "'a:inf' is not name:weight"),
    ("a:1/a:2", "'a:2' is not name:weight"),
    ("a:0/b:0", "gives every corpus weight 0"),
    ("a:1;b:1", "'b:1' needs '@U'"),
    ("a:1@5", "the first phase must hold from the start"),
    ("a:1;b:1@5;a:1@5", "the updates must increase (5 after 5)"),
])
def test_bad_curricula_are_refused(text, message):
  with pytest.raises(UsageError) as err:
    parse_corpus_weights(text)
  assert message in str(err.value)


def test_a_curriculum_holds_its_weights_from_the_update_after_each_phase_start():
  given = [{"name": "general", "weight": 3.0}, {"name": "water", "weight": 1.0}]
  own = Curriculum.of("", given)
  assert own.phases == ((0, (0.75, 0.25)),)
  plan = Curriculum.of("general:1/water:1;water:1@2000", given)
  assert plan.weights_at(1) == plan.weights_at(2000) == (0.5, 0.5)
  assert plan.weights_at(2001) == (0.0, 1.0)
  assert plan.differ(1999, 2001) and not plan.differ(1, 2000) and not plan.differ(2001, 9000)
  with pytest.raises(UsageError, match="the data has no corpus sea; its corpora are general, "
                     "water"):
    Curriculum.of("sea:1", given)


@pytest.mark.parametrize("weights", [(0.75, 0.25), (0.2, 0.3, 0.5), (0.0, 1.0, 0.0)])
def test_batch_corpora_follow_the_weights_over_many_batches(weights):
  """20,000 batches: every corpus's share within 4 standard deviations of its weight; the
  same draw again, and another seed draws otherwise."""
  numbers = np.arange(20000)
  chosen = batch_corpora(5, numbers, weights)
  shares = np.bincount(chosen, minlength=len(weights)) / len(numbers)
  for share, weight in zip(shares, weights):
    assert abs(share - weight) <= 4 * np.sqrt(weight * (1 - weight) / len(numbers)), shares
  np.testing.assert_array_equal(chosen, batch_corpora(5, numbers, weights))
  if 0 < min(weights):
    assert (chosen != batch_corpora(6, numbers, weights)).mean() > 0.3


# --- the stream -----------------------------------------------------------------------------
def test_the_mixed_stream_reads_each_corpus_in_its_planned_order_by_weight(mixed_data):
  """400 micro-steps: the batches' corpora follow the weights (3:1, then 0:1 after update
  300); each corpus's batches are its own plan's in turn; the tokens counted are the
  target tokens read."""
  stores = _stores(mixed_data)
  batching = Batching.of(tiny_hparams())
  curriculum = Curriculum.of("flickr:3/other:1;other:1@300",
                                     PROBLEM.snapshot(mixed_data).corpora)
  stream = MixedStream(stores, curriculum, batching, 7, replicas=1, local_replicas=[0])
  plans = [SplitPlan(s[0].lengths, batching, 7, 2 * index) for index, s in enumerate(stores)]
  seen, tokens = [0, 0], np.zeros(2, np.int64)
  for micro_step in range(400):
    update = micro_step + 1
    batch = stream.micro_batches(micro_step, -1, update)[0]
    corpus = int(batch_corpora(7, [micro_step], curriculum.weights_at(update))[0])
    expected = stores[corpus][0].batch(*plans[corpus].batch(seen[corpus]))
    np.testing.assert_array_equal(batch["targets"], expected["targets"])
    seen[corpus] += 1
    tokens[corpus] += int((batch["targets"] > 0).sum())
    assert update <= 300 or corpus == 1
  assert stream.taken[:, 0].tolist() == seen and stream.taken[:, 1].tolist() == [0, 0]
  np.testing.assert_array_equal(stream.tokens, tokens)
  share = seen[0] / (seen[0] + seen[1] - 100)  # of the first 300
  assert abs(share - 0.75) <= 4 * np.sqrt(0.75 * 0.25 / 300), seen
  stream.close()


def test_replicas_and_a_resumed_stream_read_what_one_unbroken_stream_reads(mixed_data):
  """Two replicas' halves interleave into the one-replica stream; a stream resumed from the
  position of another at micro-step 9 goes on with the same batches; after `sampled_from`
  every corpus reads its sampled segmentations, counted per corpus and segmentation."""
  stores = _stores(mixed_data, ("train", "train_sampled"))
  batching = Batching.of(tiny_hparams())
  curriculum = Curriculum.of("flickr:1/other:1;other:1@4",
                                     PROBLEM.snapshot(mixed_data).corpora)
  one = MixedStream(stores, curriculum, batching, 3, replicas=1, local_replicas=[0])
  halves = [MixedStream(stores, curriculum, batching, 3, replicas=2, local_replicas=[r])
            for r in (0, 1)]
  sampled_from = 8  # batch 8 on: sampled
  for micro_step in range(5):  # 2 replicas x n=1: update m + 1 is batches 2m and 2m + 1
    update = micro_step + 1
    expected = [one.micro_batches(2 * micro_step + r, sampled_from, update)[0] for r in (0, 1)]
    for replica, half in enumerate(halves):
      got = half.micro_batches(micro_step, sampled_from, update)[0]
      np.testing.assert_array_equal(got["targets"], expected[replica]["targets"])
  assert int(one.taken[:, 1].sum()) == 2 and int(one.taken.sum()) == 10
  np.testing.assert_array_equal(halves[0].taken, one.taken)
  np.testing.assert_array_equal(halves[1].tokens, one.tokens)
  resumed = MixedStream(stores, curriculum, batching, 3, replicas=1, local_replicas=[0])
  resumed.resume(10, one.taken, one.tokens)
  for micro_step in range(10, 14):
    update = micro_step // 2 + 1
    np.testing.assert_array_equal(
        resumed.micro_batches(micro_step, sampled_from, update)[0]["targets"],
        one.micro_batches(micro_step, sampled_from, update)[0]["targets"])
  with pytest.raises(UsageError, match="the checkpoint's corpus positions count 14 batches, "
                     "its micro-step counter 12"):
    resumed.resume(12, one.taken, one.tokens)
  for stream in (one, resumed, *halves):
    stream.close()


# --- training (a run across a weight change, moved to two replicas: test_schedule.py) ------
def test_corpus_weights_are_refused_where_they_cannot_be_read(multi30k_data, mixed_data):
  from t2t_lite.data.mixing import open_stream
  batching = Batching.of(tiny_hparams())
  hparams = tiny_hparams(corpus_weights="flickr:1/other:1")
  with pytest.raises(UsageError, match="holds one training corpus; make data of several with "
                     "t2t-lite-datagen --corpus, or drop corpus_weights"):
    open_stream(PROBLEM.snapshot(multi30k_data), hparams, ["train"], batching, 1, 1, [0], None)
  hparams = tiny_hparams(corpus_weights="flickr:1/sea:2")
  with pytest.raises(UsageError, match="the data has no corpus sea; its corpora are flickr, "
                     "other"):
    open_stream(PROBLEM.snapshot(mixed_data), hparams, ["train"], batching, 1, 1, [0], None)


def test_a_run_resumes_only_on_its_own_corpora(mixed_data):
  snapshot = PROBLEM.snapshot(mixed_data)
  meta = {"data": dict(rundir.data_record(snapshot),
                       corpora=[{"name": "flickr", "weight": 1.0}])}
  with pytest.raises(UsageError, match="run was trained on the corpora flickr, but .* holds "
                     "the corpora flickr, other; resume it on the data it was trained on"):
    rundir.check_training_data(meta, snapshot, "run")
  assert rundir.data_record(snapshot)["corpora"] == [{"name": "flickr", "weight": 3.0},
                                                     {"name": "other", "weight": 1.0}]
  # the same corpora, other weights in the data: refused unless the run says which to take
  meta["data"]["corpora"] = [{"name": "flickr", "weight": 1.0}, {"name": "other", "weight": 1.0}]
  with pytest.raises(UsageError, match="trained with the corpus weights datagen recorded then, "
                     "flickr:1/other:1, but .* now records flickr:3/other:1; pass "
                     "--hparams=corpus_weights=flickr:1/other:1 --allow_hparams_change"):
    rundir.check_training_data(meta, snapshot, "run")
  rundir.check_training_data(meta, snapshot, "run", corpus_weights="flickr:1/other:1")
  rundir.check_training_data(meta, snapshot, "run", allow_change=True)
