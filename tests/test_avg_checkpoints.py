"""t2t-lite-avg-checkpoints never touches the run it reads, and replaces its output whole."""

import hashlib
import os
import shutil

import numpy as np
import pytest
import tensorflow as tf

from conftest import cli


def _digest(directory):
  """sha256 of every file under `directory`, by relative path."""
  found = {}
  for root, _, files in os.walk(directory):
    for name in files:
      path = os.path.join(root, name)
      with open(path, "rb") as f:
        found[os.path.relpath(path, directory)] = hashlib.sha256(f.read()).hexdigest()
  return found


@pytest.fixture
def run_copy(tiny_run, tmp_path):
  run = str(tmp_path / "run")
  shutil.copytree(tiny_run["output_dir"], run)
  return run


@pytest.mark.parametrize("avg, where", [("", "is"), ("avg", "is inside"), ("..", "contains")])
def test_avg_dir_overlapping_the_run_is_refused_and_the_run_is_untouched(run_copy, avg, where):
  before = _digest(run_copy)
  avg_dir = os.path.join(run_copy, avg) if avg else run_copy
  result = cli("t2t-lite-avg-checkpoints", f"--output_dir={run_copy}", f"--avg_dir={avg_dir}")
  assert result.returncode == 2, result.stderr
  assert f"--avg_dir={avg_dir} {where} --output_dir={run_copy}" in result.stderr
  assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr
  assert _digest(run_copy) == before


def test_a_foreign_directory_is_not_overwritten(run_copy, tmp_path):
  other = tmp_path / "other"
  other.mkdir()
  (other / "notes.txt").write_text("keep me")
  result = cli("t2t-lite-avg-checkpoints", f"--output_dir={run_copy}", f"--avg_dir={other}")
  assert result.returncode == 2
  assert "is not empty and was not written by t2t-lite-avg-checkpoints" in result.stderr
  assert os.listdir(other) == ["notes.txt"]


def test_an_earlier_average_is_replaced_whole(run_copy, tmp_path):
  before = _digest(run_copy)
  avg_dir = tmp_path / "avg"
  for count in (1, 2):
    cli("t2t-lite-avg-checkpoints", f"--output_dir={run_copy}",
        f"--num_last_checkpoints={count}", f"--avg_dir={avg_dir}", check=True)
  assert sorted(os.listdir(avg_dir)) == ["averaged.json", "checkpoint",
                                         "ckpt-8.data-00000-of-00001",
                                         "ckpt-8.index", "hparams.json"]
  assert not [p for p in os.listdir(tmp_path) if ".tmp-" in p or ".old-" in p]
  assert '"checkpoints"' in (avg_dir / "averaged.json").read_text()
  assert (avg_dir / "averaged.json").read_text().count("ckpt-") == 2
  assert _digest(run_copy) == before
  # The averaged directory is self-contained: it still loads when moved.
  moved = tmp_path / "moved"
  os.rename(avg_dir, moved)
  assert tf.train.latest_checkpoint(str(moved)).endswith("ckpt-8")


def test_a_checkpoint_rotated_away_while_reading_means_starting_again(run_copy, tmp_path,
                                                                       monkeypatch):
  """As a run still training does: while ckpt-4 is read, a newer one is saved and ckpt-4
  deleted. Averaging starts again with the newest two."""
  from t2t_lite.cli import avg_checkpoints
  real, calls = avg_checkpoints._read_weights, []

  def rotating(model, path, weights):
    calls.append(os.path.basename(path))
    if len(calls) == 1:
      for name in os.listdir(run_copy):
        if name.startswith("ckpt-8."):
          shutil.copyfile(os.path.join(run_copy, name),
                          os.path.join(run_copy, name.replace("ckpt-8", "ckpt-12")))
        if name.startswith("ckpt-4."):
          os.remove(os.path.join(run_copy, name))
      tf.compat.v1.train.update_checkpoint_state(run_copy, "ckpt-12", ["ckpt-8", "ckpt-12"])
    return real(model, path, weights)

  monkeypatch.setattr(avg_checkpoints, "_read_weights", rotating)
  saved, paths = avg_checkpoints.average(run_copy, 2, str(tmp_path / "avg"))
  assert calls == ["ckpt-4", "ckpt-8", "ckpt-12"]
  assert [os.path.basename(p) for p in paths] == ["ckpt-8", "ckpt-12"]
  name = "model/embedding/.ATTRIBUTES/VARIABLE_VALUE"
  np.testing.assert_allclose(tf.train.load_checkpoint(saved).get_tensor(name),
                             tf.train.load_checkpoint(paths[0]).get_tensor(name), atol=1e-7)


def test_averaging_again_keeps_what_it_did_not_write(run_copy, tmp_path):
  """t2t-lite-translate-all writes its scores into an averaged directory: a new average
  would delete them, and is refused instead."""
  avg_dir = tmp_path / "avg"
  cli("t2t-lite-avg-checkpoints", f"--output_dir={run_copy}", "--num_last_checkpoints=1",
      f"--avg_dir={avg_dir}", check=True)
  (avg_dir / "eval_bleu").mkdir()
  (avg_dir / "eval_bleu" / "scored.json").write_text("{}")
  result = cli("t2t-lite-avg-checkpoints", f"--output_dir={run_copy}",
               "--num_last_checkpoints=2", f"--avg_dir={avg_dir}")
  assert result.returncode == 2, result.stderr
  assert ("holds an earlier average and files it did not write (eval_bleu), which a new "
          "average would delete") in result.stderr
  assert len(result.stderr.strip().splitlines()) == 1
  assert (avg_dir / "eval_bleu" / "scored.json").read_text() == "{}"


def test_every_reader_of_a_run_falls_back_to_its_checkpoints_without_a_state_file(run_copy,
                                                                                   tmp_path):
  """The `checkpoint` state file gone (a run copied without it, say): the decoder's and the
  exporter's newest checkpoint, warm start's and the averager's are the ckpt-N on disk, as
  the trainer's are (tests/test_run_record.py), not "no checkpoint"."""
  from t2t_lite.runs import checkpoints
  from t2t_lite.adapting.warm_start import source_checkpoint
  from t2t_lite.inference import translator
  from t2t_lite.cli import avg_checkpoints
  os.remove(os.path.join(run_copy, "checkpoint"))
  newest = os.path.join(run_copy, "ckpt-8")
  assert checkpoints.newest_first(run_copy) == [newest, os.path.join(run_copy, "ckpt-4")]
  assert translator.newest_checkpoint(run_copy) == newest  # decoder, exporter, translate
  assert source_checkpoint(run_copy) == newest
  _, paths = avg_checkpoints.average(run_copy, 2, str(tmp_path / "avg"))
  assert [os.path.basename(p) for p in paths] == ["ckpt-4", "ckpt-8"]


def test_checkpoints_the_state_file_lists_but_are_gone_are_not_offered(run_copy):
  """Deleted by hand, the state file's newest is skipped; with none left on disk, warm start
  says the folder holds no checkpoint (not TensorFlow's file-not-found)."""
  from t2t_lite.runs import checkpoints
  from t2t_lite.adapting.warm_start import source_checkpoint
  from t2t_lite.core.errors import UsageError
  for name in os.listdir(run_copy):
    if name.startswith("ckpt-8."):
      os.remove(os.path.join(run_copy, name))
  assert checkpoints.newest_first(run_copy) == [os.path.join(run_copy, "ckpt-4")]
  for name in os.listdir(run_copy):
    if name.startswith("ckpt-4."):
      os.remove(os.path.join(run_copy, name))
  with pytest.raises(UsageError, match="holds no checkpoint"):
    source_checkpoint(run_copy)
