"""Adapting a model: a warm start onto another vocabulary (rows mapped by piece), frozen
parts (no gradient, no Adam slots, no accumulator), and both together."""

import json
import os

import numpy as np
import pytest
import tensorflow as tf

from conftest import TINY_FLAGS, cli, tiny_hparams, vocab_path
from t2t_lite.core import registry
from t2t_lite.adapting import vocab_map
from t2t_lite.training.options import Checkpointing, Evaluation
from t2t_lite.training.equivalence import concat, ragged_batches, tensors_relative_difference
from t2t_lite.core.errors import UsageError
from t2t_lite.training.learner import Learner
from t2t_lite.data.vocab import SubwordVocab
from t2t_lite.training.steps import run_steps
from t2t_lite.training.options import RunOptions
from t2t_lite.training.loop import Trainer

VOCAB = 60


def _trainer(output_dir, data_dir, hparams, **options):
  run = RunOptions(output_dir=str(output_dir), data_dir=data_dir, seed=11,
                   evaluation=Evaluation(frequency=0), log_every=1,
                   checkpointing=Checkpointing(save_steps=1000), **options)
  return Trainer(hparams, registry.problem("translate_ende_multi30k"), run_steps(hparams, 1, 1),
                 run)


def _source(tiny_run):
  reader = tf.train.load_checkpoint(tf.train.latest_checkpoint(tiny_run["output_dir"]))
  get = lambda name: reader.get_tensor(f"{name}/.ATTRIBUTES/VARIABLE_VALUE")  # noqa: E731
  return get


# --- the mapping ---------------------------------------------------------------------------
def test_pieces_are_carried_by_string_composed_from_their_split_or_new(tiny_run,
                                                                     sampled_data):
  old = SubwordVocab(vocab_path(tiny_run["data_dir"]))   # 8,000 pieces
  new = SubwordVocab(vocab_path(sampled_data))            # 2,000, made on 3,000 pairs
  mapping = vocab_map.mapping(old, new)
  counts = mapping.counts()
  assert sum(counts.values()) == new.size == 2000
  assert counts["carried"] > 1000 and counts["composed"] > 10, counts
  sp_old, sp_new = old._sp, new._sp
  for new_id in range(new.size):
    kind, ids = mapping.kinds[new_id], mapping.sources[new_id]
    piece = sp_new.id_to_piece(new_id)
    if new_id < 3:  # padding, end of sentence, unknown: by id
      assert (kind, ids) == ("carried", [new_id])
    elif kind == "carried":
      assert sp_old.id_to_piece(ids[0]) == piece
    elif kind == "composed":
      assert piece not in {sp_old.id_to_piece(i) for i in range(old.size)}
      assert "".join(sp_old.id_to_piece(i) for i in ids) == piece and len(ids) > 1
    else:
      assert ids == []
  # the rows: carried copied, composed the mean of their parts, new kept fresh
  rng = np.random.RandomState(0)
  source, fresh = rng.normal(size=(old.size, 4)), rng.normal(size=(new.size, 4))
  rows = mapping.map_rows(source, fresh)
  columns = mapping.map_rows(source.T, fresh.T, axis=1)
  np.testing.assert_array_equal(rows, columns.T)
  moments = mapping.map_moments(source)
  for new_id in range(new.size):
    kind, ids = mapping.kinds[new_id], mapping.sources[new_id]
    expected = {"carried": source[ids[0]] if ids else None, "new": fresh[new_id],
                "composed": source[ids].mean(0) if ids else None}[kind]
    np.testing.assert_allclose(rows[new_id], expected, rtol=1e-12)
    np.testing.assert_array_equal(moments[new_id],
                                  source[ids[0]] if kind == "carried" else np.zeros(4))


def test_the_rules_without_composition_start_those_rows_fresh(tiny_run, sampled_data):
  """--warm_start_vocab_rows=carried: the composed pieces start fresh (as new ones);
  fresh: every row does."""
  old = SubwordVocab(vocab_path(tiny_run["data_dir"]))
  new = SubwordVocab(vocab_path(sampled_data))
  pieces = vocab_map.mapping(old, new).counts()
  carried = vocab_map.mapping(old, new, "carried")
  assert carried.counts() == {"carried": pieces["carried"], "composed": 0,
                              "new": pieces["composed"] + pieces["new"]}
  fresh = vocab_map.mapping(old, new, "fresh")
  assert fresh.counts() == {"carried": 0, "composed": 0, "new": new.size}
  rng = np.random.RandomState(1)
  source, start = rng.normal(size=(old.size, 3)), rng.normal(size=(new.size, 3))
  np.testing.assert_array_equal(fresh.map_rows(source, start), start)
  with pytest.raises(ValueError, match="rows='mean': one of pieces, carried, fresh"):
    vocab_map.mapping(old, new, "mean")


def test_a_warm_start_onto_another_vocabulary_maps_rows_and_moments(tiny_run, sampled_data,
                                                                   tmp_path):
  """tiny_run (8,000 pieces) onto data of 2,000: the embedding's rows by piece, Adam's
  moments for the carried rows (0 for the others), the rest of the model as it was."""
  hparams = tiny_hparams(optimizer_multistep_accumulate_steps=2)
  trainer = _trainer(tmp_path / "tuned", sampled_data, hparams,
                     warm_start_from=tiny_run["output_dir"], warm_start_optimizer=True,
                     warm_start_vocab=vocab_path(tiny_run["data_dir"]))
  assert trainer.restore() is False
  mapping = vocab_map.mapping(SubwordVocab(vocab_path(tiny_run["data_dir"])), trainer.vocab)
  assert trainer.warm_start_vocabulary == {"source_vocab_sha256": json.load(open(os.path.join(
      tiny_run["output_dir"], "hparams.json")))["data"]["vocab_sha256"], "rows": "pieces",
      **mapping.counts()}
  get = _source(tiny_run)
  model, learner = trainer.learner.model, trainer.learner
  embedding = model.embedding.numpy()
  source = get("model/embedding")
  carried = [i for i, k in enumerate(mapping.kinds) if k == "carried"]
  composed = [i for i, k in enumerate(mapping.kinds) if k == "composed"]
  for i in carried[:50] + carried[-50:]:
    np.testing.assert_array_equal(embedding[i], source[mapping.sources[i][0]])
  for i in composed[:20]:
    np.testing.assert_allclose(embedding[i], source[mapping.sources[i]].mean(0), rtol=1e-6)
  # every other variable as the source had it
  src = registry.model("transformer")(hparams, 8000)
  tf.train.Checkpoint(model=src).read(tf.train.latest_checkpoint(tiny_run["output_dir"])) \
      .expect_partial()
  for ours, theirs in zip(model.trainable_variables, src.trainable_variables):
    if ours is not model.embedding:
      np.testing.assert_array_equal(ours.numpy(), theirs.numpy())
  m = learner.adam.m_of["embedding"].numpy()
  source_m = get("optimizer/m_of/embedding")
  assert np.abs(source_m).max() > 0
  np.testing.assert_array_equal(m[carried[5]], source_m[mapping.sources[carried[5]][0]])
  assert not m[composed].any()


def test_the_cli_records_and_logs_what_the_mapping_did(tiny_run, sampled_data, tmp_path):
  output_dir = tmp_path / "tuned"
  result = cli("t2t-lite-trainer", *TINY_FLAGS, f"--data_dir={sampled_data}",
               f"--output_dir={output_dir}", "--train_steps=1",
               f"--warm_start_from={tiny_run['output_dir']}", check=True)
  with open(output_dir / "hparams.json") as f:
    record = json.load(f)["warm_start_vocabulary"]
  assert record["carried"] + record["composed"] + record["new"] == 2000
  assert record["rows"] == "pieces"
  assert (f"warm start onto another vocabulary, rows by pieces: of 2,000 pieces, "
          f"{record['carried']:,} carried from the source's 8,000 by piece") in result.stderr
  assert "composed from the source's pieces of their text" in result.stderr


def test_the_rows_rule_is_refused_where_no_rows_are_mapped(tiny_run, tmp_path):
  alone = cli("t2t-lite-trainer", *TINY_FLAGS, f"--data_dir={tiny_run['data_dir']}",
              f"--output_dir={tmp_path / 'a'}", "--warm_start_vocab_rows=fresh")
  assert alone.returncode == 2 and alone.stderr.strip().splitlines()[-1].endswith(
      "--warm_start_vocab_rows is read only with --warm_start_from onto another vocabulary; "
      "set that too, or drop it")
  same = cli("t2t-lite-trainer", *TINY_FLAGS, f"--data_dir={tiny_run['data_dir']}",
             f"--output_dir={tmp_path / 'b'}", f"--warm_start_from={tiny_run['output_dir']}",
             "--warm_start_vocab_rows=fresh")
  assert same.returncode == 2 and same.stderr.strip().splitlines()[-1].endswith(
      "was trained with this run's vocabulary (or records none), so no rows are mapped; "
      "drop it")


# --- frozen parts --------------------------------------------------------------------------
def _learner(frozen, accumulate_steps=1, **overrides):
  values = dict(layer_prepostprocess_dropout=0.0, attention_dropout=0.0, relu_dropout=0.0,
                learning_rate_schedule="constant", learning_rate_constant=1e-3,
                frozen_parts=frozen)
  hparams = tiny_hparams(**{**values, **overrides})
  return Learner(hparams, VOCAB, accumulate_steps, seed=3)


def test_frozen_parts_keep_their_weights_and_have_no_slots_or_accumulators():
  free, frozen = _learner("", 2), _learner("encoder;embeddings", 2)
  parts = frozen.model.frozen_variables()
  assert {v.ref() for v in parts} == {v.ref() for v in [
      frozen.model.embedding, *frozen.model.encoder_norm.trainable_variables,
      *(v for block in frozen.model.encoder for v in block.trainable_variables)]}
  before = [v.numpy().copy() for v in parts]
  trained = frozen.model.trained_variables()
  trained_before = [v.numpy().copy() for v in trained]
  for batch in ragged_batches(4):
    free.step(batch)
    frozen.step(batch)
  assert int(frozen.update_step.numpy()) == 2
  assert all(np.array_equal(v.numpy(), b) for v, b in zip(parts, before))  # bit for bit
  assert len(frozen.adam.m) == len(frozen.accumulator.gradients) == len(trained)
  frozen_bytes = sum(v.shape.num_elements() * 4 for v in parts)
  assert frozen.state_bytes()["adam_slots"] == free.state_bytes()["adam_slots"] - 2 * frozen_bytes
  assert frozen.state_bytes()["accumulators"] == (free.state_bytes()["accumulators"]
                                                  - frozen_bytes)
  # and the rest trained
  assert all(not np.array_equal(v.numpy(), b) for v, b in zip(trained, trained_before))


def test_accumulation_stays_exact_with_frozen_parts():
  hparams_frozen = "embeddings;decoder.0"
  accumulated = _learner(hparams_frozen, 4, learning_rate_constant=1e-4)
  big = _learner(hparams_frozen, 1, learning_rate_constant=1e-4)
  micro = ragged_batches(8)
  for batch in micro:
    accumulated.step(batch)
  for update in range(2):
    big.step(concat(micro[4 * update:4 * update + 4]))
  assert tensors_relative_difference(accumulated.variables, big.variables) < 1e-5


@pytest.mark.parametrize("spec, message", [
    ("encoders", "frozen_parts: unknown part 'encoders'; known: embeddings, encoder, decoder"),
    ("encoder.1", "frozen_parts: 'encoder.1' names layers outside the 1 of the encoder (0-0)"),
    ("decoder.x", "frozen_parts: 'decoder.x' is not decoder.I or decoder.I-J"),
    ("embeddings;encoder;decoder", "freezes the whole model; nothing would train"),
])
def test_frozen_parts_that_do_not_exist_are_refused(spec, message):
  from t2t_lite.core import hparams_check
  with pytest.raises(UsageError, match=message.replace("(", r"\(").replace(")", r"\)")
                     .replace(".", r"\.")):
    hparams_check.check(tiny_hparams(frozen_parts=spec))


def _escaped(name: str) -> str:
  """A variable's name as a checkpoint key spells it."""
  return name.replace(".", "..").replace("/", ".S")


def test_slots_follow_their_variables_from_a_source_that_froze_nothing(tiny_run, tmp_path):
  """tiny_run froze nothing; a run that freezes the encoder starts with the source's Adam
  moments of the variables it trains, each its own (not by position in the shorter list)."""
  hparams = tiny_hparams(optimizer_multistep_accumulate_steps=2, frozen_parts="encoder")
  trainer = _trainer(tmp_path / "frozen", tiny_run["data_dir"], hparams,
                     warm_start_from=tiny_run["output_dir"], warm_start_optimizer=True)
  assert trainer.restore() is False
  learner, get = trainer.learner, _source(tiny_run)
  everything = learner.model.trainable_variables
  for name, m in learner.adam.m_of.items():
    np.testing.assert_array_equal(m.numpy(), get(f"optimizer/m_of/{_escaped(name)}"))
  assert len(learner.adam.m) < len(everything)


def test_warm_start_pairs_variables_by_name_and_refuses_other_ones_in_one_line(tmp_path):
  """A post-norm source has no stack norms and its blocks' norms sit elsewhere in the
  order: paired by position they would meet the wrong variables; by name the copy is
  refused, naming what differs."""
  from t2t_lite.adapting import warm_start
  from t2t_lite.training.learner import Learner
  post = tiny_hparams(layer_preprocess_sequence="none", layer_postprocess_sequence="dan")
  source = registry.model("transformer")(post, 40)
  path = tf.train.Checkpoint(model=source).write(str(tmp_path / "ckpt-1"))
  learner = Learner(tiny_hparams(), 40, 1)
  with pytest.raises(UsageError, match=r"^--warm_start_from=.*ckpt-1: its variables are not "
                     r"this model's \(the source lacks decoder_norm/bias, decoder_norm/scale, "
                     r"encoder_norm/bias and 1 more\); warm start needs the same model"):
    warm_start.copy_mapped(learner, path, post, 40)
  # the same model: every variable copied by its name
  pre = registry.model("transformer")(tiny_hparams(), 40, seed=5)
  path = tf.train.Checkpoint(model=pre).write(str(tmp_path / "ckpt-2"))
  assert warm_start.copy_mapped(learner, path, tiny_hparams(), 40) == ""
  for ours, theirs in zip(learner.model.trainable_variables, pre.trainable_variables):
    np.testing.assert_array_equal(ours.numpy(), theirs.numpy())
