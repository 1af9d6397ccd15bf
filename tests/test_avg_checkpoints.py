"""t2t-lite-avg-checkpoints never touches the run it reads, and replaces its output whole."""

import hashlib
import json
import os
import shutil
import sys

import numpy as np
import pytest
import tensorflow as tf

import forkserver
from conftest import cli

TESTS = os.path.dirname(os.path.abspath(__file__))
EMBEDDING = "model/embedding/.ATTRIBUTES/VARIABLE_VALUE"


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


# --- a kept best checkpoint evicted while --best reads it ---------------------------------
def _best_folder(run):
  """RUN/best (the run's one replaced) as the trainer keeps 3 (--keep_best_checkpoints=3):
  ckpt-10, ckpt-20 and ckpt-30, the run's newest weights times 1, 2 and 3, written by
  best.BestCheckpoints."""
  from t2t_lite.core import registry
  from t2t_lite.inference import translator
  from t2t_lite.runs import rundir
  from t2t_lite.training import best
  hparams, meta = rundir.model_from_run(run)
  model = registry.model(hparams.model)(hparams, meta["vocab_size"])
  translator.restore(model, os.path.join(run, "ckpt-8"), "raw")
  weights = [v.numpy() for v in model.trainable_variables]
  shutil.rmtree(os.path.join(run, "best"))
  kept = best.BestCheckpoints(os.path.join(run, "best"), "dev_loss", lower_is_better=True,
                              keep=3, weights="raw")
  for update in (10, 20, 30):
    for variable, value in zip(model.trainable_variables, weights):
      variable.assign(value * (update // 10))
    kept.record(update, {"dev_loss": 10.0 - update / 10}, model)


def _evict(path, then=None):
  """What the trainer does to a kept checkpoint it evicts: best.json rewritten without it,
  then its files deleted, here the data before the index; `then()` (if given) runs between
  the two, and the index goes even if it fails."""
  from t2t_lite.core import files
  folder, name = os.path.split(path)
  record_path = os.path.join(folder, "best.json")
  with open(record_path) as f:
    record = json.load(f)
  record["kept"] = [entry for entry in record["kept"] if entry["checkpoint"] != name]
  files.write_atomic(record_path, json.dumps(record, indent=2))
  for data in (n for n in os.listdir(folder) if n.startswith(f"{name}.data-")):
    os.remove(os.path.join(folder, data))
  try:
    return then() if then is not None else None
  finally:
    os.remove(path + ".index")


def _evicting(real, when):
  """`_read_weights` of the averager, but the first time `when` comes the checkpoint is
  evicted: "while read" (the first one read, its data gone, its index there, as it is
  opened) or "after read" (the newest, once its weights were read)."""
  done = []

  def read(model, path, weights):
    if not done and when == "while read":
      done.append(path)
      return _evict(path, then=lambda: real(model, path, weights))
    result = real(model, path, weights)
    if not done and when == "after read" and path.endswith("ckpt-30"):
      done.append(path)
      _evict(path)
    return result
  return read


def _mean(run, names):
  return np.mean([tf.train.load_checkpoint(os.path.join(run, "best", name)).get_tensor(
      EMBEDDING) for name in names], axis=0)


@pytest.mark.parametrize("when, left", [("while read", ["ckpt-20", "ckpt-30"]),
                                        ("after read", ["ckpt-10", "ckpt-20"]),
                                        ("after best.json was read", ["ckpt-20", "ckpt-30"])])
def test_a_best_checkpoint_evicted_while_averaging_means_averaging_those_kept_now(
    run_copy, tmp_path, monkeypatch, when, left):
  """The trainer rewrites best.json without the checkpoint it evicts, then deletes its files:
  whenever that falls, the averager reads best.json again and averages the ones it keeps."""
  from t2t_lite.cli import avg_checkpoints
  from t2t_lite.training import best
  _best_folder(run_copy)
  expected = _mean(run_copy, left)
  if when == "after best.json was read":
    real, done = best.read, []

    def evicting_read(directory):
      state, paths = real(directory)
      if not done:
        done.append(directory)
        _evict(os.path.join(directory, "ckpt-10"))
      return state, paths
    monkeypatch.setattr(best, "read", evicting_read)
  else:
    monkeypatch.setattr(avg_checkpoints, "_read_weights",
                        _evicting(avg_checkpoints._read_weights, when))
  saved, paths = avg_checkpoints.average(run_copy, 5, str(tmp_path / "avg"), best_of=0)
  assert [os.path.basename(p) for p in paths] == left
  np.testing.assert_allclose(tf.train.load_checkpoint(saved).get_tensor(EMBEDDING), expected,
                             rtol=1e-6)
  assert not np.allclose(expected, _mean(run_copy, ["ckpt-20"]))  # (the three differ)
  with open(tmp_path / "avg" / "averaged.json") as f:
    assert [os.path.basename(p) for p in json.load(f)["checkpoints"]] == left


def test_the_command_averages_the_best_kept_after_an_eviction_while_it_reads(run_copy,
                                                                            tmp_path):
  _best_folder(run_copy)
  expected = _mean(run_copy, ["ckpt-20", "ckpt-30"])
  script = tmp_path / "evicting_average.py"
  script.write_text(
      "import sys\n"
      "sys.path.insert(0, sys.argv.pop(1))  # the tests directory\n"
      "from t2t_lite.cli import avg_checkpoints\n"
      "from test_avg_checkpoints import _evicting\n"
      "avg_checkpoints._read_weights = _evicting(avg_checkpoints._read_weights, 'while read')\n"
      "avg_checkpoints.run()\n")
  avg_dir = tmp_path / "avg"
  result = forkserver.run([sys.executable, str(script), TESTS, f"--output_dir={run_copy}",
                           "--best", f"--avg_dir={avg_dir}"], timeout=300)
  assert result.returncode == 0, result.stderr[-3000:]
  assert "averaged 2 best checkpoints (ckpt-20, ckpt-30; raw weights)" in result.stdout
  assert "ckpt-10 vanished while being read" in result.stderr
  np.testing.assert_allclose(tf.train.load_checkpoint(
      tf.train.latest_checkpoint(str(avg_dir))).get_tensor(EMBEDDING), expected, rtol=1e-6)


def test_a_best_checkpoint_deleted_but_still_listed_is_named(run_copy, tmp_path, monkeypatch):
  """Deleted while read and best.json unchanged (not the trainer): no new list to take."""
  from t2t_lite.cli import avg_checkpoints
  from t2t_lite.core.errors import UsageError
  _best_folder(run_copy)
  real = avg_checkpoints._read_weights

  def deleting(model, path, weights):
    for name in os.listdir(os.path.dirname(path)):
      if name.startswith(os.path.basename(path) + ".data-"):
        os.remove(os.path.join(os.path.dirname(path), name))
    return real(model, path, weights)
  monkeypatch.setattr(avg_checkpoints, "_read_weights", deleting)
  with pytest.raises(UsageError, match=r"best/best.json lists ckpt-10, which is not there "
                     r"\(.*ckpt-10.data-00000-of-00001\); restore the folder"):
    avg_checkpoints.average(run_copy, 5, str(tmp_path / "avg"), best_of=0)
