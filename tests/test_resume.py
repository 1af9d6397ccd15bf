"""What a resume that changes the run's settings does: each variable's optimizer state follows
it by name when frozen_parts change."""

import os

import numpy as np
import pytest
import tensorflow as tf

from conftest import NO_EVAL_FLAGS, REPO, TINY_HPARAMS, cli, tiny_hparams
from t2t_lite.core.errors import UsageError
from t2t_lite.runs.checkpoints import StandIn
from t2t_lite.training import resume
from t2t_lite.training.learner import Learner

VOCAB = 40


def _batch(seed):
  rng = np.random.RandomState(seed)
  return {name: tf.constant(rng.randint(3, VOCAB, size=(3, 5)), tf.int32)
          for name in ("inputs", "targets")}


def _learner(frozen, steps=2):
  """transformer_tiny with a moving average, n = `steps`."""
  return Learner(tiny_hparams(frozen_parts=frozen, ema_decay=0.9), VOCAB, steps, seed=3)


def _trained(frozen, steps=2, updates=2):
  learner = _learner(frozen, steps)
  for i in range(updates * steps):
    learner.step(_batch(i))
  return learner


def _key(name: str) -> str:
  return name.replace(".", "..").replace("/", ".S")


def _resumed(path, frozen, frozen_then, steps=2):
  """A learner on frozen_parts=`frozen`, resumed from `path` as the trainer resumes."""
  learner = _learner(frozen, steps)
  objects, per_variable = resume.by_variable(learner, learner.trackables(), path, frozen_then)
  tf.train.Checkpoint(**objects).read(path).assert_existing_objects_matched()
  resume.take_per_variable(learner, per_variable, path, frozen_then)
  return learner, per_variable


def _by_hand(path, frozen, steps=2):
  """The reference: a learner on frozen_parts=`frozen` whose state is read from the
  checkpoint's tensors by hand, each by its variable's name; what the checkpoint lacks is
  as in a new run, the moving average of a newly trained variable at its weights."""
  reader = tf.train.load_checkpoint(path)
  get = lambda key: reader.get_tensor(f"{key}/.ATTRIBUTES/VARIABLE_VALUE")  # noqa: E731
  has = lambda key: reader.has_tensor(f"{key}/.ATTRIBUTES/VARIABLE_VALUE")  # noqa: E731
  learner = _learner(frozen, steps)
  names = learner.model.variable_names()
  for variable in learner.model.trainable_variables:
    variable.assign(get(f"model/{names[variable.ref()]}"))
  for name in ("micro_step", "in_update", "skipped_updates", "layout"):
    getattr(learner, name).assign(get(name))
  learner.adam.iterations.assign(get("optimizer/iterations"))
  learner.average.weight.assign(get("ema/weight"))
  for name, variable in zip(learner.names, learner.variables):
    if has(f"optimizer/m_of/{_key(name)}"):
      learner.adam.m_of[name].assign(get(f"optimizer/m_of/{_key(name)}"))
      learner.adam.v_of[name].assign(get(f"optimizer/v_of/{_key(name)}"))
      learner.average.average_of[name].assign(get(f"ema/average_of/{_key(name)}"))
    else:
      learner.average.average_of[name].assign(variable)
  learner.host.forget()
  return learner


def _state(learner) -> dict:
  return {**{f"w/{n}": v for n, v in zip(learner.names, learner.variables)},
          **{f"m/{n}": v for n, v in learner.adam.m_of.items()},
          **{f"v/{n}": v for n, v in learner.adam.v_of.items()},
          **{f"a/{n}": v for n, v in learner.average.average_of.items()}}


def _assert_same(a, b):
  ours, theirs = _state(a), _state(b)
  assert ours.keys() == theirs.keys()
  for name in ours:
    np.testing.assert_array_equal(ours[name].numpy(), theirs[name].numpy(), err_msg=name)


@pytest.fixture(scope="module")
def first(tmp_path_factory):
  """2 updates (n = 2) with decoder layer 0 frozen, and their checkpoint."""
  learner = _trained("decoder.0")
  path = tf.train.Checkpoint(**learner.trackables()).write(
      str(tmp_path_factory.mktemp("first") / "ckpt-4"))
  return learner, path


def test_gradual_unfreezing_carries_each_variables_state_and_equals_a_reference(first):
  first, path = first
  learner, per_variable = _resumed(path, "", "decoder.0")
  layer0 = [n for n in learner.names if n.startswith("decoder/0/")]
  assert per_variable.fresh == layer0 and len(layer0) > 5 and not per_variable.dropped
  assert len(per_variable.carried) == len(first.names)
  # decoder layer 1's moments are the first run's layer-1 moments, not layer 0's
  for name in (n for n in first.names if n.startswith("decoder/1/")):
    np.testing.assert_array_equal(learner.adam.m_of[name].numpy(), first.adam.m_of[name].numpy())
    np.testing.assert_array_equal(learner.adam.v_of[name].numpy(), first.adam.v_of[name].numpy())
  reference = _by_hand(path, "")
  _assert_same(learner, reference)
  for i in range(4, 8):  # two more updates, bit for bit as the reference
    learner.step(_batch(i))
    reference.step(_batch(i))
  _assert_same(learner, reference)
  assert all(np.abs(learner.adam.m_of[n].numpy()).max() > 0 for n in layer0)


def test_freezing_more_drops_the_state_of_the_newly_frozen(first):
  first, path = first
  learner, per_variable = _resumed(path, "decoder.0;encoder", "decoder.0")
  encoder = [n for n in first.names if n.startswith(("encoder/", "encoder_norm/"))]
  assert not per_variable.fresh and per_variable.dropped == sorted(encoder) and len(encoder) > 5
  assert per_variable.carried == learner.names == [n for n in first.names if n not in encoder]
  _assert_same(learner, _by_hand(path, "decoder.0;encoder"))
  for i in range(4, 6):
    stats = learner.step(_batch(i))
  assert stats is not None and int(learner.update_step.numpy()) == 3


def test_an_earlier_versions_lists_are_read_in_the_order_of_the_parts_they_were_written_with(
    first, tmp_path):
  """Before the state was kept by name, a checkpoint held lists over the variables that
  trained then; resumed with other frozen parts, each entry still reaches its variable."""
  first, named = first
  objects = dict(first.trackables())
  objects["optimizer"] = StandIn({"iterations": first.adam.iterations, "m": first.adam.m,
                                  "v": first.adam.v})
  objects["accumulator"] = StandIn({"gradients": first.accumulator.gradients,
                                    "loss": first.accumulator.loss,
                                    "tokens": first.accumulator.tokens})
  objects["ema"] = StandIn({"averages": first.average.averages,
                            "weight": first.average.weight})
  path = tf.train.Checkpoint(**objects).write(str(tmp_path / "ckpt-4"))
  assert not any("m_of" in key for key, _ in tf.train.list_variables(path))
  learner, per_variable = _resumed(path, "", "decoder.0")
  assert not per_variable.by_name and len(per_variable.fresh) > 5
  by_name, _ = _resumed(named, "", "decoder.0")
  _assert_same(learner, by_name)


def test_a_changed_part_mid_update_is_refused_with_what_to_do(tmp_path):
  first = _learner("decoder.0")
  first.step(_batch(0))  # one micro-step of two
  path = tf.train.Checkpoint(**first.trackables()).write(str(tmp_path / "ckpt-1"))
  with pytest.raises(UsageError, match=r"written mid-update \(1 micro-steps of update 1\) "
                     r"with other frozen_parts than this run's; resume it with "
                     r"frozen_parts=decoder.0 and --train_steps=1 to finish that update"):
    _resumed(path, "", "decoder.0")


def test_the_cli_unfreezes_on_resume_and_logs_the_three_counts(multi30k_data, tmp_path):
  output_dir = str(tmp_path / "run")
  common = [*(flag for flag in NO_EVAL_FLAGS if not flag.startswith("--hparams=")),
            f"--data_dir={multi30k_data}", f"--output_dir={output_dir}"]
  cli("t2t-lite-trainer", *common, "--train_steps=4", f"--hparams={TINY_HPARAMS},"
      "optimizer_multistep_accumulate_steps=2,frozen_parts=decoder.0", check=True)
  second = cli("t2t-lite-trainer", *common, "--train_steps=5", "--hparams=frozen_parts=",
               "--allow_hparams_change")
  assert second.returncode == 0, second.stderr[-2000:]
  learner = Learner(tiny_hparams(), VOCAB, 1)
  layer0 = len([n for n in learner.names if n.startswith("decoder/0/")])
  assert (f"frozen_parts changed since {output_dir}/ckpt-8: Adam's moments carried for "
          f"{len(learner.names) - layer0} variables, started fresh for {layer0} newly "
          "trained, dropped for 0 newly frozen") in second.stderr
  assert "trained 5 updates" in second.stdout


# --- the table of what a change on resume does -----------------------------------------------
def test_every_hparam_and_trainer_flag_has_a_row_and_the_docs_show_the_table():
  import re

  from t2t_lite.configs.transformer import basic_params
  from t2t_lite.runs import resume_changes
  assert set(resume_changes.HPARAMS) == set(basic_params().values())
  text = cli("t2t-lite-trainer", "--helpfull").stdout
  own = re.split(r"\n(?=\S)", text.split("t2t_lite.cli.common:", 1)[1])[0] + \
      re.split(r"\n(?=\S)", text.split("t2t_lite.cli.trainer:", 1)[1])[0]
  trainer_flags = set(re.findall(r"^  --(?:\[no\])?([a-z_0-9]+)", own, re.MULTILINE))
  assert len(trainer_flags) > 30 and set(resume_changes.FLAGS) == trainer_flags
  kinds = {change.kind for table in (resume_changes.HPARAMS, resume_changes.FLAGS)
           for change in table.values()}
  assert kinds == {resume_changes.FREE, resume_changes.REPLANNED, resume_changes.REFUSED}
  with open(os.path.join(REPO, "docs", "resuming.md")) as f:
    page = f.read()
  shown = page.split("<!-- resume-changes: begin -->\n")[1].split("<!-- resume-changes: end")[0]
  assert shown == resume_changes.render()


def test_a_refused_change_is_refused_in_one_line_even_when_changes_are_allowed(tmp_path):
  from test_hparams_read import changed_value, small
  from t2t_lite.runs import resume_changes, rundir
  recorded = small()
  refused = [name for name, change in resume_changes.HPARAMS.items()
             if change.kind == resume_changes.REFUSED]
  assert {"hidden_size", "num_heads", "model", "optimizer"} <= set(refused)
  for name in refused:
    output_dir = str(tmp_path / name)
    os.makedirs(output_dir)
    rundir.write_meta(output_dir, {"hparams_set": "transformer_tiny",
                                   "hparams": recorded.values()})
    value = changed_value(recorded, name)
    with pytest.raises(UsageError) as error:
      rundir.resolve(None, f"{name}={value}", output_dir, allow_change=True)
    assert str(error.value).startswith(
        f"resuming {output_dir} with {name}={value!r} (recorded {getattr(recorded, name)!r}): "
        f"{resume_changes.HPARAMS[name].what}"), str(error.value)
  # a free change is taken
  free = rundir.resolve(None, "label_smoothing=0.2", str(tmp_path / "hidden_size"),
                        allow_change=True)[0]
  assert free.label_smoothing == 0.2


# --- a re-planned training stream --------------------------------------------------------------
def _shift(output_dir) -> int:
  reader = tf.train.load_checkpoint(tf.train.latest_checkpoint(output_dir))
  return int(reader.get_tensor("stream_shift/.ATTRIBUTES/VARIABLE_VALUE"))


def test_another_batch_size_reads_on_in_the_same_epoch_at_the_same_fraction(tiny_run, tmp_path):
  """tiny_run read 8 batches of 512 tokens; at 1024 tokens an epoch has about half as many
  batches, and the run reads on from the same fraction of epoch 1: batch ceil(8 K' / K)."""
  import math
  import shutil

  from t2t_lite.core import registry
  from t2t_lite.data.stream import Batching, SplitPlan
  output_dir = str(tmp_path / "run")
  shutil.copytree(tiny_run["output_dir"], output_dir)
  lengths = registry.problem("translate_ende_multi30k").training_store(
      tiny_run["data_dir"], "train").lengths
  before, after = (SplitPlan(lengths, Batching(size, 64), 7, 0).batches_per_epoch
                   for size in (512, 1024))
  target = math.ceil(8 * after / before)
  assert 2 < target < 8
  flags = [*(flag for flag in NO_EVAL_FLAGS if not flag.startswith("--hparams=")),
           f"--output_dir={output_dir}"]
  moved = cli("t2t-lite-trainer", *flags, "--train_steps=5", "--hparams=batch_size=1024",
              "--allow_hparams_change", check=True)
  assert (f"batch_size=1024 (recorded 512) re-planned the training stream: an epoch has "
          f"{after} batches ({before} before); the run had read 8 of epoch 1's and reads on "
          f"from its batch {target} (batch {target} of the stream)") in moved.stderr
  assert _shift(output_dir) == target - 8
  # the shift is the run's from now on: the record holds the new value, so a later resume on
  # it re-plans nothing, and reads the shift from the checkpoint
  from t2t_lite.runs import rundir
  from t2t_lite.training import resume
  record = rundir.read_meta(output_dir)
  assert record["hparams"]["batch_size"] == 1024
  assert resume._plan_changes(resume.recorded_batching(record, False), Batching(1024, 64)) == ""
