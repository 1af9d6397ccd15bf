"""The planned training stream: batches from lengths, read by index, a process its own share."""

import threading
import time

import numpy as np
import pytest
import tensorflow as tf

from conftest import tiny_hparams
from t2t_lite.data import eval_input
from t2t_lite.core import registry
from t2t_lite.data import store as store_lib
from t2t_lite.data.stream import Batching, SplitPlan, TrainingStream, cut_by_buckets, cut_by_tokens

PROBLEM = registry.problem("translate_ende_multi30k")
SEED, SPLIT, EPOCH = 12345, 1, 3  # of the plans whose epochs are counted


@pytest.fixture(scope="module")
def train_store(multi30k_data):
  return PROBLEM.training_store(multi30k_data, "train")


def _epoch(plan, epoch):
  return [plan.batch(epoch * plan.batches_per_epoch + b) for b in range(plan.batches_per_epoch)]


def test_the_store_holds_the_records_ids(multi30k_data, train_store):
  files = PROBLEM.data_files(multi30k_data, "train")
  records = list(tf.data.TFRecordDataset(files).map(eval_input.parse_example).take(300))
  assert len(train_store) == 29000 and train_store.ids["inputs"].dtype == np.uint16
  for index in (0, 1, 17, 299):
    batch = train_store.batch(np.array([index, 0]))
    for side in ("inputs", "targets"):
      ids = records[index][side].numpy()
      assert batch[side][0, :len(ids)].tolist() == ids.tolist()
      assert not batch[side][0, len(ids):].any()  # padding
      assert train_store.lengths[index, 0 if side == "inputs" else 1] == len(ids)


def test_cut_by_tokens_fills_each_batch_to_the_limit():
  longest = np.array([2, 2, 3, 3, 3, 5, 9, 10])
  starts = cut_by_tokens(longest, 10)
  # [2, 2, 3] = 9 tokens, [3, 3] = 6 ([3, 3, 5] = 15), [5], [9], [10]
  assert starts.tolist() == [0, 3, 5, 6, 7, 8]
  assert cut_by_tokens(np.array([10, 10]), 10).tolist() == [0, 1, 2]


def test_each_bucket_is_cut_into_batches_of_its_row_count():
  """Boundaries 8, 9, 10, 11, 12, 13 (max_length 12): lengths below 8 share a bucket of
  64 // 7 = 9 rows, padded to 7; 9 and 10 have buckets of their own (7 and 6 rows)."""
  batching = Batching(batch_size=64, max_length=12)
  longest = np.array([2] * 10 + [3] * 2 + [9] * 7 + [10] * 1)
  starts, widths = cut_by_buckets(longest, batching)
  assert starts.tolist() == [0, 9, 12, 19, 20]
  assert widths.tolist() == [7, 7, 9, 10]


def test_an_epoch_reads_every_kept_example_once_in_batches_that_fit(train_store):
  hparams = registry.hparams("transformer_multi30k_cpu")
  plan = SplitPlan(train_store.lengths, Batching.of(hparams), seed=1, split_number=0)
  longest = train_store.lengths.max(axis=1)
  kept = np.flatnonzero(longest <= hparams.max_length)
  for epoch in (0, 1):
    batches = _epoch(plan, epoch)
    rows = np.concatenate([rows for rows, _ in batches])
    assert sorted(rows.tolist()) == kept.tolist()
    assert all(len(rows) * longest[rows].max() <= hparams.batch_size for rows, _ in batches)
  # each epoch in its own order, with the same number of batches
  first, second = _epoch(plan, 0), _epoch(plan, 1)
  assert [r.tolist() for r, _ in first[:5]] != [r.tolist() for r, _ in second[:5]]
  tight = SplitPlan(train_store.lengths, Batching(hparams.batch_size, 20), 1, 0)
  assert len(tight.kept) == int((longest <= 20).sum()) < len(kept)


def _padding(batches):
  padding = slots = 0
  for batch in batches:
    for side in ("inputs", "targets"):
      padding += int((batch[side] == 0).sum())
      slots += batch[side].size
  return padding / slots


def test_planned_batches_pad_less_than_the_bucketed_pipeline(multi30k_data, train_store):
  """150 batches of transformer_multi30k_cpu: cut by tokens from the sorted examples, they
  pad less than the tf.data buckets on a shuffled stream did, and hold as many target tokens
  (within 5%), so tokens per update stay what recipes were tuned with. (The stream's shuffle
  buffer holds 5,000 examples here, not the 20,000 of the trainer then: the 150 batches read
  about 4,500.)"""
  hparams = registry.hparams("transformer_multi30k_cpu")
  plan = SplitPlan(train_store.lengths, Batching.of(hparams), seed=1, split_number=0)
  planned = _padding(train_store.batch(*plan.batch(b)) for b in range(150))
  files = PROBLEM.data_files(multi30k_data, "train")
  bucketed = eval_input.batched(  # endless, as the trainer read it: no part-filled batches
      eval_input.examples(files, hparams.max_length).shuffle(5000, seed=1).repeat(),
      hparams.batch_size, hparams.max_length)
  before = [{k: v.numpy() for k, v in b.items()} for b in bucketed.take(150)]
  assert planned < _padding(before) < 0.15, (planned, _padding(before))
  tokens = np.mean([train_store.lengths[plan.batch(b)[0], 1].sum() for b in range(150)])
  tokens_before = np.mean([np.count_nonzero(b["targets"]) for b in before])
  assert abs(tokens / tokens_before - 1) < 0.05, (tokens, tokens_before)


def test_the_order_follows_the_seed_and_the_split(train_store):
  batching = Batching.of(tiny_hparams())
  first = lambda seed, split=0: [  # noqa: E731
      SplitPlan(train_store.lengths, batching, seed, split).batch(b)[0].tolist() for b in range(3)]
  assert first(5) == first(5)
  assert first(5) != first(6) and first(5) != first(5, split=1)


def test_batches_padded_to_their_bucket_boundary_hold_each_example_once(train_store):
  """--xla_compile's plan: tensor2tensor's buckets, a fixed row count each (one shape per
  bucket, but for its last batch of an epoch), padded to the boundary; an epoch reads the
  examples the plain plan reads."""
  hparams = tiny_hparams(batch_size=256, max_length=64)
  plain = SplitPlan(train_store.lengths, Batching.of(hparams), 3, 0)
  padded = SplitPlan(train_store.lengths, Batching.of(hparams, True), 3, 0)
  boundaries = eval_input.bucket_boundaries(64)
  rows_of = dict(zip((b - 1 for b in boundaries), eval_input.bucket_batch_sizes(boundaries, 256)))
  rows_seen = {}
  for rows, width in _epoch(padded, 0):
    batch = train_store.batch(rows, width)
    assert batch["inputs"].shape == batch["targets"].shape == (len(rows), width)
    assert width in rows_of and len(rows) <= rows_of[width]
    assert train_store.lengths[rows].max() <= width
    rows_seen.setdefault(width, []).append(len(rows))
  # one shape per bucket, but for each bucket's last batch
  assert len(rows_seen) > 5
  for width, counts in rows_seen.items():
    assert counts.count(rows_of[width]) >= len(counts) - 1, (width, counts)
  assert sorted(np.concatenate([r for r, _ in _epoch(padded, 0)]).tolist()) == \
      sorted(np.concatenate([r for r, _ in _epoch(plain, 0)]).tolist())
  assert {width for _, width in _epoch(plain, 0)} == {0}  # each side to its own longest


def test_each_replica_reads_only_its_own_batches(sampled_data):
  """Micro-step m of replica r is batch m x replicas + r of one stream, wherever the replica
  runs; after `sampled_from` the batches come from the sampled split, counted from there."""
  stores = [PROBLEM.training_store(sampled_data, split) for split in ("train", "train_sampled")]
  batching = Batching.of(tiny_hparams())
  one = TrainingStream(stores, batching, 7, replicas=1, local_replicas=[0])
  halves = [TrainingStream(stores, batching, 7, replicas=2, local_replicas=[r]) for r in (0, 1)]
  sampled_from = 6
  for micro_step in range(5):
    for replica, half in enumerate(halves):
      mine = half.micro_batches(micro_step, sampled_from)
      assert len(mine) == 1
      expected = one.micro_batches(2 * micro_step + replica, sampled_from)[0]
      for side in ("inputs", "targets"):
        np.testing.assert_array_equal(mine[0][side], expected[side])
  for half in halves:
    assert half.batches_read == 5
  assert halves[0].examples_read + halves[1].examples_read == one.examples_read
  # batch 6 is the sampled split's first batch; batch 5 the one best's sixth
  plan_sampled = SplitPlan(stores[1].lengths, batching, 7, 1)
  plan_best = SplitPlan(stores[0].lengths, batching, 7, 0)
  first_sampled = stores[1].batch(*plan_sampled.batch(0))
  np.testing.assert_array_equal(one.micro_batches(6, sampled_from)[0]["targets"],
                                first_sampled["targets"])
  np.testing.assert_array_equal(one.micro_batches(5, sampled_from)[0]["targets"],
                                stores[0].batch(*plan_best.batch(5))["targets"])
  # undecided (-1): the one best throughout
  np.testing.assert_array_equal(one.micro_batches(6, -1)[0]["targets"],
                                stores[0].batch(*plan_best.batch(6))["targets"])
  for stream in (one, *halves):
    stream.close()


def test_the_store_is_written_from_the_shards_of_any_vocabulary_size(tmp_path):
  """uint16 ids up to 65,536 pieces, int32 above; examples of no ids at all."""
  import tensorflow as tf
  path = str(tmp_path / "part.tfrecord")
  pairs = [([5, 70000, 1], [1]), ([], [3, 1]), ([2, 1], [4, 4, 4, 1])]
  with tf.io.TFRecordWriter(path) as writer:
    for source, target in pairs:
      feature = {name: tf.train.Feature(int64_list=tf.train.Int64List(value=ids))
                 for name, ids in (("inputs", source), ("targets", target))}
      writer.write(tf.train.Example(features=tf.train.Features(feature=feature))
                   .SerializeToString())
  info = store_lib.write([path], str(tmp_path), "p-train", vocab_size=80000)
  assert info["examples"] == 3 and info["dtype"] == "<i4"
  store = store_lib.ExampleStore(str(tmp_path), info)
  batch = store.batch(np.array([2, 0, 1]))
  assert batch["inputs"].tolist() == [[2, 1, 0], [5, 70000, 1], [0, 0, 0]]
  assert batch["targets"].tolist() == [[4, 4, 4, 1], [1, 0, 0, 0], [3, 1, 0, 0]]
  assert store_lib.id_dtype(65536) == np.uint16 and store_lib.id_dtype(65537) == np.int32


def _counting_plans(monkeypatch, seed, split_number, delay):
  """The epochs planned from now on by plans of `seed` and `split_number`, in order (each
  plan of an epoch draws from a generator seeded by (seed, split, epoch)); each one takes
  `delay` seconds longer, as a large corpus's would."""
  planned, real = [], np.random.default_rng

  def counting(seed_sequence=None, *args, **kwargs):
    if isinstance(seed_sequence, list) and seed_sequence[:2] == [seed, split_number]:
      planned.append(seed_sequence[2])
      time.sleep(delay)
    return real(seed_sequence, *args, **kwargs)
  monkeypatch.setattr(np.random, "default_rng", counting)
  return planned


def _straddled():
  """(a plan of many examples, the last batch of epoch EPOCH and the first of the next, what
  plans of their own compute for the two epochs: (examples, batch order) by epoch)."""
  lengths = np.random.default_rng(0).integers(1, 60, size=(20000, 2))
  batching = Batching(batch_size=400, max_length=50)
  expected = {e: SplitPlan(lengths, batching, SEED, SPLIT)._order(e)
              for e in (EPOCH, EPOCH + 1)}  # each on a plan of its own: nothing cached
  plan = SplitPlan(lengths, batching, SEED, SPLIT)
  count = plan.batches_per_epoch
  return plan, [EPOCH * count + count - 1, (EPOCH + 1) * count], expected


def _assert_planned_as(plan, number, expected):
  examples, batch_order = expected[number // plan.batches_per_epoch]
  index = int(batch_order[number % plan.batches_per_epoch])
  np.testing.assert_array_equal(plan.batch(number)[0],
                                examples[plan.starts[index]:plan.starts[index + 1]])


def test_asking_for_two_epochs_in_turn_plans_each_once(monkeypatch):
  """A micro-step whose replicas straddle the end of an epoch asks for the batches of epochs
  e and e + 1 in turn: each is planned once, and holds what a plan of its own computes."""
  plan, straddling, expected = _straddled()
  planned = _counting_plans(monkeypatch, SEED, SPLIT, delay=0.0)
  for _ in range(4):
    for number in straddling:
      _assert_planned_as(plan, number, expected)
  assert planned == [EPOCH, EPOCH + 1]
  held = sum(a.nbytes for e in expected for a in expected[e])
  fixed = sum(a.nbytes for a in (plan.kept, plan._key, plan.starts, plan.widths))
  assert plan.nbytes == fixed + held  # the two epochs held


def test_two_threads_asking_for_two_epochs_at_once_plan_each_once(monkeypatch):
  """The training thread and the reader thread both ask for epochs e and e + 1, in turn and
  at once, while planning an epoch takes a while: each is planned once, by one of them."""
  plan, straddling, expected = _straddled()
  planned = _counting_plans(monkeypatch, SEED, SPLIT, delay=0.05)
  start, found, failed = threading.Barrier(2), [], []

  def ask(numbers):
    try:
      start.wait()
      for _ in range(6):
        for number in numbers:
          found.append((number // plan.batches_per_epoch, plan._order(
              number // plan.batches_per_epoch)))
    except BaseException as err:  # noqa: BLE001  (reported below)
      failed.append(err)
  threads = [threading.Thread(target=ask, args=(order,))
             for order in (straddling, straddling[::-1])]  # (both epochs at once)
  for thread in threads:
    thread.start()
  for thread in threads:
    thread.join()
  assert not failed, failed
  assert sorted(planned) == [EPOCH, EPOCH + 1], planned
  assert len(found) == 24
  for epoch, order in found:
    for got, want in zip(order, expected[epoch]):
      np.testing.assert_array_equal(got, want)
  for number in straddling:
    _assert_planned_as(plan, number, expected)
