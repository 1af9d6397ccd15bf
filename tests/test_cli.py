"""The real t2t-lite-trainer in a subprocess: dry-run figures, usage errors and exit codes."""

import pytest

from conftest import cli


def test_dry_run_prints_the_step_arithmetic():
  result = cli("t2t-lite-trainer", "--hparams_set=transformer_base_fake_gpu8",
               "--hparams=batch_size=2048", "--train_steps=100", "--dry_run", check=True,
               fresh=True)
  out = result.stdout
  assert "batch_size per replica and micro-step: 2048 tokens" in out
  assert "accumulate steps (micro-steps per update): 8" in out
  assert "replicas: 1" in out
  assert "tokens per update: 16384 (= 2048 x 8 x 1)" in out
  assert "updates (--train_steps): 100" in out
  assert "micro-steps: 800 (= 100 x 8)" in out
  # 8000-piece Multi30k vocabulary: 4,096,000 embedding + 44,103,680 others.
  assert "parameters: 48,199,680 (183.9 MiB float32)" in out
  assert "Adam slots: 367.7 MiB; accumulators: 183.9 MiB" in out
  assert "  optimizer_multistep_accumulate_steps = 8" in out
  assert result.stderr.count("\n") < 5, "TensorFlow start-up noise leaked: " + result.stderr


def test_dry_run_of_single_step_set_has_no_accumulators_and_states_the_moving_average():
  out = cli("t2t-lite-trainer", "--hparams_set=transformer_base", "--train_steps=7",
            "--hparams=ema_decay=0.99,frozen_parts=encoder", "--dry_run", check=True).stdout
  assert "tokens per update: 4096 (= 4096 x 1 x 1)" in out
  assert "micro-steps: 7 (= 7 x 1)" in out
  assert "accumulators: 0.0 MiB (none with accumulate steps 1)" in out
  # frozen parts have no moving average (and no Adam slots or accumulators)
  assert "parameters: 48,199,680 (183.9 MiB float32); 29,296,640 train" in out, out
  assert ("moving average of the weights: 111.8 MiB (decay 0.99 per 25000 target tokens)"
          in out)


@pytest.mark.parametrize("args, message", [
    (["--hparams=batch_sise=2048"], "unknown hparam 'batch_sise'; did you mean batch_size?"),
    (["--hparams=batch_size=2.5"], "hparam 'batch_size' is int; cannot set it to '2.5'"),
    (["--hparams=batch_size"], "malformed --hparams entry 'batch_size'"),
    (["--hparams_set=transformer_bass"], "unknown hparams set 'transformer_bass'; did you mean "
                                         "transformer_base"),
    (["--problem=translate_ende_multi30"], "did you mean translate_ende_multi30k"),
    (["--model=transfomer"], "unknown model 'transfomer'; did you mean transformer"),
    (["--train_steps=0"], "--train_steps=0: must be at least 1"),
    (["--hparams=optimizer_multistep_accumulate_steps=0"],
     "optimizer_multistep_accumulate_steps=0: must be at least 1"),
    (["--hparams=batch_size=100"], "batch_size=100 tokens cannot hold one sequence of "
                                   "max_length=128"),
    (["--hparams=learning_rate_schedule=constant*cosine"], "unknown factor 'cosine'"),
    (["--no_such_flag=1"], "Unknown command line flag 'no_such_flag'"),
    (["--train_steps=many"], "--train_steps"),
    (["--allow_stream_change"], "--allow_stream_change is read only when resuming a run"),
    (["--hparams=length_bucket_step=1.5"], "--hparams length_bucket_step: the training batches "
                                          "are planned in length buckets only with "
                                          "--xla_compile"),
    (["--hparams=min_length_bucket=16"], "pass --xla_compile, or drop min_length_bucket"),
])
def test_usage_errors_exit_2_with_one_line(tmp_path, args, message):
  output_dir = tmp_path / "run"
  result = cli("t2t-lite-trainer", f"--output_dir={output_dir}", "--data_dir=nowhere", *args)
  assert result.returncode == 2, result.stderr
  assert message in result.stderr
  lines = [line for line in result.stderr.splitlines() if line.strip()]
  assert len(lines) == 1 and lines[0].startswith("t2t-lite-trainer: error:"), result.stderr
  assert "Traceback" not in result.stderr
  assert not output_dir.exists(), "a usage error must not create the output directory"


def test_missing_data_is_a_usage_error(tmp_path):
  result = cli("t2t-lite-trainer", f"--output_dir={tmp_path / 'run'}",
               f"--data_dir={tmp_path / 'empty'}", "--train_steps=1")
  assert result.returncode == 2
  assert "no prepared data for problem translate_ende_multi30k" in result.stderr
  assert "run t2t-lite-datagen" in result.stderr
  assert not (tmp_path / "run").exists()


def test_unwritable_output_dir(tmp_path):
  blocker = tmp_path / "a_file"
  blocker.write_text("not a directory")
  result = cli("t2t-lite-trainer", f"--output_dir={blocker}/run", "--data_dir=x")
  assert result.returncode == 2
  assert f"--output_dir={blocker}/run is not writable" in result.stderr


def test_debug_flag_shows_the_traceback():
  result = cli("t2t-lite-trainer", "--hparams=batch_sise=1", "--dry_run", "--debug")
  assert result.returncode == 2
  assert "Traceback" in result.stderr and "did you mean batch_size" in result.stderr


def test_registry_help_lists_everything():
  out = cli("t2t-lite-trainer", "--registry_help", check=True).stdout
  for name in ("transformer_base", "transformer_base_fake_gpu8", "transformer_multi30k_cpu",
               "translate_ende_multi30k", "translate_ende_wmt14", "translate_folder",
               "transformer"):
    assert name in out
