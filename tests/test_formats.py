"""Older formats are upgraded in one place (t2t_lite/older_formats.py) as they are read."""

import json
import os

import numpy as np
import pytest
import tensorflow as tf

from conftest import tiny_hparams
from t2t_lite.core import older_formats
from t2t_lite.runs import rundir
from t2t_lite.runs.checkpoints import update_of
from t2t_lite.core.errors import UsageError
from t2t_lite.training import resume
from t2t_lite.training.learner import Learner

VOCAB = 40


def _batch(seed):
  rng = np.random.RandomState(seed)
  return {name: tf.constant(rng.randint(3, VOCAB, size=(3, 5)), tf.int32)
          for name in ("inputs", "targets")}


def _older_checkpoint(tmp_path, micro_steps, steps=2):
  """A checkpoint as a version before `in_update` and `layout` wrote it, `micro_steps`
  micro-steps into a run with n = `steps`; and the learner that wrote it."""
  learner = Learner(tiny_hparams(), VOCAB, steps, seed=2)
  for i in range(micro_steps):
    learner.step(_batch(i))
  objects = {k: v for k, v in learner.trackables().items()
             if k not in resume.ADDED_TO_CHECKPOINTS}
  path = tf.train.Checkpoint(**objects).write(str(tmp_path / "ckpt-1"))
  return path, learner


def _restored(path, steps=2):
  learner = Learner(tiny_hparams(), VOCAB, steps, seed=2)
  names = {name.split("/")[0] for name, _ in tf.train.list_variables(path)}
  lacks = resume.checkpoint_lacks(path, names)
  tf.train.Checkpoint(**{k: v for k, v in learner.trackables().items() if k not in lacks}
                      ).read(path).assert_existing_objects_matched()
  return learner, lacks


def test_a_checkpoint_from_before_in_update_and_layout_resumes_mid_update(tmp_path):
  path, old = _older_checkpoint(tmp_path, micro_steps=5)  # 2 updates and 1 of 2 micro-steps
  learner, lacks = _restored(path)
  assert lacks == {"in_update", "layout"}
  meta = {"hparams": {"optimizer_multistep_accumulate_steps": 2}}
  resume.upgrade(learner, lacks, meta, path)
  assert int(learner.in_update.numpy()) == 1 and learner.host.position() == 1
  assert learner.layout.numpy().tolist() == [1, 2]
  # The next micro-step completes the update, as it would have in the run that wrote it.
  old_stats, new_stats = old.step(_batch(5)), learner.step(_batch(5))
  assert old_stats is not None and new_stats is not None
  assert int(learner.update_step.numpy()) == int(old.update_step.numpy()) == 3
  for a, b in zip(old.variables, learner.variables):
    np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=0, atol=1e-6)


def test_an_older_checkpoint_on_other_accumulate_steps_is_refused_with_the_value(tmp_path):
  path, _ = _older_checkpoint(tmp_path, micro_steps=4, steps=4)
  learner, lacks = _restored(path, steps=2)
  with pytest.raises(UsageError, match=r"predates recorded layouts and was trained with "
                     r"optimizer_multistep_accumulate_steps=4; resume it with that value"):
    resume.upgrade(learner, lacks,
                             {"hparams": {"optimizer_multistep_accumulate_steps": 4}}, path)


def test_a_tf_data_iterator_is_refused_unless_the_stream_may_change():
  for names in ({"model", "iterator_0", "layout", "in_update"}, {"model", "iterator_0"}):
    with pytest.raises(UsageError, match=r"checkpoint run/ckpt-3 holds its data position as a "
                       r"tf.data iterator \(written by an earlier t2t-lite\), which the planned "
                       r"training stream cannot continue exactly; pass --allow_stream_change"):
      resume.checkpoint_lacks("run/ckpt-3", names)
  assert resume.checkpoint_lacks("run/ckpt-3", {"model", "iterator_0"},
                                  allow_stream_change=True) == {"in_update", "layout"}
  assert resume.checkpoint_lacks("run/ckpt-3", {"model", "layout", "in_update"}) == set()
  # replicas with a shard each, before layouts were recorded: their count is not known
  for allowed in (False, True):
    with pytest.raises(UsageError, match="replicas each read their own data shard, before "
                       "layouts were recorded"):
      resume.checkpoint_lacks("run/ckpt-3", {"model", "iterator_0", "iterator_1"}, allowed)


def test_a_run_record_drops_the_hparams_no_version_reads():
  record = older_formats.run_record({"hparams": {"shuffle_buffer_size": 20000, "batch_size": 64}})
  assert record["hparams"] == {"batch_size": 64, **older_formats.ADDED_HPARAMS}
  from t2t_lite.core import registry
  hparams = registry.hparams("transformer_tiny")
  with pytest.raises(UsageError, match=r"hparam 'shuffle_buffer_size' is no longer read: "
                     r"training batches are planned from a global shuffle of every epoch "
                     r"\(t2t_lite.data.stream\), which needs no buffer; drop it"):
    hparams.parse("shuffle_buffer_size=100")


def test_a_run_record_from_before_the_data_record_reads_as_not_recorded(tmp_path):
  (tmp_path / rundir.META_FILE).write_text(json.dumps(
      {"hparams_set": "transformer_tiny", "hparams": {}, "data_dir": "data/x"}))
  meta = rundir.read_meta(str(tmp_path))
  assert meta["data"] is None and meta["random_seed"] is None
  assert meta["data_dir"] == "data/x"
  assert older_formats.run_record(None) is None
  current = {"data": {"problem": "p"}, "random_seed": 7, "train_minutes": 0.0,
             "xla_compile": False}
  assert older_formats.run_record(current) == current
  # A run from before the segmentation switch read its one training split from the start
  # (and the other hparams added since: test_a_run_recorded_before_an_hparam_existed_...).
  assert meta["hparams"] == older_formats.ADDED_HPARAMS
  recorded = {"data": None, "random_seed": 7, "train_minutes": 0.0, "xla_compile": None,
              "hparams": {**older_formats.ADDED_HPARAMS, "subword_sampling_start": 100,
                          "subword_sampling_min_updates": 9}}
  assert older_formats.run_record(recorded) == recorded


def test_sampled_data_from_before_the_one_best_was_kept_reads_as_sampled_only():
  """Its "train" split held the sampled copies: it reads as "train_sampled", with no
  "train" (datagen makes the data again; a switch from the one best is refused on it)."""
  older = {"dir": "d", "settings": {"subword_sampling": {"copies": 2, "alpha": 0.3}},
           "splits": {"train": {"files": ["a"]}, "dev": {"files": ["b"]}}}
  assert older_formats.data_manifest(older)["splits"] == {"train_sampled": {"files": ["a"]},
                                                    "dev": {"files": ["b"]}}
  current = {"dir": "d", "settings": {"subword_sampling": {"copies": 2, "alpha": 0.3}},
             "splits": {"train": {"files": ["a"]}, "train_sampled": {"files": ["c"]}}}
  assert older_formats.data_manifest(current) == current
  one_best = {"dir": "d", "settings": {}, "splits": {"train": {"files": ["a"]}}}
  assert older_formats.data_manifest(one_best)["splits"] == {"train": {"files": ["a"]}}


def test_a_best_model_record_from_before_early_stopping_reads_as_best_by_dev_bleu(tmp_path):
  best = tmp_path / "best"
  best.mkdir()
  assert older_formats.best_record(str(best), lambda p: json.load(open(p))) is None
  (best / older_formats.OLDER_BEST_FILE).write_text(json.dumps(
      {"bleu": 31.5, "update": 400, "checkpoint": "best/ckpt-800"}))
  assert older_formats.best_record(str(best), lambda p: json.load(open(p))) == {
      "metric": "dev_bleu", "value": 31.5, "update": 400, "improved_at": 400,
      "checkpoint": "best/ckpt-800"}
  (best / older_formats.BEST_FILE).write_text(json.dumps({"metric": "dev_loss", "value": 1.5}))
  assert older_formats.best_record(str(best), lambda p: json.load(open(p)))["metric"] == "dev_loss"
  assert os.path.isfile(best / older_formats.OLDER_BEST_FILE)  # read, never removed


def test_an_average_from_before_averages_recorded_their_update_is_refused(tmp_path):
  older = tf.train.Checkpoint(model=tf.Module()).write(str(tmp_path / "older" / "ckpt-9"))
  with pytest.raises(ValueError, match=r"records no update \(an average made by an older "
                     r"t2t-lite-avg-checkpoints: average again\)"):
    update_of(older)
  current = tf.train.Checkpoint(update_step=tf.Variable(12, dtype=tf.int64)).write(
      str(tmp_path / "current" / "ckpt-9"))
  assert update_of(current) == 12


def test_a_run_whose_checkpoint_holds_a_tf_data_iterator_resumes_only_when_allowed(
    tiny_run, tmp_path):
  """A checkpoint as earlier versions wrote it (the data position a tf.data iterator) is
  refused with what to do; with --allow_stream_change the run goes on from its update on the
  planned stream."""
  import shutil
  from conftest import TINY_FLAGS, cli
  from t2t_lite.core import registry
  from t2t_lite.training import steps
  from t2t_lite.training.options import Checkpointing, Evaluation
  from t2t_lite.training.options import RunOptions
  from t2t_lite.training.loop import Trainer
  run = tmp_path / "run"
  shutil.copytree(tiny_run["output_dir"], run)
  hparams = tiny_hparams(optimizer_multistep_accumulate_steps=2)
  trainer = Trainer(hparams, registry.problem("translate_ende_multi30k"),
                    steps.run_steps(hparams, 1, 4),
                    RunOptions(output_dir=str(run), data_dir=tiny_run["data_dir"], seed=7,
                               evaluation=Evaluation(frequency=0),
                               checkpointing=Checkpointing(save_steps=0)))
  assert trainer.restore()
  older = tf.train.Checkpoint(**trainer.checkpoints.objects,
                              iterator_0=iter(tf.data.Dataset.range(10).shuffle(5, seed=1)))
  manager = tf.train.CheckpointManager(older, str(run), max_to_keep=None)
  path = manager.save(checkpoint_number=9)  # the newest, listed in the state file
  flags = [*TINY_FLAGS, f"--data_dir={tiny_run['data_dir']}", f"--output_dir={run}",
           "--train_steps=5"]
  with pytest.raises(UsageError, match=f"checkpoint {path} holds its data position as a "
                     "tf.data iterator"):  # (the program prints it as one line, exit 2)
    Trainer(hparams, registry.problem("translate_ende_multi30k"), steps.run_steps(hparams, 1, 5),
            RunOptions(output_dir=str(run), data_dir=tiny_run["data_dir"], seed=7,
                       evaluation=Evaluation(frequency=0))).restore()
  resumed = cli("t2t-lite-trainer", *flags, "--allow_stream_change", check=True)
  assert f"checkpoint {path} held a tf.data iterator: resumed on the planned stream" \
      in resumed.stderr
  assert f"resumed from {path}: update 4, micro-step 8" in resumed.stderr
  assert "trained 5 updates (10 micro-steps)" in resumed.stdout


@pytest.mark.parametrize("name, value", sorted(older_formats.ADDED_HPARAMS.items()))
def test_a_run_recorded_before_an_hparam_existed_resumes_as_it_ran(tmp_path, name, value):
  """A record of transformer_multi30k_cpu written before `name` existed resumes with the
  value that reproduces what the run did then, not the set's value today (whose dropout
  ramp, say, would change the run)."""
  from t2t_lite.core import registry
  today = registry.hparams("transformer_multi30k_cpu").values()
  recorded = {k: v for k, v in today.items() if k not in older_formats.ADDED_HPARAMS}
  recorded["learning_rate_schedule"] = "constant*linear_warmup*rsqrt_decay*rsqrt_hidden_size"
  (tmp_path / rundir.META_FILE).write_text(json.dumps(
      {"hparams_set": "transformer_multi30k_cpu", "hparams": recorded}))
  hparams, _, _ = rundir.resolve(None, "", str(tmp_path))
  assert getattr(hparams, name) == value != today[name]  # (today's set differs)


def test_the_other_hparams_added_since_keep_a_recorded_runs_meaning_with_every_sets_value():
  from t2t_lite.core.hparams_check import COOLDOWN
  """(See older_formats.ADDED_HPARAMS.)"""
  from t2t_lite.core import registry
  for name in registry.hparams_sets.names():
    hparams = registry.hparams(name)
    assert hparams.optimizer_multistep_accumulate_schedule == "", name
    assert hparams.dropout_ramp_initial == 0.0, name
    assert hparams.ema_decay == 0.0 and hparams.frozen_parts == "", name
    if "linear_cooldown" not in hparams.learning_rate_schedule:
      assert hparams.learning_rate_cooldown == COOLDOWN, name
