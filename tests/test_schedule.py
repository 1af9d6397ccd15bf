"""Accumulation schedules (exact at their boundaries, resumable mid-phase) and elastic resume
on another layout with the same tokens per update, through the real trainer CLI."""

import os
import shutil

import numpy as np
import pytest
import tensorflow as tf

from conftest import NO_EVAL_FLAGS, TINY_HPARAMS, cli, corpus_state
from t2t_lite.training.steps import AccumulateSchedule
from test_workflow import _ends_in_usage_error, _usage_error


def _hparams_flag(extra):
  return f"--hparams={TINY_HPARAMS},{extra}"


def _model_values(output_dir):
  path = tf.train.latest_checkpoint(output_dir)
  reader = tf.train.load_checkpoint(path)
  return {name: reader.get_tensor(name) for name, _ in tf.train.list_variables(path)
          if name.startswith("model/") and name.endswith("VARIABLE_VALUE")}


def _worst_difference(expected, got):
  assert expected.keys() == got.keys() and len(expected) > 20
  scale = max(float(np.abs(v).max()) for v in expected.values())
  return max(float(np.abs(expected[k] - got[k]).max()) for k in expected) / scale


def _train(data_dir, output_dir, *args, env=None, check=True):
  return cli("t2t-lite-trainer", *NO_EVAL_FLAGS, f"--data_dir={data_dir}",
             f"--output_dir={output_dir}", *args, env=env,
             check=check)


SCHEDULE = _hparams_flag("optimizer_multistep_accumulate_steps=1,"
                         "optimizer_multistep_accumulate_schedule=1@0;2@2")


@pytest.fixture(scope="module")
def scheduled_run(multi30k_data, tmp_path_factory):
  """4 updates with n=1 for updates 1-2 and n=2 for updates 3-4 (6 micro-steps), stopped by
  a SIGTERM after micro-step 3, the first of update 3's two, and resumed."""
  output_dir = str(tmp_path_factory.mktemp("scheduled") / "run")
  first = _train(multi30k_data, output_dir, SCHEDULE, "--train_steps=4",
                 env=dict(os.environ, T2T_LITE_FAULT="signal:3"))
  resumed = _train(multi30k_data, output_dir, SCHEDULE, "--train_steps=4")
  return {"output_dir": output_dir, "first": first, "resumed": resumed}


def test_schedule_dry_run_counts_micro_steps_per_phase():
  out = cli("t2t-lite-trainer", "--dry_run", "--hparams_set=transformer_tiny",
            "--train_steps=10", f"--hparams={TINY_HPARAMS},"
            "optimizer_multistep_accumulate_schedule=1@0;2@4;8@6", check=True).stdout
  assert "updates 1-4: 1 micro-steps per update, 512 tokens per update, 4 micro-steps" in out
  assert "updates 5-6: 2 micro-steps per update, 1024 tokens per update, 4 micro-steps" in out
  assert "updates 7-10: 8 micro-steps per update, 4096 tokens per update, 32 micro-steps" in out
  assert "micro-steps: 40\n" in out
  # accumulators exist (once) even though the first phase has n=1
  assert "accumulators: 0.0 MiB" not in out and "none with accumulate steps 1" not in out


def test_the_last_update_within_a_count_of_micro_steps_inverts_micro_steps():
  schedule = AccumulateSchedule.parse("1@0;2@4;8@6")  # micro-steps 1-4, 6, 8, 16, 24, ...
  assert [schedule.micro_steps(u) for u in range(9)] == [0, 1, 2, 3, 4, 6, 8, 16, 24]
  assert [schedule.last_update_within(m, 100) for m in (0, 3, 5, 6, 15, 16, 23, 24)] == [
      0, 3, 4, 5, 6, 7, 7, 8]
  for micro_steps in range(60):  # the largest u with micro_steps(u) <= m, capped at 7
    expected = max(u for u in range(8) if schedule.micro_steps(u) <= micro_steps)
    assert schedule.last_update_within(micro_steps, 7) == expected, micro_steps
  assert AccumulateSchedule.constant(3).last_update_within(10, 100) == 3
  assert AccumulateSchedule.constant(1).last_update_within(-5, 100) == 0


@pytest.mark.parametrize("schedule, message", [
    ("2@1;4@5", "the first phase must start at update 0"),
    ("1@0;2@5;4@5", "the updates must increase (5 after 5)"),
    ("1@0;0@3", "n=0 must be at least 1"),
    ("1@0;2@x", "'2@x' is not n@update"),
    ("1@0,2@3", "separate the n@update pairs of optimizer_multistep_accumulate_schedule "
     "with ';'"),
])
def test_schedule_usage_errors(schedule, message):
  result = cli("t2t-lite-trainer", "--dry_run", "--hparams_set=transformer_tiny",
               f"--hparams=optimizer_multistep_accumulate_schedule={schedule}")
  _usage_error(result, message, "t2t-lite-trainer")


def test_schedule_with_accumulate_steps_is_refused():
  result = cli("t2t-lite-trainer", "--dry_run", "--hparams_set=transformer_base_fake_gpu8",
               "--hparams=optimizer_multistep_accumulate_schedule=1@0;2@3")
  _usage_error(result, "replaces optimizer_multistep_accumulate_steps=8; set "
               "optimizer_multistep_accumulate_steps=1", "t2t-lite-trainer")


def test_schedule_is_exact_at_its_boundary_and_resumes_mid_phase(scheduled_run,
                                                                 multi30k_data, tmp_path):
  """The schedule run, stopped mid-phase and resumed, equals 2 updates at n=1 followed, on
  resume, by 2 at n=2."""
  first, resumed = scheduled_run["first"], scheduled_run["resumed"]
  assert "trained 2 updates (3 micro-steps)" in first.stdout, first.stdout
  assert "accumulate steps 1 -> 2 from update 3 (1024 tokens per update)" in first.stderr
  assert "update 3/4 (micro-step 4)" in resumed.stderr
  assert "update 4/4 (micro-step 6)" in resumed.stderr
  assert "trained 4 updates (6 micro-steps)" in resumed.stdout, resumed.stdout
  manual = str(tmp_path / "manual")
  _train(multi30k_data, manual, _hparams_flag("optimizer_multistep_accumulate_steps=1"),
         "--train_steps=2")
  _train(multi30k_data, manual, _hparams_flag("optimizer_multistep_accumulate_steps=2"),
         "--train_steps=4", "--allow_hparams_change")
  assert _worst_difference(_model_values(scheduled_run["output_dir"]),
                           _model_values(manual)) <= 1e-6
  # The accumulators exist from the start, once: ckpt-2 (update 2, in the n=1 phase) holds
  # one copy of them, as many as the model's variables.
  names = [n for n, _ in tf.train.list_variables(
      os.path.join(scheduled_run["output_dir"], "ckpt-2"))]
  model = sum(n.startswith("model/") and n.endswith("VARIABLE_VALUE") for n in names)
  assert model > 20 and sum(n.startswith("accumulator/gradient_of/") for n in names) == model


# Dropout on: the masks follow the stream too; the sampled segmentations from update 4, the
# moved run's second update on two replicas (the stream's micro-batch 12 in both runs); two
# corpora (tests/conftest.py mixed_data), weighed 3:1 for updates 1-2 and 1:3 after.
ELASTIC = ("layer_prepostprocess_dropout=0.1,subword_sampling_start=3,"
           "corpus_weights=flickr:3/other:1;flickr:1/other:3@2")


def test_elastic_resume_on_two_replicas_equals_the_unmoved_run(mixed_data, tmp_path):
  """1 replica with n=4 for 2 updates, then 2 replicas with n=2 for 2 more (stopped by a
  signal mid-update and resumed), equals 1 replica with n=4 for 4 updates, both switching to
  the sampled segmentations at update 4, and to other corpus weights at update 3: the same
  weights, and every corpus's position and tokens the same integers. On the way, a mid-update
  checkpoint and other tokens per update are refused with what to do, and what the first
  error says to do works."""
  sampled_data = mixed_data
  one = _hparams_flag(f"optimizer_multistep_accumulate_steps=4,{ELASTIC}")
  two = _hparams_flag(f"optimizer_multistep_accumulate_steps=2,{ELASTIC}")
  mirrored = ["--strategy=mirrored", "--cpu_replicas=2"]
  unmoved, moved = str(tmp_path / "unmoved"), str(tmp_path / "moved")
  _train(sampled_data, unmoved, one, "--train_steps=4")
  _train(sampled_data, moved, one, "--train_steps=4",
         env=dict(os.environ, T2T_LITE_FAULT="signal:6"))  # stops at micro-step 6 of 8
  before = _files(moved)
  refused = _train(sampled_data, moved, two, *mirrored, "--train_steps=4", check=False)
  _ends_in_usage_error(refused, "was written mid-update (2 of 4 micro-steps of update 2) and "
                       "cannot resume on another layout (from 1 replica x 4 micro-steps per "
                       "update to 2 replicas x 2 micro-steps per update); resume it on its "
                       "own layout with --train_steps=2")
  assert _files(moved) == before  # hparams.json included: a refused resume writes nothing
  _train(sampled_data, moved, one, "--train_steps=2")  # as the error says: to the boundary
  wrong = _train(sampled_data, moved, one, *mirrored, "--train_steps=4", check=False)
  _ends_in_usage_error(wrong, "from 1 replica x 4 micro-steps per update to 2 replicas x 4 "
                       "micro-steps per update changes the tokens per update from 2048 to "
                       "4096; use optimizer_multistep_accumulate_steps=2")
  # Moved, and stopped by a SIGTERM after the first of update 3's two micro-steps: the two
  # replicas finish the update before saving (a checkpoint between updates holds no
  # replica-local sums), then resume from there.
  stopped = _train(sampled_data, moved, two, *mirrored, "--train_steps=4",
                   env=dict(os.environ, T2T_LITE_FAULT="signal:5"))
  assert ("resumed on another layout: from 1 replica x 4 micro-steps per update to 2 "
          "replicas x 2 micro-steps per update (2048 tokens per update), at micro-batch 8"
          ) in stopped.stderr, stopped.stderr[-3000:]
  assert "2 replicas save only between updates" in stopped.stderr, stopped.stderr[-3000:]
  assert "stopped: signal 15" in stopped.stderr
  assert os.path.basename(tf.train.latest_checkpoint(moved)) == "ckpt-12"
  result = _train(sampled_data, moved, two, *mirrored, "--train_steps=4")
  assert "update 4/4" in result.stderr and "update 3/4" not in result.stderr
  assert "update 4: training reads the sampled segmentations from here on" in result.stderr
  assert "replicas: 2" in result.stdout and "ckpt-16" in result.stdout
  assert _worst_difference(_model_values(unmoved), _model_values(moved)) <= 1e-5
  assert "corpora, updates 3 on: flickr 25.0%, other 75.0% of the batches" in result.stderr
  expected, got = (corpus_state(run) for run in (unmoved, moved))
  batches = np.array(expected[0])
  assert int(batches.sum()) == 16 and int(batches[:, 1].sum()) == 4  # sampled: 12-15
  assert got == expected
  tokens = expected[1]
  last = [line for line in result.stderr.splitlines() if "over the run:" in line][-1]
  assert last.endswith(f"over the run: flickr {tokens[0]:,}, other {tokens[1]:,}"), last
  from test_train import _scalars
  summaries = _scalars(os.path.join(moved, "train"))
  assert summaries["corpus/other/tokens"][-1] == (4, tokens[1])
  shares = [summaries[f"corpus/{name}/share"][-1] for name in ("flickr", "other")]
  assert shares[0][0] == shares[1][0] == 4 and shares[0][1] + shares[1][1] == pytest.approx(1)


def _files(directory):
  return {name: open(os.path.join(directory, name), "rb").read()
          for name in os.listdir(directory) if os.path.isfile(os.path.join(directory, name))}


def test_a_scheduled_run_moved_to_more_replicas_is_told_a_schedule_it_can_use(
    scheduled_run, multi30k_data, tmp_path):
  """The hint for another layout scales the schedule's phases from the update in progress
  on (a run with a schedule refuses optimizer_multistep_accumulate_steps); followed, it
  resumes on 2 replicas with the tokens per update of 1 replica x n=2."""
  moved = str(tmp_path / "moved")
  shutil.copytree(scheduled_run["output_dir"], moved)
  mirrored = ["--strategy=mirrored", "--cpu_replicas=2"]
  refused = _train(multi30k_data, moved, SCHEDULE, *mirrored, "--train_steps=5", check=False)
  hint = "--hparams=optimizer_multistep_accumulate_schedule=1@0;1@2"
  _ends_in_usage_error(refused, f"changes the tokens per update from 1024 to 2048; pass {hint} "
                       "(the schedule's n from here on scaled to the new replicas) with "
                       "--allow_hparams_change")
  result = _train(multi30k_data, moved, hint, "--allow_hparams_change", *mirrored,
                  "--train_steps=5")
  assert ("resumed on another layout: from 1 replica x 2 micro-steps per update to 2 "
          "replicas x 1 micro-step per update (1024 tokens per update)") in result.stderr, \
      result.stderr[-3000:]
