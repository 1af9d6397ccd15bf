"""Subword sampling: the sampler draws from the distribution it claims, as sentencepiece's
does, reproducibly and in bounded memory."""

import collections
import functools
import math
import os
import random
import re

import numpy as np
import pytest

from conftest import multi30k_dir
from t2t_lite.data import sampling
from t2t_lite.data.text import read_lines


@pytest.fixture(scope="module")
def processor(multi30k_data):
  import sentencepiece as spm
  from t2t_lite.core import registry
  return spm.SentencePieceProcessor(
      model_file=registry.problem("translate_ende_multi30k").vocab_file(multi30k_data))


def _segmentations(word, pieces):
  """Every segmentation of `word` into `pieces` (a dict piece -> (id, score))."""
  if not word:
    return [()]
  found = []
  for end in range(1, len(word) + 1):
    if word[:end] in pieces:
      found += [(pieces[word[:end]][0],) + rest for rest in _segmentations(word[end:], pieces)]
  return found


def test_a_words_draws_follow_exp_alpha_times_its_log_probability(processor):
  """For one word, the frequencies of 20,000 draws match the exact distribution: every
  segmentation's probability is proportional to exp(alpha x the sum of its pieces' scores)."""
  sampler = sampling.SegmentationSampler(processor)
  pieces = {processor.id_to_piece(i): (i, processor.get_score(i))
            for i in range(processor.get_piece_size())
            if not (processor.is_control(i) or processor.is_unknown(i))}
  word, alpha = "\u2581Schwimmbecken", 0.3
  exact = {}
  for seg in _segmentations(word, pieces):
    exact[seg] = math.exp(alpha * sum(pieces[processor.id_to_piece(i)][1] for i in seg))
  total = sum(exact.values())
  assert len(exact) > 100
  rng = random.Random(3)
  draws = collections.Counter(
      tuple(ids) for ids in sampler.sample(["Schwimmbecken"] * 20000, alpha, rng))
  assert set(draws) <= set(exact)
  for seg, weight in sorted(exact.items(), key=lambda kv: -kv[1])[:5]:
    p = weight / total
    assert abs(draws[seg] / 20000 - p) < 4 * math.sqrt(p * (1 - p) / 20000) + 1e-3, (seg, p)


def test_draws_decode_to_the_text_and_match_sentencepiece_in_length_and_variety(processor):
  """On 10,000 Multi30k sentences of each language at alpha 0.3, our draws decode to what the
  one best decodes to, and their mean length and the share of sentences segmented other than
  the one best are within 3% of sentencepiece's own sampler's (which is not seeded: the
  share's standard error is ~0.9% of it; alpha 0.2 or 0.4 moves it by over 15%)."""
  sampler = sampling.SegmentationSampler(processor)
  for lang in ("en", "de"):
    texts = read_lines(os.path.join(multi30k_dir(), f"train.{lang}.gz"))[:10000]
    best = processor.encode(texts)
    ours = sampler.sample(texts, 0.3, random.Random(1))
    theirs = processor.encode(texts, enable_sampling=True, alpha=0.3, nbest_size=-1)
    assert processor.decode(ours) == processor.decode(best)
    for a, b in ((np.mean([len(x) for x in ours]), np.mean([len(x) for x in theirs])),
                 (np.mean([x != y for x, y in zip(ours, best)]),
                  np.mean([x != y for x, y in zip(theirs, best)]))):
      assert abs(a / b - 1) < 0.03, (lang, a, b)
    assert np.mean([len(x) for x in ours]) > 1.05 * np.mean([len(x) for x in best])


def test_the_same_seed_draws_the_same_and_the_cache_stays_bounded(processor, monkeypatch):
  monkeypatch.setattr(sampling, "CACHE_WORDS", 50)
  texts = read_lines(os.path.join(multi30k_dir(), "train.de.gz"))[:500]
  first = sampling.SegmentationSampler(processor)
  draws = first.sample(texts, 0.3, random.Random(5))
  assert len(first._words) <= 50  # noqa: SLF001 (the cache is what is bounded)
  again = sampling.SegmentationSampler(processor).sample(texts, 0.3, random.Random(5))
  other = sampling.SegmentationSampler(processor).sample(texts, 0.3, random.Random(6))
  assert draws == again and draws != other


def test_a_word_no_piece_covers_keeps_its_one_best(processor):
  sampler = sampling.SegmentationSampler(processor)
  text = "Ein Hund \u4e2d\u6587 läuft."  # characters Multi30k's vocabulary lacks
  best = processor.encode(text)
  assert processor.unk_id() in best
  for seed in range(5):
    (ids,) = sampler.sample([text], 0.3, random.Random(seed))
    assert processor.unk_id() in ids and processor.decode(ids) == processor.decode(best)


# --- the trainer: the one best, then the sampled segmentations -----------------------------

@functools.lru_cache(maxsize=4)
def _records(data_dir, split):
  """The (inputs, targets) id tuples of `split`'s shards."""
  import tensorflow as tf
  from t2t_lite.data import eval_input
  from t2t_lite.core import registry
  files = registry.problem("translate_ende_multi30k").data_files(data_dir, split)
  return frozenset((tuple(ex["inputs"].numpy()), tuple(ex["targets"].numpy()))
                   for ex in tf.data.TFRecordDataset(files).map(eval_input.parse_example))


def _trainer(data_dir, output_dir, start, train_steps=5, minutes=0.0, **overrides):
  from conftest import tiny_hparams
  from t2t_lite.core import registry
  from t2t_lite.training import steps
  from t2t_lite.training.options import Checkpointing, Evaluation, Stopping
  from t2t_lite.training.options import RunOptions
  from t2t_lite.training.loop import Trainer
  overrides = {"optimizer_multistep_accumulate_steps": 2, **overrides}
  hparams = tiny_hparams(subword_sampling_start=start, **overrides)
  options = RunOptions(output_dir=str(output_dir), data_dir=data_dir, seed=11,
                       evaluation=Evaluation(frequency=0), log_every=5 if minutes else 0,
                       checkpointing=Checkpointing(save_steps=0),
                       stopping=Stopping(train_minutes=minutes))
  return Trainer(hparams, registry.problem("translate_ende_multi30k"),
                 steps.run_steps(hparams, 1, train_steps), options)


def _recording(trainer):
  """The rows of every micro-batch `trainer` reads, in a list it fills as it trains."""
  read, next_batch = [], trainer.next_batch

  def recording():
    batch = next_batch()
    read.append(_rows(batch))
    return batch

  trainer.next_batch = recording
  return read


def _rows(batch):
  return [(tuple(int(i) for i in source if i), tuple(int(i) for i in target if i))
          for source, target in zip(batch["inputs"].numpy(), batch["targets"].numpy())]


def test_training_reads_the_one_best_up_to_subword_sampling_start_then_the_sampled_copies(
    sampled_data, tmp_path):
  """subword_sampling_start=3 with 2 micro-steps an update: micro-steps 0-5 (updates 1-3)
  read the one best segmentation ("train"), micro-steps 6-9 the sampled copies
  ("train_sampled", of which under 3% are the one best of both sides); the plan says so.
  subword_sampling_start=0 reads the sampled copies from the first batch."""
  one_best, sampled = _records(sampled_data, "train"), _records(sampled_data, "train_sampled")
  assert len(one_best) == 3000 and len(sampled) > 5900 and len(one_best & sampled) < 180
  trainer = _trainer(sampled_data, tmp_path / "switch", start=3)
  assert trainer.run_steps.lines()[-1] == ("training segmentations: the one best in updates 1-3, "
                                      "sampled ones after")
  read = _recording(trainer)
  assert trainer.train()["stop_reason"] == "train_steps reached"
  assert len(read) == 10
  for micro_step, rows in enumerate(read):
    split = one_best if micro_step < 6 else sampled
    assert all(row in split for row in rows), micro_step
  assert sum(row in one_best for rows in read[6:] for row in rows) < 0.2 * sum(map(len, read[6:]))
  from_start = _trainer(sampled_data, tmp_path / "from_start", start=0)
  rows = _rows(from_start.next_batch()) + _rows(from_start.next_batch())
  assert all(row in sampled for row in rows)
  assert sum(row in one_best for row in rows) < 0.2 * len(rows)


def test_a_switch_needs_data_with_sampled_segmentations_and_their_one_best(
    multi30k_data, sampled_data, tmp_path, monkeypatch):
  """On data without sampled segmentations the rule has nothing to switch to: the run reads
  the one best throughout and says so. On sampled data made before the one best was kept
  beside them, a switch is a usage error saying what to do (before the model is built);
  subword_sampling_start=0 trains on its sampled records."""
  from absl import logging
  from t2t_lite.core.errors import UsageError
  plain = _trainer(multi30k_data, tmp_path / "plain", start=1000)
  assert plain.milestones.splits == ["train"] and len(plain.stream.stores) == 1
  said = []
  monkeypatch.setattr(logging, "info", lambda message, *args: said.append(message % args))
  plain.milestones.start(0)  # (what the loop logs at its start)
  assert said == [f"subword sampling: the one best segmentation throughout ({multi30k_data} "
                  "has no sampled segmentations)"]
  monkeypatch.undo()
  import json
  import shutil
  # The form of sampled data before: its "train" split holds the sampled copies.
  older = tmp_path / "older"
  shutil.copytree(sampled_data, older, ignore=shutil.ignore_patterns("raw"))
  path = older / "translate_ende_multi30k.manifest.json"
  manifest = json.loads(path.read_text())
  manifest["splits"]["train"] = manifest["splits"].pop("train_sampled")
  path.write_text(json.dumps(manifest))
  with pytest.raises(UsageError, match=r"holds only sampled segmentations \(made by an earlier "
                     r"t2t-lite-datagen\), and subword_sampling_start=3 with "
                     r"subword_sampling_min_updates=0 may want the one best; make it again "
                     r"with t2t-lite-datagen --overwrite"):
    _trainer(str(older), tmp_path / "run", start=3)
  trainer = _trainer(str(older), tmp_path / "run", start=0)
  rows = _rows(trainer.next_batch())
  assert all(row in _records(sampled_data, "train_sampled") for row in rows)


def test_a_budget_too_short_for_subword_sampling_min_updates_keeps_the_one_best(
    sampled_data, tmp_path, monkeypatch):
  """subword_sampling_start=10, subword_sampling_min_updates=20, a time budget checked every
  5 updates: the projection at update 10 decides. Projected at 15 updates, the run reads the
  one best throughout; at 25, the sampled copies from update 11 (micro-step 10, n = 1). The
  decision is in the checkpoint: a resumed run keeps it. Without a cooldown to project, or
  with no update to judge at, a time budget with the minimum is refused."""
  from t2t_lite.training import budget
  from t2t_lite.core.errors import UsageError
  from t2t_lite.training.milestones import NEVER
  one_best, sampled = _records(sampled_data, "train"), _records(sampled_data, "train_sampled")
  cooldown = {"optimizer_multistep_accumulate_steps": 1, "subword_sampling_min_updates": 20,
              "learning_rate_schedule": "constant*linear_warmup*linear_cooldown"}
  for projected in (15, 25):
    monkeypatch.setattr(budget.Pace, "project", lambda *args, end=projected: end)
    output_dir = tmp_path / f"run{projected}"
    trainer = _trainer(sampled_data, output_dir, 10, 10 ** 5, minutes=10.0, **cooldown)
    assert trainer.run_steps.lines()[-1] == ("training segmentations: the one best in updates "
                                        "1-10, sampled ones after if the run is at least 20 "
                                        "updates long")
    read = _recording(trainer)
    assert trainer.train()["updates"] == projected  # the cooldown's end, as projected
    switch = 10 if projected == 25 else projected
    assert all(row in one_best for rows in read[:switch] for row in rows)
    assert all(row in sampled for rows in read[switch:] for row in rows)
    assert int(trainer.sampled_from.numpy()) == (10 if projected == 25 else NEVER)
    resumed = _trainer(sampled_data, output_dir, 10, 10 ** 5, minutes=10.0, **cooldown)
    assert resumed.train()["updates"] == projected
    assert int(resumed.sampled_from.numpy()) == int(trainer.sampled_from.numpy())
  for start, schedule, message in (
      (0, cooldown["learning_rate_schedule"], "judged by the budget's projection at update "
       "subword_sampling_start, which is 0: set subword_sampling_start to an update after "
       "the first budget checks"),
      (10, "constant*linear_warmup", "judged by the projection of the learning-rate "
       "cooldown, which learning_rate_schedule='constant*linear_warmup' lacks")):
    with pytest.raises(UsageError, match=re.escape(message)):
      _trainer(sampled_data, tmp_path / "refused", start, 10 ** 5, minutes=10.0,
               **dict(cooldown, learning_rate_schedule=schedule))
  # Without a time budget, --train_steps is the run's length: 8 < 20, the one best (even
  # with subword_sampling_start=0, which in a run long enough reads the sampled from the start).
  short = _trainer(sampled_data, tmp_path / "short", 0, 8, **cooldown)
  read = _recording(short)
  short.train()
  assert int(short.sampled_from.numpy()) == NEVER and len(read) == 8
  assert all(row in one_best for rows in read for row in rows)
