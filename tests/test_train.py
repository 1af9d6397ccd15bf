"""The trainer: exact resume mid-accumulation, --train_steps in updates, the real CLI."""

import glob
import json
import os
import shutil

import pytest
import tensorflow as tf

import forkserver
from conftest import NO_EVAL_FLAGS, REPO, TINY_FLAGS, cli, tiny_hparams
from t2t_lite.core import registry
from t2t_lite.training.steps import run_steps
from t2t_lite.training.options import Checkpointing, Evaluation, Stopping
from t2t_lite.training.options import RunOptions
from t2t_lite.training.loop import Trainer


def make_trainer(output_dir, data_dir, train_steps, accumulate_steps=4, **options):
  hparams = tiny_hparams(optimizer_multistep_accumulate_steps=accumulate_steps)
  problem = registry.problem("translate_ende_multi30k")
  run = RunOptions(output_dir=str(output_dir), data_dir=data_dir, seed=11,
                   evaluation=Evaluation(frequency=0), log_every=1,
                   checkpointing=Checkpointing(save_steps=1000), **options)
  return Trainer(hparams, problem, run_steps(hparams, 1, train_steps), run)


def test_train_steps_counts_updates(multi30k_data, tmp_path):
  trainer = make_trainer(tmp_path / "run", multi30k_data, train_steps=2, accumulate_steps=3)
  result = trainer.train()
  assert (result["updates"], result["micro_steps"]) == (2, 6)
  assert int(trainer.learner.update_step.numpy()) == 2


def _scalars(directory):
  found = {}
  for path in sorted(glob.glob(os.path.join(directory, "events.out.tfevents.*"))):
    for event in tf.compat.v1.train.summary_iterator(path):
      for value in event.summary.value:
        found.setdefault(value.tag, []).append(
            (event.step, float(tf.make_ndarray(value.tensor))))
  return found


def test_cli_trains_checkpoints_summarises_and_resumes(tiny_run, multi30k_data, tmp_path):
  output_dir = tiny_run["output_dir"]
  first = tiny_run["first"]
  assert "tokens per update: 1024 (= 512 x 2 x 1)" in first.stdout
  assert "micro-steps: 8 (= 4 x 2)" in first.stdout
  assert "update 4/4 (micro-step 8): loss" in first.stderr
  # each log line reports the padding of the batches trained on since the previous one
  paddings = [float(line.split("% padding")[0].rsplit(", ", 1)[1])
              for line in first.stderr.splitlines() if "% padding" in line]
  assert len(paddings) == 4 and all(0 < p < 25 for p in paddings), paddings
  assert "trained 4 updates (8 micro-steps)" in first.stdout
  state = tf.train.get_checkpoint_state(output_dir)
  assert [os.path.basename(p) for p in state.all_model_checkpoint_paths] == ["ckpt-4", "ckpt-8"]
  train = _scalars(os.path.join(output_dir, "train"))
  for tag in ("loss", "learning_rate", "grad_norm", "tokens_per_second", "tokens_per_update",
              "padding_fraction"):
    assert [step for step, _ in train[tag]] == [1, 2, 3, 4], tag
  evaluation = _scalars(os.path.join(output_dir, "eval"))
  assert [step for step, _ in evaluation["dev_loss"]] == [4]
  assert "dev_bleu" in evaluation
  with open(os.path.join(output_dir, "best", "best.json")) as f:
    best = json.load(f)  # no early stopping: the best model by dev BLEU
  assert (best["metric"], best["update"]) == ("dev_bleu", 4)
  assert best["value"] == pytest.approx(evaluation["dev_bleu"][-1][1], abs=1e-3)

  # resumed in a copy: tiny_run is shared by other tests, which expect its 4 updates
  copy = str(tmp_path / "run")
  shutil.copytree(output_dir, copy)
  resumed = cli("t2t-lite-trainer", *NO_EVAL_FLAGS, f"--output_dir={copy}",
                "--train_steps=5", check=True)
  assert "resumed from" in resumed.stderr and "update 4, micro-step 8" in resumed.stderr
  assert "update 5/5 (micro-step 10)" in resumed.stderr
  assert "trained 5 updates (10 micro-steps)" in resumed.stdout


def test_xla_compile_continues_a_run(tiny_run, tmp_path):
  """A run trained without XLA resumes with --xla_compile only when told that its batches
  change (XLA's are planned in buckets, one shape each); the compiled passes train on."""
  copy = str(tmp_path / "run")
  shutil.copytree(tiny_run["output_dir"], copy)
  refused = cli("t2t-lite-trainer", *NO_EVAL_FLAGS, f"--output_dir={copy}", "--train_steps=5",
                "--xla_compile")
  assert refused.returncode == 2 and refused.stderr.strip().splitlines()[-1] == (
      f"t2t-lite-trainer: error: {copy} was trained without --xla_compile, which plans its "
      "training batches by tokens; resume it without the flag, or pass --allow_stream_change "
      "to go on with the other plan's batches"), refused.stderr[-2000:]
  resumed = cli("t2t-lite-trainer", *NO_EVAL_FLAGS, f"--output_dir={copy}",
                "--train_steps=5", "--xla_compile", "--allow_stream_change", check=True)
  assert "XLA: forward and backward pass compiled once per batch shape" in resumed.stdout
  assert "resumed from" in resumed.stderr and "update 4, micro-step 8" in resumed.stderr
  assert "--xla_compile re-planned the training stream: an epoch has" in resumed.stderr
  loss = lambda stderr, at: float(next(  # noqa: E731
      line for line in stderr.splitlines() if f"update {at} (micro-step" in line
  ).split("loss ")[1].split(",")[0])
  # the compiled pass trains on from where the plain one stopped: no jump in the loss
  assert abs(loss(resumed.stderr, "5/5") - loss(tiny_run["first"].stderr, "4/4")) < 0.5
  assert "trained 5 updates (10 micro-steps)" in resumed.stdout


def test_resume_with_other_hparams_is_refused(tiny_run):
  output_dir = tiny_run["output_dir"]
  flags = [f for f in TINY_FLAGS if not f.startswith("--hparams=")]
  changed = cli("t2t-lite-trainer", *flags, f"--output_dir={output_dir}", "--train_steps=9",
                "--hparams=batch_size=1024")
  assert changed.returncode == 2
  assert "was trained with other values: batch_size=1024 (recorded 512)" in changed.stderr
  other_set = cli("t2t-lite-trainer", "--hparams_set=transformer_small",
                  f"--output_dir={output_dir}", "--train_steps=9")
  assert other_set.returncode == 2
  assert "was trained with --hparams_set=transformer_tiny, not transformer_small" in \
      other_set.stderr
  assert "--allow_hparams_change" in other_set.stderr


def _fake_steps(trainer, monkeypatch, stats, limit=300):
  """Replaces the learner's step by one whose every update has the outcome `stats` (finite,
  overflow), and its window by what the device would count of those updates."""
  calls, unread = [], []
  consecutive = [0]

  def step(batch, flags):
    calls.append(1)
    unread.append(1)
    assert len(calls) < limit, "the loop never checked its stop conditions"
    return {}

  def read_window():
    nonfinite = not stats["finite"] and not stats["overflow"]
    tried = len(unread)
    unread.clear()
    consecutive[0] = consecutive[0] + tried if nonfinite else 0
    return {"updates_done": 0, "micro_step": len(calls), "attempts": tried, "updates": 0,
            "skipped": tried if nonfinite else 0, "overflows": 0 if nonfinite else tried,
            "consecutive": consecutive[0], "last_skip_update": 1,
            "last_skip_micro_step": len(calls), "loss": 0.0, "tokens": 0.0,
            "learning_rate": 0.0, "grad_norm": 0.0, "padding": 0.0, "slots": 0.0,
            "diverged": int(nonfinite and consecutive[0] >= 5), "diverged_update": 1,
            "diverged_from": 0, "diverged_to": len(calls), "float16_due": 0,
            "diverged_loss": 0.0, "diverged_mean": 0.0}
  monkeypatch.setattr(trainer.learner, "step", step)
  monkeypatch.setattr(trainer.learner, "read_window", read_window)
  return calls


def test_time_budget_stops_a_run_of_skipped_float16_updates(multi30k_data, tmp_path,
                                                              monkeypatch):
  trainer = make_trainer(tmp_path / "run", multi30k_data, train_steps=5, accumulate_steps=1,
                         stopping=Stopping(train_minutes=0.0005))
  overflow = {"finite": False, "overflow": True}
  _fake_steps(trainer, monkeypatch, overflow, limit=5000)
  monkeypatch.setattr(trainer.learner, "loss_scale", tf.Variable(1.0), raising=False)
  result = trainer.train()
  assert result["stop_reason"] == "time budget of 0.0005 minutes reached"
  assert result["updates"] == 0


def test_overflows_at_the_minimum_scale_stop_a_diverging_run(multi30k_data, tmp_path,
                                                              monkeypatch):
  from t2t_lite.core.errors import RunError
  trainer = make_trainer(tmp_path / "run", multi30k_data, train_steps=50, accumulate_steps=1)
  trainer.hparams.divergence_max_recoveries = 0  # (tests/test_recovery.py: with recoveries)
  # what the learner reports for an overflow it cannot absorb (see test_mixed_precision)
  calls = _fake_steps(trainer, monkeypatch, {"finite": False, "overflow": False})
  with pytest.raises(RunError, match="5 updates in a row had a non-finite loss"):
    trainer.train()
  assert len(calls) == trainer.hparams.max_consecutive_nonfinite == 5


def test_a_stop_signal_is_seen_after_skipped_updates(multi30k_data, tmp_path, monkeypatch):
  import signal as signals
  trainer = make_trainer(tmp_path / "run", multi30k_data, train_steps=50, accumulate_steps=1)
  calls = _fake_steps(trainer, monkeypatch, {"finite": False, "overflow": True})
  monkeypatch.setattr(trainer.learner, "loss_scale", tf.Variable(1.0), raising=False)
  trainer.faults.after_micro_step = lambda micro_step, request_stop: (
      request_stop(signals.SIGTERM) if micro_step == 3 else None)
  result = trainer.train()
  assert result["stop_reason"] == f"signal {int(signals.SIGTERM)}" and len(calls) == 3


def test_dev_loss_has_no_label_smoothing_and_perplexity_is_its_exponential(multi30k_data,
                                                                           tmp_path):
  import math
  from t2t_lite.data import eval_input
  hparams = tiny_hparams()
  assert hparams.label_smoothing == 0.1
  options = RunOptions(output_dir=str(tmp_path / "run"), data_dir=multi30k_data,
                       evaluation=Evaluation(frequency=1, steps=3, bleu_sentences=0))
  trainer = Trainer(hparams, registry.problem("translate_ende_multi30k"),
                    run_steps(hparams, 1, 1), options)
  results = trainer.evaluator.evaluate(0)
  trainer.evaluator.flush()
  model = trainer.learner.model
  nll = smoothed = tokens = 0.0
  for batch in eval_input.eval_dataset(trainer.evaluator.dev_files, trainer.hparams).take(3):
    logits = model(batch["inputs"], batch["targets"])
    weights = tf.cast(batch["targets"] > 0, tf.float32)
    nll += float(tf.reduce_sum(weights * tf.nn.sparse_softmax_cross_entropy_with_logits(
        batch["targets"], logits)))
    smoothed += float(model.loss(batch["inputs"], batch["targets"])[0])
    tokens += float(tf.reduce_sum(weights))
  assert results["dev_loss"] == pytest.approx(nll / tokens, rel=1e-5)
  assert abs(smoothed / tokens - nll / tokens) > 0.05  # the training loss differs
  assert results["dev_perplexity"] == pytest.approx(math.exp(nll / tokens), rel=1e-5)
  evaluation = _scalars(os.path.join(str(tmp_path / "run"), "eval"))
  assert "dev_perplexity" in evaluation


def test_no_device_read_between_log_lines(multi30k_data, tmp_path):
  """The loop queues micro-step after micro-step: what it reports is read from the device
  only at log lines (and at the end), once."""
  from benchmarks.training import host_reads_by_update
  hparams = tiny_hparams(optimizer_multistep_accumulate_steps=2)
  options = RunOptions(output_dir=str(tmp_path / "run"), data_dir=multi30k_data, seed=11,
                       evaluation=Evaluation(frequency=0), log_every=3,
                       checkpointing=Checkpointing(save_steps=0))
  reads, trainer = host_reads_by_update(lambda hook: Trainer(
      hparams, registry.problem("translate_ende_multi30k"), run_steps(hparams, 1, 8), options,
      after_update=hook))
  # Updates 2-7 are counted (the first holds the restore and first traces, the last the
  # stop's save): 3 and 6 log.
  assert reads["between_log_lines"] == [0, 0, 0, 0], reads
  assert len(reads["log_lines"]) == 2 and min(reads["log_lines"]) >= 1, reads
  window = trainer.learner.read_window()
  assert window["updates_done"] == 8 and window["micro_step"] == 16 and window["attempts"] == 0


def test_a_missing_bleu_tokenizer_is_refused_before_training(monkeypatch, tmp_path):
  """Dev BLEU of Japanese targets needs MeCab: refused when the run is set up, not at its
  first evaluation (which would lose the updates before it)."""
  import sys
  from t2t_lite.training.options import Stopping
  from t2t_lite.core.errors import UsageError
  from t2t_lite.training.evaluation import Evaluator
  monkeypatch.setitem(sys.modules, "MeCab", None)  # as if not installed
  with pytest.raises(UsageError, match=r"dev_bleu during training: BLEU for Japanese targets "
                     r"needs .*; or evaluate without it \(--eval_metrics without dev_bleu\)"):
    Evaluator(None, tiny_hparams(), None, [], str(tmp_path), Evaluation(bleu_sentences=8),
              Stopping(), target_lang="ja")
  assert not os.listdir(tmp_path)
  Evaluator(None, tiny_hparams(), None, [], str(tmp_path), Evaluation(bleu_sentences=0),
            Stopping(), target_lang="ja")  # no BLEU, no tokenizer needed


def test_start_up_reads_the_manifest_and_the_run_record_once(tiny_run, tmp_path):
  """Resuming a run for one more update, with an evaluation at its end: the data's manifest
  is read once (everything of the data comes from that snapshot, the evaluation's dev files
  included) and the run record once."""
  import sys
  run = tmp_path / "run"
  shutil.copytree(tiny_run["output_dir"], run)
  flags = [flag for flag in TINY_FLAGS if not flag.startswith("--local_eval_frequency")]
  result = forkserver.run(
      [sys.executable, os.path.join(REPO, "tests", "startup_reads.py"), *flags,
       "--local_eval_frequency=5", f"--data_dir={tiny_run['data_dir']}", f"--output_dir={run}",
       "--train_steps=5"], timeout=300, cwd=REPO)
  assert result.returncode == 0, result.stderr[-3000:]
  assert "trained 5 updates" in result.stdout and "eval at update 5" in result.stderr
  assert json.loads(result.stdout.strip().splitlines()[-1]) == {"manifest": 1, "record": 1}
