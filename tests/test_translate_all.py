"""t2t-lite-translate-all through its executable: one BLEU point per checkpoint at its update,
the same BLEU as t2t-lite-decoder + t2t-lite-bleu, nothing scored twice, the run only read,
watching for new checkpoints, and one-line usage errors."""

import gzip
import hashlib
import json
import os
import re
import shutil
import subprocess
import threading

import pytest
import tensorflow as tf

from conftest import REPO, TINY_HPARAMS, cli, popen, multi30k_dir

PROGRAM = os.path.join(REPO, "bin", "t2t-lite-translate-all")
ENV = {"PYTHONPATH": os.pathsep.join(p for p in (REPO, os.environ.get("PYTHONPATH")) if p)}
LINES = 24
DECODE = "--decode_hparams=beam_size=2,extra_decode_length=10"
# 3 updates of 2 micro-steps, a checkpoint after each (ckpt-2, ckpt-4, ckpt-6), all kept; a
# learning rate without warm-up, so that every update changes the translations (a rate that
# makes the loss jump: no spike detection).
TRAIN_FLAGS = ["--problem=translate_ende_multi30k", "--hparams_set=transformer_tiny",
               f"--hparams={TINY_HPARAMS},optimizer_multistep_accumulate_steps=2,"
               "learning_rate_warmup_steps=1,divergence_spike_margin=0",
               "--save_checkpoints_steps=1", "--keep_checkpoint_max=0", "--train_steps=3",
               "--local_eval_frequency=0", "--log_every=0",
               "--random_seed=7"]
SCORE_LINE = re.compile(r"^(ckpt-\d+) \(update (\d+)\): BLEU (\d+\.\d\d)$")


def translate_all(*args, timeout=300):
  return cli("t2t-lite-translate-all", *args, timeout=timeout, env=ENV)


def digest(directory, skip=("eval_bleu",)):
  """sha256 of every file under `directory` (but `skip`), by relative path."""
  found = {}
  for root, dirs, names in os.walk(directory):
    dirs[:] = [d for d in dirs if d not in skip]
    for name in names:
      with open(os.path.join(root, name), "rb") as f:
        found[os.path.relpath(os.path.join(root, name), directory)] = \
            hashlib.sha256(f.read()).hexdigest()
  return found


def bleu_events(eval_dir):
  """(step, value) of every `bleu` scalar in the event files of `eval_dir`, in file order."""
  points = []
  for name in sorted(os.listdir(eval_dir)):
    if name.startswith("events.out.tfevents"):
      for event in tf.compat.v1.train.summary_iterator(os.path.join(eval_dir, name)):
        points += [(event.step, float(tf.make_ndarray(value.tensor)))
                   for value in event.summary.value if value.tag == "bleu"]
  return points


def scores(stdout):
  """{checkpoint: (update, printed BLEU)} of the score lines; every line must be one."""
  lines = stdout.splitlines()
  matches = [SCORE_LINE.match(line) for line in lines]
  assert all(matches), stdout
  return {m.group(1): (int(m.group(2)), m.group(3)) for m in matches}


def damage(run, name="ckpt-5"):
  """A checkpoint cut short, as a trainer killed while saving (or a bad disk) leaves it."""
  shutil.copyfile(os.path.join(run, "ckpt-4.index"), os.path.join(run, f"{name}.index"))
  with open(os.path.join(run, "ckpt-4.data-00000-of-00001"), "rb") as f:
    head = f.read(100_000)
  with open(os.path.join(run, f"{name}.data-00000-of-00001"), "wb") as f:
    f.write(head)


@pytest.fixture(scope="module")
def run(multi30k_data, tmp_path_factory):
  output_dir = str(tmp_path_factory.mktemp("translate_all") / "run")
  cli("t2t-lite-trainer", *TRAIN_FLAGS, f"--data_dir={multi30k_data}",
      f"--output_dir={output_dir}", env=ENV, check=True)
  assert sorted(n for n in os.listdir(output_dir) if n.endswith(".index")) == [
      "ckpt-2.index", "ckpt-4.index", "ckpt-6.index"]
  return output_dir


@pytest.fixture(scope="module")
def texts(run, tmp_path_factory):
  """The first test sentences, and a reference whose even lines are ckpt-6's translations
  (by t2t-lite-decoder), so that its BLEU is far from 0 and from the other checkpoints'."""
  work = tmp_path_factory.mktemp("texts")
  with gzip.open(os.path.join(multi30k_dir(), "test_2016_flickr.en.gz"), "rt") as f:
    sources = [next(f) for _ in range(LINES)]
  with gzip.open(os.path.join(multi30k_dir(), "test_2016_flickr.de.gz"), "rt") as f:
    references = [next(f) for _ in range(LINES)]
  source, newest = work / "test.en", work / "ckpt-6.de"
  source.write_text("".join(sources))
  cli("t2t-lite-decoder", f"--output_dir={run}", f"--checkpoint_path={run}/ckpt-6",
      f"--decode_from_file={source}", f"--decode_to_file={newest}", DECODE, env=ENV,
      check=True)
  decoded = newest.read_text().splitlines(keepends=True)
  reference = work / "test.de"
  reference.write_text("".join(decoded[i] if i % 2 == 0 else references[i]
                               for i in range(LINES)))
  out = cli("t2t-lite-bleu", f"--translation={newest}", f"--reference={reference}", env=ENV,
            check=True).stdout
  expected = re.match(r"BLEU = (\d+\.\d\d) ", out).group(1)
  return {"source": str(source), "reference": str(reference), "newest": newest.read_text(),
          "expected": expected, "work": work}


@pytest.fixture(scope="module")
def scored(run, texts, tmp_path_factory):
  """A copy of the run scored once."""
  copy = str(tmp_path_factory.mktemp("scored") / "run")
  shutil.copytree(run, copy)
  before = digest(copy)
  translations = str(texts["work"] / "translations")
  result = translate_all(f"--output_dir={copy}", f"--decode_from_file={texts['source']}",
                         f"--reference={texts['reference']}", DECODE,
                         f"--translations_dir={translations}")
  assert result.returncode == 0, result.stderr[-3000:]
  return {"run": copy, "before": before, "result": result, "translations": translations,
          "args": [f"--output_dir={copy}", f"--decode_from_file={texts['source']}",
                   f"--reference={texts['reference']}", DECODE]}


def test_one_bleu_point_per_checkpoint_at_its_update(scored):
  printed = scores(scored["result"].stdout)
  assert {name: update for name, (update, _) in printed.items()} == {
      "ckpt-2": 1, "ckpt-4": 2, "ckpt-6": 3}  # ckpt-<micro_step>, 2 micro-steps an update
  events = bleu_events(os.path.join(scored["run"], "eval_bleu"))
  assert [step for step, _ in events] == [1, 2, 3]
  with open(os.path.join(scored["run"], "eval_bleu", "scored.json")) as f:
    record = json.load(f)["checkpoints"]
  assert sorted(record) == ["ckpt-2", "ckpt-4", "ckpt-6"]
  for (step, value), name in zip(events, ["ckpt-2", "ckpt-4", "ckpt-6"]):
    assert record[name]["update"] == step and record[name]["micro_step"] == 2 * step
    assert record[name]["weights"] == "raw"  # the run keeps no moving average
    assert value == pytest.approx(record[name]["bleu"], abs=1e-4)
    assert f"{value:.2f}" == printed[name][1]
  assert "scored 3 checkpoints (0 scored before)" in scored["result"].stderr
  with open(os.path.join(scored["run"], "eval_bleu", "scored.json")) as f:
    against = json.load(f)["scored_against"]
  with open(os.path.join(scored["run"], "hparams.json")) as f:
    meta = json.load(f)
  assert against["problem"] == "translate_ende_multi30k"
  assert against["vocab_sha256"] == meta["data"]["vocab_sha256"]
  assert against["hparams_set"] == "transformer_tiny" and against["hparams"] == meta["hparams"]


def test_an_average_is_plotted_at_the_update_it_records(run, texts, tmp_path):
  """ckpt-6 of a run of 2 micro-steps an update is update 3, averaged or not (its number
  divided by the accumulate steps was a guess, wrong with replicas or a schedule)."""
  avg = str(tmp_path / "avg")
  cli("t2t-lite-avg-checkpoints", f"--output_dir={run}", "--num_last_checkpoints=2",
      f"--avg_dir={avg}", env=ENV, check=True)
  reader = tf.train.load_checkpoint(tf.train.latest_checkpoint(avg))
  assert int(reader.get_tensor("update_step/.ATTRIBUTES/VARIABLE_VALUE")) == 3
  result = translate_all(f"--output_dir={avg}", f"--decode_from_file={texts['source']}",
                         f"--reference={texts['reference']}", DECODE)
  assert result.returncode == 0, result.stderr[-3000:]
  assert list(scores(result.stdout)) == ["ckpt-6"] and scores(result.stdout)["ckpt-6"][0] == 3


def test_no_checkpoint_scored_is_a_failed_run(run, texts, tmp_path):
  copy = tmp_path / "run"
  shutil.copytree(run, copy)
  for name in os.listdir(copy):
    if name.startswith("ckpt-") and ".data-" in name:
      (copy / name).write_bytes(b"cut short")
  result = translate_all(f"--output_dir={copy}", f"--decode_from_file={texts['source']}",
                         f"--reference={texts['reference']}", DECODE)
  assert result.returncode == 1, result.stderr[-3000:]
  last = result.stderr.strip().splitlines()[-1]
  assert last.startswith("t2t-lite-translate-all: error: no checkpoint of") and \
      "could be scored (3 unreadable" in last, last


def test_newest_checkpoint_scores_as_decoder_then_bleu(scored, texts):
  printed = scores(scored["result"].stdout)
  assert printed["ckpt-6"][1] == texts["expected"]
  value = dict(bleu_events(os.path.join(scored["run"], "eval_bleu")))[3]
  assert abs(value - float(texts["expected"])) <= 0.01
  assert float(texts["expected"]) > 5  # half the reference is ckpt-6's own output
  with open(os.path.join(scored["translations"], "ckpt-6.txt")) as f:
    assert f.read() == texts["newest"]
  # Each checkpoint was restored in turn: the first translates differently and scores lower.
  with open(os.path.join(scored["translations"], "ckpt-2.txt")) as f:
    assert f.read() != texts["newest"]
  assert float(printed["ckpt-2"][1]) < float(texts["expected"]) - 5


def test_a_second_run_scores_nothing_new(scored):
  eval_dir = os.path.join(scored["run"], "eval_bleu")
  before = digest(eval_dir, skip=())
  result = translate_all(*scored["args"])
  assert result.returncode == 0, result.stderr[-3000:]
  assert result.stdout == ""
  assert "scored 0 checkpoints (3 scored before)" in result.stderr
  assert digest(eval_dir, skip=()) == before  # no new event file, no new point
  assert [step for step, _ in bleu_events(eval_dir)] == [1, 2, 3]


def test_other_settings_are_refused_not_mixed_into_the_curve(scored):
  args = [a for a in scored["args"] if not a.startswith("--decode_hparams")]
  result = translate_all(*args, "--decode_hparams=beam_size=1,extra_decode_length=10")
  assert result.returncode == 2, result.stderr
  lines = result.stderr.strip().splitlines()
  assert len(lines) == 1 and "holds BLEU decoded with other settings (beam_size 2 -> 1)" in \
      lines[0], result.stderr


def test_the_run_is_only_read(scored):
  assert digest(scored["run"]) == scored["before"]


def test_watching_scores_checkpoints_as_they_appear(run, texts, scored, tmp_path):
  """ckpt-6's files are there, but the run's checkpoint state names ckpt-4 as the newest (as
  while the trainer writes ckpt-6); it names ckpt-6 once ckpt-4 is scored. A damaged ckpt-5 is
  reported once, skipped and tried again quietly at each look. --min_steps=2 skips ckpt-2."""
  watched = str(tmp_path / "run")
  shutil.copytree(run, watched)
  tf.compat.v1.train.update_checkpoint_state(watched, "ckpt-4", ["ckpt-2", "ckpt-4"])
  damage(watched)
  args = [f"--output_dir={watched}", *scored["args"][1:], "--min_steps=2",
          "--wait_minutes=0.05"]
  with open(tmp_path / "stderr", "w+") as stderr:
    process = popen([PROGRAM, *args], stdout=subprocess.PIPE, stderr=stderr, text=True,
                    env=dict(os.environ, **ENV))
    killer = threading.Timer(240, process.kill)
    killer.start()
    out = []
    try:
      for line in process.stdout:
        out.append(line)
        if line.startswith("ckpt-4 "):  # the trainer has finished saving ckpt-6
          tf.compat.v1.train.update_checkpoint_state(watched, "ckpt-6",
                                                     ["ckpt-2", "ckpt-4", "ckpt-6"])
      process.wait()
    finally:
      killer.cancel()
    stderr.seek(0)
    err = stderr.read()
  assert process.returncode == 0, err[-3000:]
  printed = scores("".join(out))
  assert {name: update for name, (update, _) in printed.items()} == {"ckpt-4": 2, "ckpt-6": 3}
  first = scores(scored["result"].stdout)
  assert printed["ckpt-6"] == first["ckpt-6"] and printed["ckpt-4"] == first["ckpt-4"]
  assert [step for step, _ in bleu_events(os.path.join(watched, "eval_bleu"))] == [2, 3]
  assert "ckpt-2 (update 1): skipped, before --min_steps=2" in err
  warnings = [line for line in err.splitlines() if "ckpt-5" in line]
  assert len(warnings) == 1 and warnings[0].startswith("W"), warnings
  assert "ckpt-5 vanished or is unreadable (" in warnings[0]
  assert warnings[0].endswith("); skipped") and "Traceback" not in err
  with open(os.path.join(watched, "eval_bleu", "scored.json")) as f:
    assert sorted(json.load(f)["checkpoints"]) == ["ckpt-4", "ckpt-6"]
  assert "exits after 0.05 minutes without one" in err
  assert "scored 2 checkpoints (0 scored before, 1 before --min_steps)" in err


def _no_hparams(tmp_path, run, texts):
  return [f"--output_dir={tmp_path}", f"--decode_from_file={texts['source']}",
          f"--reference={texts['reference']}"]


def _no_checkpoints(tmp_path, run, texts):
  shutil.copyfile(os.path.join(run, "hparams.json"), tmp_path / "hparams.json")
  return _no_hparams(tmp_path, run, texts)


def _short_reference(tmp_path, run, texts):
  (tmp_path / "short.de").write_text("eins\nzwei\ndrei\n")
  return [f"--output_dir={run}", f"--decode_from_file={texts['source']}",
          f"--reference={tmp_path / 'short.de'}"]


def _usual(**changes):
  def args(tmp_path, run, texts):
    values = {"output_dir": run, "decode_from_file": texts["source"],
              "reference": texts["reference"]}
    values.update({k: v.format(tmp=tmp_path, run=run) if v else v for k, v in changes.items()})
    return [f"--{k}={v}" for k, v in values.items() if v is not None]
  return args


@pytest.mark.parametrize("make_args, message", [
    (_usual(output_dir=None), "--output_dir is required, e.g. --output_dir="),
    (_no_hparams, "--output_dir={tmp} holds no hparams.json"),
    (_no_checkpoints, "--output_dir={tmp} holds no checkpoints (ckpt-N.index); pass "
                      "--wait_minutes"),
    (_usual(decode_from_file="{tmp}/missing.en"), "--decode_from_file={tmp}/missing.en does "
                                                  "not exist"),
    (_usual(reference="{tmp}/missing.de"), "--reference={tmp}/missing.de does not exist"),
    (_short_reference, f"has {LINES} lines, {{tmp}}/short.de has 3"),
    (_usual(translations_dir="{run}"), "--translations_dir={run} is --output_dir={run}"),
    (_usual(translations_dir="{run}/.."), "--translations_dir={run}/.. contains --output_dir"),
    (_usual(checkpoint_path="{run}/ckpt-4"), "--checkpoint_path is not read by "
                                             "t2t-lite-translate-all"),
    (_usual(wait_minutes="-1"), "--wait_minutes=-1.0: must be at least 0"),
])
def test_usage_errors_exit_2_with_one_line(run, texts, tmp_path, make_args, message):
  result = translate_all(*make_args(tmp_path, run, texts))
  assert result.returncode == 2, result.stderr
  lines = [line for line in result.stderr.splitlines() if line.strip()]
  assert len(lines) == 1 and lines[0].startswith("t2t-lite-translate-all: error:"), \
      result.stderr
  assert message.format(tmp=tmp_path, run=run) in lines[0]
  assert "Traceback" not in result.stderr
  assert not os.path.exists(os.path.join(run, "eval_bleu"))
  assert not os.path.exists(tmp_path / "eval_bleu")
