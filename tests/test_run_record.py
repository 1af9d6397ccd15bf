"""A run knows its data and its checkpoints: what it trained on is recorded and compared, and
checkpoints are found and named, never overwritten by a fresh start."""

import json
import os
import shutil

import pytest

from conftest import cli, vocab_path
from t2t_lite.runs import rundir


@pytest.fixture
def run_copy(tiny_run, tmp_path):
  run = str(tmp_path / "run")
  shutil.copytree(tiny_run["output_dir"], run)
  return run


@pytest.fixture
def other_vocabulary(tiny_run, tmp_path):
  """A copy of the run's data whose vocabulary file differs (in content, not in size)."""
  data_dir = str(tmp_path / "other_data")
  shutil.copytree(tiny_run["data_dir"], data_dir)
  vocab = vocab_path(data_dir)
  with open(vocab, "ab") as f:
    f.write(b"\n")
  return data_dir


def _one_line_error(result, message, program):
  assert result.returncode == 2, result.stderr[-3000:]
  assert "Traceback" not in result.stderr
  last = result.stderr.strip().splitlines()[-1]
  assert last.startswith(f"{program}: error: ") and message in last, last
  return last


def test_the_run_records_problem_languages_vocabulary_and_seed(tiny_run):
  import hashlib
  with open(os.path.join(tiny_run["output_dir"], "hparams.json")) as f:
    meta = json.load(f)
  with open(vocab_path(tiny_run["data_dir"]),
            "rb") as f:
    digest = hashlib.sha256(f.read()).hexdigest()
  assert meta["data"] == {"problem": "translate_ende_multi30k", "source_lang": "en",
                          "target_lang": "de", "vocab_sha256": digest,
                          "subword_sampling": None}
  assert meta["random_seed"] == 7  # TINY_FLAGS


def test_another_vocabulary_is_refused_by_resume_decode_and_export(
    run_copy, other_vocabulary, tmp_path):
  message = "was trained with another vocabulary (sha256 "
  resumed = cli("t2t-lite-trainer", f"--output_dir={run_copy}",
                f"--data_dir={other_vocabulary}", "--train_steps=5")
  last = _one_line_error(resumed, message, "t2t-lite-trainer")
  assert other_vocabulary in last
  source = tmp_path / "source.en"
  source.write_text("A man rides a bike.\n")
  decoded = cli("t2t-lite-decoder", f"--output_dir={run_copy}",
                f"--data_dir={other_vocabulary}", f"--decode_from_file={source}",
                f"--decode_to_file={tmp_path / 'out.de'}")
  _one_line_error(decoded, message, "t2t-lite-decoder")
  exported = cli("t2t-lite-exporter", f"--output_dir={run_copy}",
                 f"--data_dir={other_vocabulary}", f"--export_dir={tmp_path / 'export'}")
  _one_line_error(exported, message, "t2t-lite-exporter")
  assert not os.path.exists(tmp_path / "export")


def test_a_run_resumes_only_on_the_subword_sampling_it_was_trained_on(tiny_run, run_copy,
                                                                     tmp_path):
  """Data made again with subword sampling keeps the vocabulary (the same seeded sample;
  test_data's test of sampled data made again shows it) but not the stream the run reads: the
  run trained on one segmentation is refused on it (its data stream would not continue), and
  a new run would record the sampling. The sampled data is this data's manifest saying so,
  with a sampled split (the one best's files: only the manifest is read before the
  refusal)."""
  data_dir = tmp_path / "sampled"
  shutil.copytree(tiny_run["data_dir"], data_dir)
  path = data_dir / "translate_ende_multi30k.manifest.json"
  manifest = json.loads(path.read_text())
  manifest["settings"]["subword_sampling"] = {"copies": 2, "alpha": 0.3}
  manifest["splits"]["train_sampled"] = manifest["splits"]["train"]
  path.write_text(json.dumps(manifest))
  resumed = cli("t2t-lite-trainer", f"--output_dir={run_copy}", f"--data_dir={data_dir}",
                "--train_steps=5")
  last = _one_line_error(resumed, "was trained on one segmentation of each training pair, but "
                         f"{data_dir} holds 2 sampled segmentations at alpha 0.3; resume it on "
                         "the data it was trained on", "t2t-lite-trainer")
  assert "start a new run" in last
  from t2t_lite.core import registry
  from t2t_lite.runs import rundir
  record = rundir.data_record(registry.problem("translate_ende_multi30k").snapshot(
      str(data_dir)))
  assert record["subword_sampling"] == {"copies": 2, "alpha": 0.3}  # what a new run records


def test_resume_takes_problem_and_seed_from_the_run_and_refuses_others(run_copy):
  seed = cli("t2t-lite-trainer", f"--output_dir={run_copy}", "--random_seed=3",
             "--train_steps=5")
  _one_line_error(seed, "was trained with --random_seed=7, not 3; drop --random_seed",
                  "t2t-lite-trainer")
  problem = cli("t2t-lite-trainer", f"--output_dir={run_copy}",
                "--problem=translate_ende_wmt14", "--train_steps=5")
  _one_line_error(problem, "was trained with --problem=translate_ende_multi30k, not "
                  "translate_ende_wmt14", "t2t-lite-trainer")


def test_checkpoints_without_a_state_file_are_resumed_not_overwritten(run_copy):
  """Checkpoints copied without TensorFlow's `checkpoint` file: the newest ckpt-N on disk
  is restored (the run resumes at update 4), with the seed recorded by the run (no
  --random_seed given)."""
  os.remove(os.path.join(run_copy, "checkpoint"))
  result = cli("t2t-lite-trainer", f"--output_dir={run_copy}", "--train_steps=5",
               "--local_eval_frequency=0", check=True)
  assert "has checkpoints but no readable checkpoint state file" in result.stderr
  assert "resumed from" in result.stderr and "ckpt-8: update 4, micro-step 8" in result.stderr
  assert "trained 5 updates (10 micro-steps)" in result.stdout
  with open(os.path.join(run_copy, "hparams.json")) as f:  # what the resumed run trained with
    assert json.load(f)["random_seed"] == 7  # the run's (TINY_FLAGS), not the flag's default


def test_a_checkpoint_of_another_shape_is_named_not_called_damaged(run_copy):
  result = cli("t2t-lite-trainer", f"--output_dir={run_copy}", "--train_steps=5",
               "--allow_hparams_change", "--hparams=filter_size=96")
  last = _one_line_error(result, "with filter_size=96 (recorded 512): the checkpoint's "
                         "variables have other shapes; start a new --output_dir",
                         "t2t-lite-trainer")
  assert "damaged" not in last
  # a record that says 96 beside a checkpoint of 512: the checkpoint is named, not damaged
  meta = rundir.read_meta(str(run_copy))
  meta["hparams"]["filter_size"] = 96
  rundir.write_meta(str(run_copy), meta)
  result = cli("t2t-lite-trainer", f"--output_dir={run_copy}", "--train_steps=5")
  last = _one_line_error(result, "is of another model shape (model/", "t2t-lite-trainer")
  assert "!= ours" in last and "damaged" not in last


def test_a_resumed_run_keeps_the_time_budget_it_recorded(tiny_run):
  """A budget counts the run's training time: resumed without --train_minutes, a run goes on
  with the budget it recorded (without one its cooldown's end would be fixed at the default
  --train_steps); given, the flag wins; a record from before budgets were recorded has none."""
  from t2t_lite.core import older_formats
  assert rundir.read_meta(tiny_run["output_dir"])["train_minutes"] == 0.0
  recorded = older_formats.run_record({"hparams": {}, "train_minutes": 25.0})
  assert rundir.train_minutes(recorded, None) == 25.0
  assert rundir.train_minutes(recorded, 30.0) == 30.0 and rundir.train_minutes(recorded, 0.0) == 0
  older = older_formats.run_record({"hparams": {}})
  assert older["train_minutes"] is None and rundir.train_minutes(older, None) == 0.0
  assert rundir.train_minutes(None, None) == 0.0
