"""Choosing the model, through the real CLIs on the tiny model: the dev figures, the K best
checkpoints (kept through rotation and resume), early stopping's state across a kill, the
averages of the best, and which weights each reader takes."""

import json
import os
import re
import shutil
import subprocess

import numpy as np
import pytest
import tensorflow as tf

from conftest import BIN, TINY_FLAGS, TINY_HPARAMS, cli

EMA = f"--hparams={TINY_HPARAMS},optimizer_multistep_accumulate_steps=2,ema_decay=0.9," \
      "ema_reference_tokens=3000"
EMBEDDING = "model/embedding/.ATTRIBUTES/VARIABLE_VALUE"


def _flags(data_dir, output_dir, *extra):
  flags = [f for f in TINY_FLAGS if not f.startswith(("--hparams=", "--local_eval_frequency",
                                                      "--eval_"))]
  return [*flags, EMA, f"--data_dir={data_dir}", f"--output_dir={output_dir}", *extra]


def _evaluations(stderr: str) -> dict:
  """{update: {metric: value}} of the eval log lines."""
  found = {}
  for update, figures in re.findall(r"eval at update (\d+) \(moving average\): (.*) \(",
                                    stderr):
    found[int(update)] = {name: float(value) for name, value in
                          (pair.split(" ") for pair in figures.split(", "))}
  return found


def _average_of_embedding(reader):
  """The moving average of the embedding in a training checkpoint (the one variable of its
  shape)."""
  shape = reader.get_variable_to_shape_map()[EMBEDDING]
  names = [n for n, s in reader.get_variable_to_shape_map().items()
           if n.startswith("ema/average_of/") and s == shape]
  assert len(names) == 1, names
  return reader.get_tensor(names[0])


def _best(output_dir):
  with open(os.path.join(output_dir, "best", "best.json")) as f:
    return json.load(f)


@pytest.fixture(scope="module")
def selected_run(multi30k_data, tmp_path_factory):
  """Up to 6 updates with a moving average, evaluated at each (dev loss, chrF and TER on 6
  decoded sentences), the 2 best by dev loss kept while rotation keeps 1 checkpoint, early
  stopping after 4 updates without an improvement by 100 (so at update 5): once unbroken,
  and once SIGKILLed as its evaluation of update 3 begins (update 3 saved, not evaluated),
  then resumed with a stray checkpoint, as a kill leaves one, in best/."""
  root = tmp_path_factory.mktemp("selected")
  flags = lambda output_dir: _flags(  # noqa: E731
      multi30k_data, output_dir, "--local_eval_frequency=1", "--eval_steps=2",
      "--eval_bleu_sentences=6", "--eval_metrics=dev_loss,dev_chrf,dev_ter",
      "--eval_early_stopping_metric=dev_loss", "--keep_best_checkpoints=2",
      "--keep_checkpoint_max=1", "--save_checkpoints_steps=1", "--train_steps=6",
      "--eval_early_stopping_steps=4", "--eval_early_stopping_metric_delta=100")
  straight, broken = str(root / "straight"), str(root / "broken")
  unbroken = cli("t2t-lite-trainer", *flags(straight), check=True)
  killed = cli("t2t-lite-trainer", *flags(broken), env={"T2T_LITE_FAULT": "evaluate:3"})
  assert killed.returncode == -9, killed.stderr[-3000:]
  state = {"best_when_killed": _best(broken)}
  open(os.path.join(broken, "best", "ckpt-77.index"), "w").close()
  resumed = cli("t2t-lite-trainer", *flags(broken), check=True)
  return dict(state, unbroken=unbroken, killed=killed, resumed=resumed, output_dir=broken,
              straight=straight, data_dir=multi30k_data)


def _kept_files(updates):
  return sorted([f"ckpt-{u}.{ext}" for u in updates for ext in ("index", "data-00000-of-00001")]
                + ["best.json", "checkpoint"])


def test_the_k_best_survive_rotation_with_their_figures(selected_run):
  straight = selected_run["straight"]
  figures = _evaluations(selected_run["unbroken"].stderr)
  assert sorted(figures) == [1, 2, 3, 4, 5] and set(figures[1]) == {"dev_loss", "dev_chrf",
                                                                    "dev_ter"}
  assert "early stopping: dev_loss has not improved by more than 100 for 4 updates" in \
      selected_run["unbroken"].stdout
  best = _best(straight)
  two_best = sorted(figures, key=lambda u: (figures[u]["dev_loss"], u))[:2]
  assert [e["update"] for e in best["kept"]] == two_best
  assert (best["metric"], best["lower_is_better"], best["weights"], best["keep"],
          best["evaluated_at"], best["improved_at"]) == ("dev_loss", True, "ema", 2, 5, 1)
  assert (best["update"], best["value"]) == (two_best[0], pytest.approx(
      figures[two_best[0]]["dev_loss"], abs=1e-4))
  for entry in best["kept"]:
    assert entry["figures"] == pytest.approx(figures[entry["update"]], abs=1e-4)
  assert sorted(os.listdir(os.path.join(straight, "best"))) == _kept_files(two_best)
  # rotation kept one checkpoint of the run itself (update 5 = micro-step 10), none of best/
  assert [n for n in os.listdir(straight) if n.endswith(".index")] == ["ckpt-10.index"]
  # a reader of the newest checkpoint of best/ reads the best
  assert tf.train.latest_checkpoint(os.path.join(straight, "best")).endswith(
      f"ckpt-{two_best[0]}")
  from test_train import _scalars  # each figure is a TensorBoard scalar at its update
  scalars = _scalars(os.path.join(straight, "eval"))
  assert set(scalars) == {"dev_loss", "dev_chrf", "dev_ter"}
  for name, points in scalars.items():
    assert [u for u, _ in points] == [1, 2, 3, 4, 5]
    assert [v for _, v in points] == pytest.approx([figures[u][name] for u in range(1, 6)],
                                                   abs=1e-4)
  # What was kept is the weights evaluated: the moving average of that update's checkpoint.
  # Dev loss still falls at every update here, so update 5 is the best, and the run's
  # checkpoint of it is still there to compare.
  assert two_best[0] == 5, figures
  kept = tf.train.load_checkpoint(os.path.join(straight, "best", "ckpt-5"))
  run = tf.train.load_checkpoint(tf.train.latest_checkpoint(straight))
  np.testing.assert_array_equal(kept.get_tensor(EMBEDDING), _average_of_embedding(run))


def test_early_stopping_and_the_best_resume_exactly_after_a_kill_before_an_evaluation(
    selected_run):
  """Killed as the evaluation of update 3 began, the run evaluates update 3 when it resumes,
  and ends as the unbroken run: stopped early at update 5, with the same figures at every
  update, the same record of the best and early stopping's state, the same kept updates;
  the stray checkpoint in best/ is gone."""
  broken = selected_run["output_dir"]
  assert selected_run["best_when_killed"]["evaluated_at"] == 2
  resumed = selected_run["resumed"]
  assert "update 3 was saved but not evaluated before the run stopped: evaluating it now" in \
      resumed.stderr
  assert "early stopping: dev_loss has not improved by more than 100 for 4 updates" in \
      resumed.stdout
  expected = _evaluations(selected_run["unbroken"].stderr)
  assert {**_evaluations(selected_run["killed"].stderr),
          **_evaluations(resumed.stderr)} == expected
  ours, theirs = _best(broken), _best(selected_run["straight"])
  for key in ("value", "update", "improved_at", "evaluated_at"):
    assert ours[key] == pytest.approx(theirs[key], abs=1e-6), key
  assert [e["update"] for e in ours["kept"]] == [e["update"] for e in theirs["kept"]]
  assert sorted(os.listdir(os.path.join(broken, "best"))) == _kept_files(
      [e["update"] for e in ours["kept"]])


def test_averaging_the_best_and_reading_either_weights(selected_run, tmp_path):
  from t2t_lite.inference import export, translator
  from t2t_lite.cli import avg_checkpoints
  from t2t_lite.core.errors import UsageError
  output_dir = selected_run["output_dir"]
  out = cli("t2t-lite-avg-checkpoints", f"--output_dir={output_dir}", "--best",
            f"--avg_dir={tmp_path / 'best_avg'}", check=True).stdout
  kept = [e["update"] for e in _best(output_dir)["kept"]]
  assert f"averaged 2 best checkpoints (ckpt-{min(kept)}, ckpt-{max(kept)}; ema weights)" in out
  with open(tmp_path / "best_avg" / "averaged.json") as f:
    record = json.load(f)
  assert (record["chosen"], record["weights"]) == ("best", "ema")
  readers = [tf.train.load_checkpoint(os.path.join(output_dir, "best", f"ckpt-{u}"))
             for u in kept]
  np.testing.assert_allclose(
      tf.train.load_checkpoint(tf.train.latest_checkpoint(str(tmp_path / "best_avg")))
      .get_tensor(EMBEDDING), np.mean([r.get_tensor(EMBEDDING) for r in readers], axis=0),
      atol=1e-7)
  with pytest.raises(UsageError, match=r"--weights=raw: checkpoint .*best/ckpt-\d+ holds the "
                     r"moving average of the weights \(ema\) as its evaluation read them"):
    avg_checkpoints.average(output_dir, 5, str(tmp_path / "raw_best"), best_of=0,
                            weights="raw")
  # the last checkpoint, by its average (the default) and by its raw weights
  run = tf.train.load_checkpoint(tf.train.latest_checkpoint(output_dir))
  for weights, expected in (("auto", _average_of_embedding(run)),
                            ("raw", run.get_tensor(EMBEDDING))):
    target = str(tmp_path / f"last_{weights}")
    saved, _ = avg_checkpoints.average(output_dir, 1, target, weights=weights)
    np.testing.assert_array_equal(tf.train.load_checkpoint(saved).get_tensor(EMBEDDING),
                                  expected)
    with open(os.path.join(target, "averaged.json")) as f:
      assert json.load(f)["weights"] == ("ema" if weights == "auto" else "raw")
    loaded = translator.load(output_dir, weights=weights)
    assert loaded.weights == ("ema" if weights == "auto" else "raw")
    np.testing.assert_array_equal(loaded.model.embedding.numpy(), expected)
  # a warm start from the average of the newest checkpoint starts from the moving average
  from t2t_lite.runs import rundir
  from t2t_lite.adapting.warm_start import read_same_shapes, source_checkpoint
  from t2t_lite.training.learner import Learner
  hparams, meta = rundir.model_from_run(output_dir)
  learner = Learner(hparams, meta["vocab_size"], 2)
  read_same_shapes(learner, source_checkpoint(str(tmp_path / "last_auto")))
  np.testing.assert_array_equal(learner.model.embedding.numpy(), _average_of_embedding(run))
  source = tmp_path / "src.en"
  source.write_text("A man rides a bike.\nTwo dogs.\n")
  assert translator.describe_weights(tf.train.latest_checkpoint(output_dir), "ema") == \
      "the moving average of the weights (ema)"
  averaged = cli("t2t-lite-decoder", f"--output_dir={tmp_path / 'best_avg'}",
                 f"--decode_from_file={source}", f"--decode_to_file={tmp_path / 'out2'}",
                 "--decode_hparams=beam_size=1", "--weights=ema", check=True)
  assert "weights: the mean of 2 checkpoints' moving average of the weights (ema)" in \
      averaged.stderr
  export.export_run(output_dir, str(tmp_path / "export"), "ctranslate2", weights="raw")
  with open(tmp_path / "export" / "t2t_lite_export.json") as f:
    assert json.load(f)["weights"] == "raw"


def test_evaluating_an_average_the_run_does_not_keep_is_refused():
  """(Decoding one from a checkpoint without it: test_ema.)"""
  from t2t_lite.core.errors import UsageError
  from t2t_lite.training.evaluation import _evaluated_weights

  class Plain:
    average = None
  with pytest.raises(UsageError, match="--eval_weights=ema: this run keeps no moving average "
                     "of the weights"):
    _evaluated_weights(Plain(), "ema")
  assert _evaluated_weights(Plain(), "auto") == "raw"


def test_chrf_chrfpp_and_ter_equal_sacrebleus_own_on_the_same_files(tmp_path):
  hypotheses = ["Ein Mann fährt Fahrrad.", "Zwei Hunde spielen im Schnee", "Kinder."]
  references = ["Ein Mann fährt ein Fahrrad.", "Zwei Hunde spielen im Schnee.", "Die Kinder."]
  hyp, ref = tmp_path / "hyp.txt", tmp_path / "ref.txt"
  hyp.write_text("\n".join(hypotheses) + "\n")
  ref.write_text("\n".join(references) + "\n")
  ours = cli("t2t-lite-bleu", f"--translation={hyp}", f"--reference={ref}",
             "--metrics=bleu,chrf,chrfpp,ter", check=True).stdout.splitlines()
  scores = {line.split(" = ")[0]: float(line.split(" = ")[1]) for line in ours[::2]}
  sacrebleu = os.path.join(BIN, "sacrebleu")
  theirs = json.loads(subprocess.run([sacrebleu, str(ref), "-i", str(hyp), "-m", "bleu",
                                      "chrf", "ter", "-w", "4"], capture_output=True,
                                     text=True, check=True).stdout)
  plus = json.loads(subprocess.run([sacrebleu, str(ref), "-i", str(hyp), "-m", "chrf",
                                    "--chrf-word-order", "2", "-w", "4"], capture_output=True,
                                   text=True, check=True).stdout)
  assert scores == pytest.approx({"bleu": theirs[0]["score"], "chrf": theirs[1]["score"],
                                  "ter": theirs[2]["score"], "chrfpp": plus["score"]},
                                 abs=0.006)
  assert "nw:2" in ours[5] and "tok:tercom" in ours[7]  # chrF++'s word order, TER's signature
  unknown = cli("t2t-lite-bleu", f"--translation={hyp}", f"--reference={ref}",
                "--metrics=bleu,meteor")
  assert unknown.returncode == 2 and "--metrics: unknown metric 'meteor'; known: bleu, chrf, " \
      "chrfpp, ter" in unknown.stderr


def test_a_copied_run_averages_its_own_best_and_a_missing_one_is_named(selected_run,
                                                                       tmp_path):
  from t2t_lite.cli import avg_checkpoints
  from t2t_lite.core.errors import UsageError
  copy = str(tmp_path / "copy")
  shutil.copytree(selected_run["output_dir"], copy)
  _, paths = avg_checkpoints.average(copy, 5, str(tmp_path / "avg"), best_of=0)
  assert len(paths) == 2 and all(p.startswith(copy + "/best/") for p in paths)
  kept = _best(copy)["kept"]
  for name in os.listdir(os.path.join(copy, "best")):
    if name.startswith(kept[1]["checkpoint"] + "."):
      os.remove(os.path.join(copy, "best", name))
  with pytest.raises(UsageError, match=f"best.json lists {kept[1]['checkpoint']}, which is not "
                     "there"):
    avg_checkpoints.average(copy, 5, str(tmp_path / "avg2"), best_of=0)


def test_a_kill_at_the_first_evaluation_is_evaluated_on_resume(multi30k_data, tmp_path):
  output_dir = str(tmp_path / "run")
  flags = _flags(multi30k_data, output_dir, "--local_eval_frequency=2", "--eval_steps=1",
                 "--eval_bleu_sentences=0", "--eval_metrics=dev_loss", "--train_steps=2",
                 "--save_checkpoints_steps=2")
  killed = cli("t2t-lite-trainer", *flags, env={"T2T_LITE_FAULT": "evaluate:1"})
  assert killed.returncode == -9 and not os.path.exists(os.path.join(output_dir, "best"))
  resumed = cli("t2t-lite-trainer", *flags, check=True)
  assert "update 2 was saved but not evaluated before the run stopped" in resumed.stderr
  assert list(_evaluations(resumed.stderr)) == [2]
  best = _best(output_dir)
  assert (best["evaluated_at"], [e["update"] for e in best["kept"]]) == (2, [2])


def test_the_weights_each_evaluation_ranked_are_recorded_and_a_change_is_refused(tmp_path):
  from t2t_lite.core.errors import UsageError
  from t2t_lite.inference.translator import _recorded_weights
  from t2t_lite.training.best import BestCheckpoints
  directory = str(tmp_path / "best")
  model = tf.Module()
  model.w = tf.Variable([1.0])
  BestCheckpoints(directory, "dev_loss", True, 2, weights="ema").record(
      3, {"dev_loss": 2.5}, model)
  best = _best(str(tmp_path))
  assert [(e["update"], e["weights"]) for e in best["kept"]] == [(3, "ema")]
  assert _recorded_weights(os.path.join(directory, "ckpt-3"))[0] == "ema"
  with pytest.raises(UsageError, match=r"best ranks the evaluations of the ema weights and "
                     r"this run evaluates the raw ones, which would rank the two together; "
                     r"resume with --eval_weights=ema, or move .* away to keep them"):
    BestCheckpoints(directory, "dev_loss", True, 2, weights="raw")
  BestCheckpoints(directory, "dev_loss", True, 2, weights="ema").record(
      4, {"dev_loss": 2.0}, model)
  assert [e["update"] for e in _best(str(tmp_path))["kept"]] == [4, 3]
