"""What users do every week, through the real CLIs on the tiny model: early stopping,
checkpoints by time, interactive and n-best decoding, forced decoding (--score_file)."""

import json
import os
import subprocess

import numpy as np
import pytest
import tensorflow as tf

from conftest import BIN, NO_EVAL_FLAGS, TINY_FLAGS, TINY_HPARAMS, cli, popen

LINES = ["A man is riding a bike.", "", "Two dogs play in the snow near a red house.", "Kids."]


def _usage_error(result, message, program):
  assert result.returncode == 2, result.stderr
  lines = [line for line in result.stderr.splitlines() if line.strip()]
  assert len(lines) == 1 and lines[0].startswith(f"{program}: error:"), result.stderr
  assert message in lines[0], lines[0]


def _ends_in_usage_error(result, message, program="t2t-lite-trainer"):
  """Exit 2, the last line the error (TensorFlow may log its devices before it)."""
  assert result.returncode == 2, result.stderr[-3000:]
  assert "Traceback" not in result.stderr
  last = result.stderr.strip().splitlines()[-1]
  assert last.startswith(f"{program}: error:") and message in last, last


# --- training ----------------------------------------------------------------------------
def test_early_stopping_stops_keeps_the_best_and_resumes_stopped(multi30k_data, tmp_path):
  """Dev loss cannot improve by 100 nats: best at the first evaluation (update 1), then two
  updates without improvement stop a run of 10 at update 3; resumed, it stops at once."""
  output_dir = str(tmp_path / "run")
  args = [*TINY_FLAGS, f"--data_dir={multi30k_data}", f"--output_dir={output_dir}",
          "--train_steps=10", "--local_eval_frequency=1", "--eval_bleu_sentences=0",
          "--eval_early_stopping_steps=2", "--eval_early_stopping_metric_delta=100"]
  first = cli("t2t-lite-trainer", *args, check=True)
  assert "trained 3 updates (6 micro-steps)" in first.stdout, first.stdout
  assert ("early stopping: dev_loss has not improved by more than 100 for 2 updates (best "
          in first.stdout)
  with open(os.path.join(output_dir, "best", "best.json")) as f:
    best = json.load(f)
  # improved by more than 100 only at the first evaluation; the kept model is the one with
  # the lowest dev loss logged (a smaller improvement still makes a better model)
  losses = [float(line.split("dev_loss ")[1].split(",")[0])
            for line in first.stderr.splitlines() if "eval at update" in line]
  assert len(losses) == 3, first.stderr[-3000:]
  lines = first.stderr.splitlines()  # update 2 is saved (every 2), then evaluated (every 1)
  assert (next(i for i, line in enumerate(lines) if "ckpt-4 (update 2," in line)
          < next(i for i, line in enumerate(lines) if "eval at update 2:" in line))
  assert (best["metric"], best["improved_at"]) == ("dev_loss", 1)
  assert best["update"] == 1 + int(np.argmin(losses))
  assert best["value"] == pytest.approx(min(losses), abs=1e-4)
  assert os.path.basename(best["checkpoint"]) == f"ckpt-{best['update']}"
  again = cli("t2t-lite-trainer", *args, check=True)
  assert "trained 3 updates (6 micro-steps)" in again.stdout
  assert "early stopping: dev_loss has not improved" in again.stdout
  # Without early stopping the best model would be judged by dev BLEU: refused, not replaced.
  best_dir = os.path.join(output_dir, "best")
  kept = {name: open(os.path.join(best_dir, name), "rb").read() for name in os.listdir(best_dir)}
  other = cli("t2t-lite-trainer", *args[:-2], "--train_steps=12", "--eval_bleu_sentences=4")
  _ends_in_usage_error(other, "holds the best checkpoints by dev_loss and this run judges by "
                       "dev_bleu, which would replace them")
  assert kept == {name: open(os.path.join(best_dir, name), "rb").read()
                  for name in os.listdir(best_dir)}


@pytest.mark.parametrize("args, message", [
    (["--eval_early_stopping_metric_delta=1"],
     "--eval_early_stopping_metric_delta is read only with --eval_early_stopping_steps > 0"),
    (["--keep_best_checkpoints=3", "--local_eval_frequency=0"],
     "--keep_best_checkpoints is read only with evaluations"),
    (["--eval_metrics=dev_loss,blue"], "--eval_metrics: unknown metric 'blue'; known: "
     "dev_loss, dev_perplexity, dev_bleu, dev_chrf, dev_chrfpp, dev_ter"),
    (["--eval_metrics=dev_loss,dev_chrf", "--eval_bleu_sentences=0"],
     "--eval_metrics: dev_chrf decodes dev sentences, and --eval_bleu_sentences=0 decodes "
     "none"),
    (["--eval_metrics=dev_loss", "--eval_early_stopping_metric=dev_ter"],
     "--eval_early_stopping_metric=dev_ter is not among --eval_metrics=dev_loss; add it there"),
    (["--eval_early_stopping_steps=5", "--local_eval_frequency=0"],
     "--eval_early_stopping_steps needs evaluations: set --local_eval_frequency > 0"),
    (["--eval_early_stopping_steps=5", "--eval_early_stopping_metric=dev_bleu",
      "--eval_bleu_sentences=0"], "--eval_early_stopping_metric=dev_bleu is not among "
     "--eval_metrics=dev_loss,dev_perplexity"),
    (["--eval_early_stopping_metric=blue"], "--eval_early_stopping_metric=blue: choose one of "
     "dev_loss"),
])
def test_early_stopping_usage_errors(args, message, tmp_path):
  result = cli("t2t-lite-trainer", "--output_dir=" + str(tmp_path / "run"), *args)
  _usage_error(result, message, "t2t-lite-trainer")


def test_keeping_by_the_hour_needs_rotation(tmp_path):
  result = cli("t2t-lite-trainer", "--output_dir=" + str(tmp_path / "run"),
               "--keep_checkpoint_max=0", "--keep_checkpoint_every_n_hours=6")
  _usage_error(result, "--keep_checkpoint_every_n_hours keeps checkpoints that "
               "--keep_checkpoint_max rotates away", "t2t-lite-trainer")


def test_checkpoints_by_time_and_kept_by_the_hour(multi30k_data, tmp_path):
  """No step-based saves: the first update (its trace alone takes over 0.5 s) is saved by
  time; rotation (1 kept) would remove it, keep_checkpoint_every_n_hours keeps it on disk."""
  output_dir = str(tmp_path / "run")
  cli("t2t-lite-trainer", *NO_EVAL_FLAGS, f"--data_dir={multi30k_data}",
      f"--output_dir={output_dir}", "--train_steps=4",
      "--save_checkpoints_steps=0", "--save_checkpoints_secs=0.5", "--keep_checkpoint_max=1",
      "--keep_checkpoint_every_n_hours=0.0001", check=True)
  on_disk = sorted(int(name[5:-6]) for name in os.listdir(output_dir)
                   if name.startswith("ckpt-") and name.endswith(".index"))
  assert on_disk[0] == 2 and on_disk[-1] == 8, on_disk  # update 1 (micro-step 2) and the end
  state = tf.train.get_checkpoint_state(output_dir)
  assert [os.path.basename(p) for p in state.all_model_checkpoint_paths] == ["ckpt-8"]


# --- decoding ----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def nbest(tiny_run, tmp_path_factory):
  """The n-best file of LINES (beam 3), each sentence decoded alone."""
  directory = tmp_path_factory.mktemp("nbest")
  (directory / "in.txt").write_text("".join(line + "\n" for line in LINES))
  result = cli("t2t-lite-decoder", f"--output_dir={tiny_run['output_dir']}",
               "--decode_hparams=beam_size=3,batch_size=1,return_beams=true",
               f"--decode_from_file={directory / 'in.txt'}",
               f"--decode_to_file={directory / 'out.txt'}", check=True)
  assert "translated 3 lines (1 empty)" in result.stderr
  return (directory / "out.txt").read_text().split("\n")[:-1]


def test_return_beams_writes_the_nbest_with_scores(nbest):
  assert len(nbest) == len(LINES)
  for line, row in zip(LINES, nbest):
    fields = row.split("\t")
    assert len(fields) == 6, row
    texts, scores = fields[0::2], [float(s) for s in fields[1::2]]
    if not line:
      assert texts == [""] * 3 and scores == [0.0] * 3
    else:
      assert all(score < 0 for score in scores) and scores == sorted(scores, reverse=True)
      assert texts[0].strip()


def test_interactive_decoding_answers_each_line_as_it_comes(tiny_run, nbest):
  """Each line's translation arrives before the next line is written (a pipe, not a file),
  and equals the best of the n-best file (beam 3, each sentence decoded alone)."""
  process = popen(
      [os.path.join(BIN, "t2t-lite-decoder"), f"--output_dir={tiny_run['output_dir']}",
       "--decode_interactive", "--decode_hparams=beam_size=3"],
      stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  answers = []
  try:
    for line in LINES:
      process.stdin.write(line + "\n")
      process.stdin.flush()
      answers.append(process.stdout.readline().rstrip("\n"))
    process.stdin.close()
    assert process.wait(timeout=120) == 0, process.stderr.read()[-3000:]
  finally:
    process.kill()
  assert answers == [row.split("\t")[0] for row in nbest]


def _teacher_forced_sum(model, source_ids, target_ids):
  logits = model(tf.constant([source_ids]), tf.constant([target_ids]))
  log_probs = tf.nn.log_softmax(tf.cast(logits, tf.float32))[0].numpy()
  return float(sum(log_probs[t, token] for t, token in enumerate(target_ids)))


def test_score_file_gives_the_log_probability_of_each_pair(tiny_run, tmp_path):
  from t2t_lite.inference import translator
  pairs = [("A man is riding a bike.", "Ein Mann fährt Fahrrad."),
           ("Two dogs play in the snow near a red house.", "Zwei Hunde spielen im Schnee."),
           ("Kids.", "")]
  (tmp_path / "pairs.tsv").write_text("".join(f"{s}\t{t}\n" for s, t in pairs))
  result = cli("t2t-lite-decoder", f"--output_dir={tiny_run['output_dir']}",
               f"--score_file={tmp_path / 'pairs.tsv'}",
               f"--decode_to_file={tmp_path / 'scores.txt'}", check=True)
  assert "scored 3 lines" in result.stderr
  scores = [float(x) for x in (tmp_path / "scores.txt").read_text().split()]
  run = translator.load(tiny_run["output_dir"])
  expected = [_teacher_forced_sum(run.model, run.vocab.encode(s), run.vocab.encode(t))
              for s, t in pairs]
  np.testing.assert_allclose(scores, expected, atol=1e-4, rtol=0)
  assert all(score < 0 for score in scores)


@pytest.mark.parametrize("args, message", [
    (["--decode_interactive", "--decode_to_file=x"], "--decode_to_file is not written with "
     "--decode_interactive"),
    (["--decode_interactive", "--decode_from_file=x"], "--decode_interactive and "
     "--decode_from_file are different modes; give one"),
    (["--score_file=nowhere.tsv", "--decode_to_file=x"], "--score_file=nowhere.tsv does not "
     "exist"),
    (["--score_file={pairs}", "--decode_to_file=x"], "line 2 has 0 tabs; each line is "
     "source<TAB>target"),
    (["--score_file={pairs}", "--decode_to_file=x", "--decode_hparams=beam_size=2"],
     "beam_size is not read with --score_file"),
    ([], "--decode_from_file is required"),
])
def test_decoder_mode_usage_errors(args, message, tiny_run, tmp_path):
  pairs = tmp_path / "pairs.tsv"
  pairs.write_text("a\tb\nno tab here\n")
  result = cli("t2t-lite-decoder", f"--output_dir={tiny_run['output_dir']}",
               *[a.format(pairs=pairs) for a in args])
  _usage_error(result, message, "t2t-lite-decoder")


# --- fine-tuning -------------------------------------------------------------------------
def _values(path, prefix):
  reader = tf.train.load_checkpoint(path)
  return {name: reader.get_tensor(name) for name, _ in tf.train.list_variables(path)
          if name.startswith(prefix) and name.endswith("VARIABLE_VALUE")}


@pytest.mark.parametrize("with_optimizer", [False, True])
def test_warm_start_takes_the_weights_and_resets_the_rest(tiny_run, tmp_path, with_optimizer):
  """A new run (another seed) starts from tiny_run's newest weights exactly; Adam's slots
  are zero, or tiny_run's with --warm_start_optimizer; update and micro-step are 0."""
  from test_train import make_trainer
  source = tf.train.latest_checkpoint(tiny_run["output_dir"])
  trainer = make_trainer(tmp_path / "tuned", tiny_run["data_dir"], train_steps=1,
                         accumulate_steps=2, warm_start_from=tiny_run["output_dir"],
                         warm_start_optimizer=with_optimizer)
  assert trainer.restore() is False  # a new run
  learner = trainer.learner
  assert int(learner.update_step.numpy()) == 0 and int(learner.micro_step.numpy()) == 0
  weights, slots = _values(source, "model/"), _values(source, "optimizer/m_of/")
  assert len(weights) == len(learner.model.variables) and len(slots) == len(learner.adam.m)
  ours = tf.train.Checkpoint(model=learner.model, optimizer=learner.adam)
  saved = ours.write(str(tmp_path / "check" / "ckpt"))
  for name, value in _values(saved, "model/").items():
    np.testing.assert_array_equal(value, weights[name], err_msg=name)
  for name, value in _values(saved, "optimizer/m_of/").items():
    expected = slots[name] if with_optimizer else np.zeros_like(slots[name])
    np.testing.assert_array_equal(value, expected, err_msg=name)
  assert any(np.abs(v).max() > 0 for v in slots.values())  # the source's slots are not 0
  assert _values(saved, "optimizer/iterations")[
      "optimizer/iterations/.ATTRIBUTES/VARIABLE_VALUE"] == 0


def test_warm_start_of_another_shape_names_the_variables(tiny_run, tmp_path):
  result = cli("t2t-lite-trainer", *TINY_FLAGS, f"--hparams={TINY_HPARAMS},"
               "filter_size=96", f"--data_dir={tiny_run['data_dir']}",
               f"--output_dir={tmp_path / 'run'}", "--train_steps=1",
               f"--warm_start_from={tiny_run['output_dir']}")
  _ends_in_usage_error(result, "variable(s) do not match this model: model/decoder/")
  assert "!= ours [" in result.stderr and "warm start needs the same model shapes" in result.stderr
  assert not os.path.exists(tmp_path / "run" / "checkpoint")
  assert not os.path.exists(tmp_path / "run" / "hparams.json")


@pytest.mark.parametrize("args, message", [
    (["--cpu_replicas=2"], "--cpu_replicas is read only with --strategy=mirrored"),
    (["--local_eval_frequency=0", "--eval_bleu_sentences=50"],
     "--eval_bleu_sentences is read only with evaluations (--local_eval_frequency > 0)"),
    (["--local_eval_frequency=0", "--eval_beam_size=4"],
     "--eval_beam_size is read only with evaluations"),
])
def test_flags_that_would_be_ignored_are_refused(args, message, tmp_path):
  result = cli("t2t-lite-trainer", f"--output_dir={tmp_path / 'run'}",
               f"--data_dir={tmp_path / 'data'}", *args)
  _usage_error(result, message, "t2t-lite-trainer")
  assert not os.path.exists(tmp_path / "run")


def test_the_decoder_refuses_to_write_over_its_source(tiny_run, tmp_path):
  source = tmp_path / "test.en"
  source.write_text("A man rides a bike.\n")
  result = cli("t2t-lite-decoder", f"--output_dir={tiny_run['output_dir']}",
               f"--decode_from_file={source}", f"--decode_to_file={tmp_path}/./test.en")
  _usage_error(result, "is --decode_from_file, which it would overwrite", "t2t-lite-decoder")
  assert source.read_text() == "A man rides a bike.\n"
