"""Runs that survive SIGKILL, non-finite values and damaged checkpoints."""

import os
import signal
import subprocess

import numpy as np
import pytest
import tensorflow as tf

from conftest import BIN, TINY_HPARAMS, cli, popen
from t2t_lite.core.errors import UsageError

FLAGS = ["--problem=translate_ende_multi30k", "--hparams_set=transformer_tiny",
         f"--hparams={TINY_HPARAMS},optimizer_multistep_accumulate_steps=4",
         "--save_checkpoints_steps=1", "--keep_checkpoint_max=3", "--log_every=1",
         "--local_eval_frequency=0", "--random_seed=5", "--train_steps=6"]
# The same on data with sampled segmentations, read from update 4 on (micro-step 12), with a
# moving average of the weights.
SWITCH_FLAGS = [f"{flag},subword_sampling_start=3,ema_decay=0.9,ema_reference_tokens=3000"
                if flag.startswith("--hparams=") else flag for flag in FLAGS]


def _model_values(output_dir):
  path = tf.train.latest_checkpoint(output_dir)
  reader = tf.train.load_checkpoint(path)
  return {n: reader.get_tensor(n) for n, _ in tf.train.list_variables(path)
          if n.startswith(("model/", "ema/")) and n.endswith("VARIABLE_VALUE")}


def _start(output_dir, data_dir, fault="", flags=FLAGS):
  env = dict(os.environ, T2T_LITE_FAULT=fault)
  return popen([os.path.join(BIN, "t2t-lite-trainer"), *flags,
                f"--data_dir={data_dir}", f"--output_dir={output_dir}"],
               env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def _kill_when(process, marker, occurrence=1):
  """SIGKILLs `process` right after its log shows `marker` for the n-th time."""
  seen = 0
  for line in process.stderr:
    if marker in line:
      seen += 1
      if seen == occurrence:
        process.send_signal(signal.SIGKILL)
        break
  process.wait(timeout=120)
  return process.returncode


def test_killed_and_resumed_runs_end_where_an_unbroken_run_ends(sampled_data, tmp_path):
  """Broken five ways and resumed, a run ends where an unbroken one of the same seed does,
  having logged the same loss at every update; before and after it switched from the one
  best segmentation to the sampled ones (subword_sampling_start=3), and across the switch."""
  from test_train import _scalars
  straight = str(tmp_path / "straight")
  log = open(tmp_path / "straight.log", "w")  # a file: an unread pipe could fill and stall it
  unbroken = popen([os.path.join(BIN, "t2t-lite-trainer"), *SWITCH_FLAGS,
                    f"--data_dir={sampled_data}", f"--output_dir={straight}"],
                   stdout=subprocess.DEVNULL, stderr=log)  # beside the broken runs

  broken = str(tmp_path / "broken")
  resume = lambda fault="": _start(broken, sampled_data, fault, SWITCH_FLAGS)  # noqa: E731
  # 1: mid-accumulation (micro-step 6 of 24; the last checkpoint is update 1)
  assert resume("micro:6").wait(timeout=120) == -signal.SIGKILL
  # 2: inside a checkpoint save: files written, checkpoint state not yet updated
  assert resume("save:2").wait(timeout=120) == -signal.SIGKILL
  # 3: between micro-steps, right after an update was logged (before its checkpoint)
  assert _kill_when(resume(), "update 4/6") == -signal.SIGKILL
  # 4: while restoring, at start-up
  assert _kill_when(resume(), "resumed from") == -signal.SIGKILL
  # 5: a failure outside the compiled steps, mid-update: saved first, one line, exit 1
  failed = resume("raise:22")
  _, err = failed.communicate(timeout=120)
  assert failed.returncode == 1, err[-3000:]
  last = err.strip().splitlines()[-1]
  assert last.startswith("t2t-lite-trainer: error: RuntimeError: injected failure after "
                         "micro-step 22; the run was saved first (") and "ckpt-22)" in last, last
  final = resume()
  _, err = final.communicate(timeout=180)
  assert final.returncode == 0, err[-3000:]
  assert "update 6/6 (micro-step 24)" in err
  assert unbroken.wait(timeout=180) == 0, (tmp_path / "straight.log").read_text()[-3000:]
  log.close()
  switch = "update 4: training reads the sampled segmentations from here on"
  assert (tmp_path / "straight.log").read_text().count(switch) == 1
  # An update logged again after a kill logs the same loss (the last logged is kept here).
  losses = [dict(_scalars(os.path.join(d, "train"))["loss"]) for d in (straight, broken)]
  assert sorted(losses[0]) == list(range(1, 7)) and losses[1].keys() == losses[0].keys()
  assert max(abs(losses[0][u] - losses[1][u]) for u in losses[0]) <= 1e-6, losses

  expected, got = _model_values(straight), _model_values(broken)
  assert expected.keys() == got.keys()
  assert len([k for k in expected if k.startswith("ema/average_of/")]) == len(
      [k for k in expected if k.startswith("model/")])  # the weights and their average
  worst = max(float(np.abs(expected[k] - got[k]).max()) for k in expected)
  assert worst <= 1e-6, worst


def test_nonfinite_updates_are_skipped_counted_and_too_many_stop_the_run(multi30k_data,
                                                                         tmp_path):
  """A NaN in update 2's first try (micro-step 3 of 4) skips that try; update 2 is then made
  of micro-steps 5-6 and saved. From micro-step 7 every try is NaN: the third in a row stops
  a run that may not recover (divergence_max_recoveries=0; tests/test_recovery.py) with the
  last good checkpoint, which counts the one skip before it."""
  output_dir = tmp_path / "run"
  result = cli("t2t-lite-trainer", *FLAGS[:-1], "--train_steps=10",
               f"--hparams={TINY_HPARAMS},optimizer_multistep_accumulate_steps=2,"
               "max_consecutive_nonfinite=3,divergence_max_recoveries=0",
               f"--data_dir={multi30k_data}", f"--output_dir={output_dir}",
               env={"T2T_LITE_FAULT": "nan:3,7,8,9,10,11,12"})
  assert ("non-finite loss or gradient at update 2 (micro-step 4): update skipped, "
          "accumulators reset (1 in a row, 1 skipped in all)") in result.stderr
  assert ("non-finite loss or gradient at update 3 (micro-step 12): update skipped, "
          "accumulators reset (3 in a row, 4 skipped in all)") in result.stderr, \
      result.stderr[-3000:]
  assert result.returncode == 1
  last = result.stderr.strip().splitlines()[-1]
  assert last.startswith("t2t-lite-trainer: error: 3 updates in a row had a non-finite loss")
  assert last.endswith("stopped (divergence_max_recoveries=0). The last good checkpoint, "
                       "ckpt-6, is kept; lower learning_rate_constant or set clip_grad_norm, "
                       "then resume"), last
  assert "Traceback" not in result.stderr
  latest = tf.train.latest_checkpoint(str(output_dir))
  assert os.path.basename(latest) == "ckpt-6"
  reader = tf.train.load_checkpoint(latest)
  assert reader.get_tensor("skipped_updates/.ATTRIBUTES/VARIABLE_VALUE") == 1
  assert reader.get_tensor("optimizer/iterations/.ATTRIBUTES/VARIABLE_VALUE") == 2
  for name, _ in tf.train.list_variables(latest):
    if name.startswith("model/") and name.endswith("VARIABLE_VALUE"):
      assert np.isfinite(reader.get_tensor(name)).all(), name


def test_damaged_checkpoint_falls_back_to_the_previous_one(tiny_run, tmp_path):
  import shutil
  run = str(tmp_path / "run")
  shutil.copytree(tiny_run["output_dir"], run)
  latest = tf.train.latest_checkpoint(run)
  data_file = [f for f in os.listdir(run) if f.startswith(os.path.basename(latest) + ".data")][0]
  with open(os.path.join(run, data_file), "r+b") as f:
    f.truncate(1000)
  from conftest import NO_EVAL_FLAGS
  result = cli("t2t-lite-trainer", *NO_EVAL_FLAGS, f"--output_dir={run}", "--train_steps=5",
               check=True)
  assert f"checkpoint {latest} is unreadable" in result.stderr
  assert "falling back to" in result.stderr
  assert "resumed from" in result.stderr


def test_missing_or_altered_shards_are_usage_errors(multi30k_data, tmp_path):
  import shutil
  from t2t_lite.core import registry
  problem = registry.problem("translate_ende_multi30k")
  data_dir = tmp_path / "data"
  shutil.copytree(multi30k_data, data_dir)
  shard = problem.data_files(str(data_dir), "train")[1]
  original = problem.data_files(multi30k_data, "train")[1]
  os.remove(shard)
  result = cli("t2t-lite-trainer", *FLAGS, f"--data_dir={data_dir}",
               f"--output_dir={tmp_path / 'run'}")
  assert result.returncode == 2
  assert f"data file {shard} listed in the manifest is missing" in result.stderr
  assert "Traceback" not in result.stderr
  assert not (tmp_path / "run").exists()
  # a shard cut short after datagen is refused too, naming both sizes
  shutil.copyfile(original, shard)
  size = os.path.getsize(shard)
  with open(shard, "r+b") as f:
    f.truncate(size - 10)
  with pytest.raises(UsageError, match=f"data file {shard} has {size - 10} bytes, the "
                     f"manifest says {size}: it was changed after datagen"):
    problem.data_files(str(data_dir), "train")


def test_ctrl_c_saves_mid_accumulation_and_exits_cleanly(multi30k_data, tmp_path):
  output_dir = str(tmp_path / "run")
  flags = [f for f in FLAGS if f != "--train_steps=6"] + ["--train_steps=1000"]
  process = popen([os.path.join(BIN, "t2t-lite-trainer"), *flags,
                   f"--data_dir={multi30k_data}", f"--output_dir={output_dir}"],
                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  for line in process.stderr:
    if "update 2/1000" in line:
      process.send_signal(signal.SIGINT)
      break
  out, err = process.communicate(timeout=120)
  assert process.returncode == 0, err[-2000:]
  assert "stopped: signal 2" in err
  micro_step = int(out.split(" micro-steps)")[0].rsplit("(", 1)[1])
  assert micro_step >= 8
  assert tf.train.latest_checkpoint(output_dir).endswith(f"ckpt-{micro_step}")


def test_a_failure_mid_update_on_mirrored_replicas_is_not_saved(multi30k_data, tmp_path):
  """Mid-update, two mirrored replicas hold replica-local accumulators, which a checkpoint
  would restore as their sum spread over the replicas: a failure there (after micro-step 3
  of n = 2) ends the run without a save, the last checkpoint kept (none yet here). (Between
  updates a failure saves first: test_killed_and_resumed_runs_end_where_an_unbroken_run_ends.)"""
  output_dir = tmp_path / "run"
  result = cli("t2t-lite-trainer", *FLAGS, f"--data_dir={multi30k_data}",
               f"--output_dir={output_dir}", "--strategy=mirrored", "--cpu_replicas=2",
               env={"T2T_LITE_FAULT": "raise:3"})
  assert result.returncode == 1, result.stderr[-2000:]
  last = result.stderr.strip().splitlines()[-1]
  assert "RuntimeError: injected failure after micro-step 3" in last, last
  assert ("not saved mid-update (the accumulators of the 2 replicas are their own): fix the "
          "cause and rerun to resume from the last checkpoint") in last, last
  assert tf.train.latest_checkpoint(str(output_dir)) is None
