"""t2t-lite-exporter and its exports: the SavedModel (strings in and out, in a process without
t2t_lite), CTranslate2 (against our own decoder), usage errors and the atomic write."""

import gzip
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from conftest import BIN, cli, popen, multi30k_dir, tiny_hparams, vocab_path
from t2t_lite.inference import decode, export, metrics, translator
from t2t_lite.core import registry
from t2t_lite.runs import rundir
from t2t_lite.inference.export import ctranslate2_decoder, ctranslate2_model
from t2t_lite.data.vocab import SubwordVocab

SENTENCES = 50
# The output cap past the longest source of a batch: tiny_run's 4 updates never end a
# sentence, so every output runs to the cap; a short one decodes the same way in less time,
# and every export and decode here uses it.
EXTRA = 12
UMLAUTS = "Zwei Männer überqueren eine Straße in München."
# Inserted among the test sentences: an empty line, a blank one, umlauts.
EXTRA_LINES = {10: "", 20: "   ", 30: UMLAUTS}


def _start(name, *args, env=None):
  return popen([os.path.join(BIN, name), *args], stdout=subprocess.PIPE,
               stderr=subprocess.PIPE, text=True, env=dict(os.environ, **(env or {})))


def _finish(processes):
  """Waits for all; fails with the stderr of the first that did not exit 0."""
  results = [(p, *p.communicate(timeout=300)) for p in processes]
  for process, _, err in results:
    assert process.returncode == 0, f"{process.args} exited {process.returncode}:\n{err[-3000:]}"
  return results


def _read(path):
  with open(path, encoding="utf-8") as f:
    return f.read().split("\n")[:-1]


def _tree_digest(directory):
  digest = hashlib.sha256()
  for root, _, files in sorted(os.walk(directory)):
    for name in sorted(files):
      with open(os.path.join(root, name), "rb") as f:
        digest.update(name.encode() + f.read())
  return digest.hexdigest()


@pytest.fixture(scope="module")
def source(tmp_path_factory):
  """50 test_2016_flickr sentences with an empty, a blank and an umlaut line among them."""
  with gzip.open(os.path.join(multi30k_dir(), "test_2016_flickr.en.gz"), "rt") as f:
    lines = [next(f).rstrip("\n") for _ in range(SENTENCES)]
  with gzip.open(os.path.join(multi30k_dir(), "test_2016_flickr.de.gz"), "rt") as f:
    references = [next(f).rstrip("\n") for _ in range(SENTENCES)]
  for index, line in sorted(EXTRA_LINES.items()):
    lines.insert(index, line)
  path = tmp_path_factory.mktemp("source") / "test.en"
  path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
  return {"path": str(path), "lines": lines, "references": references}


@pytest.fixture(scope="module")
def exported(tiny_run, source, tmp_path_factory):
  """Exports of a copy of tiny_run (deleted afterwards, with its vocabulary) and the
  translations of `source` by t2t-lite-decoder on the original run: greedy and beam 4."""
  base = tmp_path_factory.mktemp("exports")
  run, data = base / "run_copy", base / "data_copy"
  shutil.copytree(tiny_run["output_dir"], run)
  os.makedirs(data)
  vocab_name = "translate_ende_multi30k.vocab.model"
  shutil.copy(vocab_path(tiny_run["data_dir"]), data / vocab_name)
  meta = rundir.read_meta(str(run))
  meta["data_dir"] = str(data)
  rundir.write_meta(str(run), meta)
  dirs = {name: str(base / name) for name in ("sm_greedy", "sm_beam", "ct2")}
  out = {name: str(base / f"{name}.de") for name in ("tf_greedy", "tf_beam", "ct2_greedy",
                                                     "ct2_beam")}
  decode_args = ["--decode_from_file=" + source["path"]]
  started = [
      _start("t2t-lite-exporter", f"--output_dir={run}", f"--export_dir={dirs['sm_beam']}",
             f"--decode_hparams=beam_size=4,alpha=0.6,return_beams=true,extra_decode_length={EXTRA}"),
      # One batch holds every line, as one SavedModel call does.
      _start("t2t-lite-decoder", f"--output_dir={tiny_run['output_dir']}", *decode_args,
             f"--decode_hparams=beam_size=1,batch_size=100000,extra_decode_length={EXTRA}",
             f"--decode_to_file={out['tf_greedy']}"),
      _start("t2t-lite-decoder", f"--output_dir={tiny_run['output_dir']}", *decode_args,
             f"--decode_hparams=beam_size=4,alpha=0.6,batch_size=100000,extra_decode_length={EXTRA}",
             f"--decode_to_file={out['tf_beam']}"),
  ]
  # Meanwhile here (TensorFlow is imported already): what t2t-lite-exporter does.
  export.export_run(str(run), dirs["sm_greedy"],
                    decode_hparams=f"beam_size=1,extra_decode_length={EXTRA}")
  export.export_run(str(run), dirs["ct2"], "ctranslate2",
                    decode_hparams=f"extra_decode_length={EXTRA}")
  _finish(started)
  shutil.rmtree(run)
  shutil.rmtree(data)
  _finish([
      _start("t2t-lite-decoder", "--engine=ctranslate2", f"--export_dir={dirs['ct2']}",
             *decode_args, f"--decode_hparams=beam_size={beam},batch_size=100000",
             f"--decode_to_file={out[f'ct2_{name}']}")
      for name, beam in (("greedy", 1), ("beam", 4))])
  return {"dirs": dirs, "outputs": {name: _read(path) for name, path in out.items()}}


CLIENT = r"""
import json, os, sys
import tensorflow as tf
lines, ids_in = json.loads(sys.argv[3]), tf.constant(json.loads(sys.argv[4]))
result = {}
# First, before tensorflow-text is imported: the ids-only SavedModels, as a server without
# its ops loads them.
for name in ("sm_greedy", "sm_beam"):
  model = tf.saved_model.load(os.path.join(sys.argv[1 if name == "sm_greedy" else 2], "ids_only"))
  out = model.signatures["translate_ids"](ids=ids_in)
  default = model.signatures["serving_default"](ids=ids_in)
  result[name + "_ids_only"] = {"ids": out["ids"].numpy().tolist(),
                                "scores": out["scores"].numpy().tolist(),
                                "default_ids": default["ids"].numpy().tolist()}
result["ids_only_loaded_without_tensorflow_text"] = "tensorflow_text" not in sys.modules
import tensorflow_text  # registers the SentencePiece ops
for name in ("sm_greedy", "sm_beam"):
  model = tf.saved_model.load(sys.argv[1 if name == "sm_greedy" else 2])
  out = model.signatures["serving_default"](inputs=tf.constant(lines))
  translations = out["translations"].numpy().tolist()  # bytes, or lists of bytes per beam
  result[name] = {"translations": [[t.decode("utf-8") for t in row] if isinstance(row, list)
                                   else row.decode("utf-8") for row in translations],
                  "scores": out["scores"].numpy().tolist()}
  ids = model.signatures["translate_ids"](ids=ids_in)
  result[name]["ids"] = ids["ids"].numpy().tolist()
  result[name]["ids_scores"] = ids["scores"].numpy().tolist()
result["imported_t2t_lite"] = any(m.startswith("t2t_lite") for m in sys.modules)
print(json.dumps(result))
"""


@pytest.fixture(scope="module")
def served(exported, source, tiny_run):
  """The SavedModels' answers, from a process that imports only tensorflow(_text): the lines
  as strings, and as ids (two extra padding columns, which must not matter)."""
  vocab = SubwordVocab(vocab_path(tiny_run["data_dir"]))
  rows = [vocab.encode(line.strip()) for line in source["lines"]]
  width = max(len(r) for r in rows) + 2
  ids = [r + [0] * (width - len(r)) for r in rows]
  result = subprocess.run(
      [sys.executable, "-c", CLIENT, exported["dirs"]["sm_greedy"], exported["dirs"]["sm_beam"],
       json.dumps(source["lines"]), json.dumps(ids)], capture_output=True, text=True,
      timeout=300, cwd=os.path.dirname(exported["dirs"]["sm_greedy"]))
  assert result.returncode == 0, result.stderr[-3000:]
  return dict(json.loads(result.stdout.splitlines()[-1]), ids_in=ids)


def test_saved_model_translates_as_the_decoder_greedy_and_beam(exported, served):
  assert not served["imported_t2t_lite"]
  assert served["sm_greedy"]["translations"] == exported["outputs"]["tf_greedy"]
  best = [row[0] for row in served["sm_beam"]["translations"]]
  assert best == exported["outputs"]["tf_beam"]
  assert len(best) == SENTENCES + len(EXTRA_LINES)
  assert any(not t.isascii() for t in best + served["sm_greedy"]["translations"]) == any(
      not t.isascii() for t in exported["outputs"]["tf_beam"] + exported["outputs"]["tf_greedy"])


def test_saved_model_return_beams_nbest_and_empty_lines(served, source):
  beams = served["sm_beam"]
  assert np.array(beams["scores"]).shape == (len(source["lines"]), 4)
  assert all(len(row) == 4 for row in beams["translations"])
  for index, line in enumerate(source["lines"]):
    if not line.strip():
      assert beams["translations"][index] == [""] * 4 and beams["scores"][index] == [0.0] * 4
    else:
      assert all(score < 0 for score in beams["scores"][index])
  greedy = served["sm_greedy"]
  assert [greedy["translations"][i] for i in (10, 20)] == ["", ""]
  assert greedy["translations"][30].strip(), "the umlaut line gets a translation"


def test_saved_model_translate_ids_matches_strings(served, source, tiny_run):
  vocab = SubwordVocab(vocab_path(tiny_run["data_dir"]))
  for name in ("sm_greedy", "sm_beam"):
    answer = served[name]
    ids, scores = np.array(answer["ids"]), np.array(answer["ids_scores"])
    assert ids.ndim == (2 if name == "sm_greedy" else 3) and len(ids) == len(source["lines"])
    best_ids = ids if name == "sm_greedy" else ids[:, 0]
    best_scores = scores if name == "sm_greedy" else scores[:, 0]
    strings = [t if name == "sm_greedy" else t[0] for t in answer["translations"]]
    string_scores = [s if name == "sm_greedy" else s[0] for s in answer["scores"]]
    for index, line in enumerate(source["lines"]):
      if line.strip():  # (empty lines: the strings signature answers "" without decoding)
        assert vocab.decode(best_ids[index]) == strings[index]
        assert best_scores[index] == pytest.approx(string_scores[index], rel=1e-5)


def test_ids_only_saved_model_loads_without_tensorflow_text(served):
  """ids_only/ answers as the full export's translate_ids, in a process that had not imported
  tensorflow_text (which a SentencePiece op anywhere in the graph would need)."""
  assert served["ids_only_loaded_without_tensorflow_text"]
  for name in ("sm_greedy", "sm_beam"):
    ids_only, full = served[name + "_ids_only"], served[name]
    assert ids_only["ids"] == full["ids"] == ids_only["default_ids"]
    np.testing.assert_allclose(ids_only["scores"], full["ids_scores"], rtol=1e-6)


def test_saved_model_cli_shows_and_runs_the_exports(exported, served, tmp_path):
  """`saved_model_cli show` lists both signatures; plain `saved_model_cli run` translates ids
  with the ids-only SavedModel (the full one needs tensorflow-text's ops registered)."""
  full = exported["dirs"]["sm_greedy"]
  np.save(tmp_path / "ids.npy", np.array(served["ids_in"], np.int32))
  (_, show, _), (_, run, _) = _finish([
      _start("saved_model_cli", "show", f"--dir={full}", "--all"),
      _start("saved_model_cli", "run", f"--dir={os.path.join(full, 'ids_only')}",
             "--tag_set=serve", "--signature_def=translate_ids",
             f"--inputs=ids={tmp_path / 'ids.npy'}", f"--outdir={tmp_path / 'out'}")])
  signatures = re.findall(r"signature_def\['(\w+)'\]", show)
  assert sorted(signatures) == ["__saved_model_init_op", "serving_default", "translate_ids"]
  assert "dtype: DT_STRING" in show and "serving_default_inputs:0" in show
  assert np.load(tmp_path / "out" / "ids.npy").tolist() == served["sm_greedy_ids_only"]["ids"]
  np.testing.assert_allclose(np.load(tmp_path / "out" / "scores.npy"),
                             served["sm_greedy_ids_only"]["scores"], rtol=1e-6)


def test_ctranslate2_greedy_ids_and_bleu_match_ours(exported, served, source, tiny_run):
  vocab = SubwordVocab(vocab_path(tiny_run["data_dir"]))
  lines = [i for i, line in enumerate(source["lines"]) if line.strip()]
  # Our greedy ids: the SavedModel's translate_ids (our search), all lines in one batch.
  ours = [[t for t in served["sm_greedy"]["ids"][i] if t] for i in lines]
  ours = [row[:row.index(1)] if 1 in row else row for row in ours]
  sources = [vocab.encode(source["lines"][i].strip()) for i in lines]
  # One thread: the ids do not depend on it, and OpenMP threads crawl on a busy machine.
  theirs = ctranslate2_decoder.Ctranslate2Decoder(exported["dirs"]["ct2"], EXTRA, 1).translate_ids(
      sources, 1, 0.6, batch_size=0)
  same = sum(a == b for a, b in zip(ours, theirs))
  assert same >= 0.99 * len(ours), f"{same} of {len(ours)} greedy outputs identical"
  outputs = exported["outputs"]
  keep = [i for i in range(len(source["lines"])) if i not in EXTRA_LINES]
  for greedy_or_beam in ("greedy", "beam"):
    ours = [outputs[f"tf_{greedy_or_beam}"][i] for i in keep]
    theirs = [outputs[f"ct2_{greedy_or_beam}"][i] for i in keep]
    difference = (metrics.bleu(ours, source["references"]).score -
                  metrics.bleu(theirs, source["references"]).score)
    assert abs(difference) <= 0.2, (greedy_or_beam, difference)
  assert [outputs["ct2_beam"][i] for i in (10, 20)] == ["", ""]
  assert len(outputs["ct2_beam"]) == len(source["lines"])


def _teacher_forced(model, source_ids, target_ids):
  logits = model(tf.constant([source_ids]), tf.constant([target_ids]))
  log_probs = tf.nn.log_softmax(logits)[0].numpy()
  return np.array([log_probs[t, token] for t, token in enumerate(target_ids)])


@pytest.mark.parametrize("norm", ["pre_norm", "post_norm"])
def test_ctranslate2_scores_every_token_as_ours(norm, tiny_run, tmp_path):
  """The converted weights give our log-probabilities to 1e-4 on real sentence pairs, for the
  pre-norm model (trained) and the post-norm one (random: the mapping is what is tested)."""
  import ctranslate2
  vocab_file = vocab_path(tiny_run["data_dir"])
  vocab = SubwordVocab(vocab_file)
  if norm == "pre_norm":
    from t2t_lite.inference import translator
    run = translator.load(tiny_run["output_dir"])
    model, hparams = run.model, run.hparams
  else:
    hparams = tiny_hparams(layer_preprocess_sequence="none", layer_postprocess_sequence="dan")
    model = registry.model("transformer")(hparams, vocab.size, seed=5)
  ctranslate2_model.export(model, hparams, vocab_file, str(tmp_path / "ct2"), "none")
  translator = ctranslate2.Translator(str(tmp_path / "ct2"))
  pairs = [("A man is riding a bike.", "Ein Mann fährt Fahrrad."),
           ("Two dogs play in the snow near a red house.", "Zwei Hunde spielen im Schnee.")]
  pieces = ctranslate2_model.vocabulary_pieces(vocab_file)
  sources, targets = ([vocab.encode(pair[k]) for pair in pairs] for k in (0, 1))
  results = translator.score_batch([[pieces[t] for t in s[:-1]] for s in sources],
                                   [[pieces[t] for t in t_[:-1]] for t_ in targets])
  for result, source_ids, target_ids in zip(results, sources, targets):
    np.testing.assert_allclose(result.log_probs, _teacher_forced(model, source_ids, target_ids),
                               atol=1e-4, rtol=0)


def test_t2t_score_recovers_the_log_probability():
  # ctranslate2: -3 / 4^0.6 for 4 tokens; tensor2tensor: -3 / (9/6)^0.6.
  assert ctranslate2_decoder.t2t_score(-3.0 / 4 ** 0.6, 4, 0.6) == pytest.approx(
      -3.0 / 1.5 ** 0.6)


@pytest.mark.parametrize("args, message", [
    (["--format=onnx"], "--format=onnx is unknown; supported: saved_model, ctranslate2"),
    (["--quantization=int4", "--format=ctranslate2"], "--quantization=int4 is unknown"),
    (["--quantization=int8"], "--quantization=int8 applies to --format=ctranslate2 only"),
    (["--decode_hparams=beam=4"], "unknown hparam 'beam'; did you mean beam_size?"),
    (["--decode_hparams=return_beams=true", "--format=ctranslate2"],
     "return_beams is a SavedModel setting"),
    (["--decode_hparams=beam_size=0"], "beam_size must be at least 1"),
    (["--decode_from_file=x"], "Unknown command line flag 'decode_from_file'"),
])
def test_exporter_usage_errors_exit_2_with_one_line(args, message, tiny_run, tmp_path):
  export_dir = tmp_path / "export"
  result = cli("t2t-lite-exporter", f"--output_dir={tiny_run['output_dir']}",
               f"--export_dir={export_dir}", *args)
  _assert_usage_error(result, message, "t2t-lite-exporter")
  assert not export_dir.exists()


def _assert_usage_error(result, message, program):
  assert result.returncode == 2, result.stderr
  assert message in result.stderr, result.stderr
  lines = [line for line in result.stderr.splitlines() if line.strip()]
  assert len(lines) == 1 and lines[0].startswith(f"{program}: error:"), result.stderr
  assert "Traceback" not in result.stderr


def test_exporter_refuses_overlapping_and_occupied_export_dirs(tiny_run, tmp_path):
  run = tiny_run["output_dir"]
  for export_dir in (run, os.path.join(run, "export"), os.path.dirname(run)):
    result = cli("t2t-lite-exporter", f"--output_dir={run}", f"--export_dir={export_dir}")
    _assert_usage_error(result, "which the export reads", "t2t-lite-exporter")
  assert not os.path.exists(os.path.join(run, "export"))
  occupied = tmp_path / "occupied"
  occupied.mkdir()
  (occupied / "keep.txt").write_text("mine")
  result = cli("t2t-lite-exporter", f"--output_dir={run}", f"--export_dir={occupied}")
  _assert_usage_error(result, "is not empty; pass --overwrite", "t2t-lite-exporter")
  assert (occupied / "keep.txt").read_text() == "mine"
  # --overwrite replaces an earlier export only, never a folder of other things
  (occupied / "other_model").mkdir()
  (occupied / "other_model" / "weights.bin").write_bytes(b"weights")
  result = cli("t2t-lite-exporter", f"--output_dir={run}", f"--export_dir={occupied}",
               "--overwrite")
  _assert_usage_error(result, "holds files that no t2t-lite export wrote", "t2t-lite-exporter")
  assert sorted(os.listdir(occupied)) == ["keep.txt", "other_model"]
  assert (occupied / "other_model" / "weights.bin").read_bytes() == b"weights"
  empty_run = tmp_path / "no_checkpoint"
  empty_run.mkdir()
  shutil.copy(os.path.join(run, "hparams.json"), empty_run / "hparams.json")
  result = cli("t2t-lite-exporter", f"--output_dir={empty_run}",
               f"--export_dir={tmp_path / 'e'}")
  _assert_usage_error(result, "no checkpoint found", "t2t-lite-exporter")


@pytest.mark.parametrize("args, message", [
    (["--engine=ctranslate2"], "--export_dir is required"),
    (["--engine=onnx"], "--engine"),
    (["--export_dir=somewhere"], "--export_dir is read by --engine=ctranslate2 only"),
])
def test_decoder_engine_usage_errors(args, message, tiny_run, source):
  result = cli("t2t-lite-decoder", f"--output_dir={tiny_run['output_dir']}", *args,
               f"--decode_from_file={source['path']}", "--decode_to_file=never.de")
  _assert_usage_error(result, message, "t2t-lite-decoder")


def test_decoder_refuses_checkpoint_flags_and_other_formats_with_ctranslate2(exported, source,
                                                                             tiny_run):
  args = ["--engine=ctranslate2", f"--decode_from_file={source['path']}",
          "--decode_to_file=never.de"]
  result = cli("t2t-lite-decoder", *args, f"--export_dir={exported['dirs']['ct2']}",
               f"--output_dir={tiny_run['output_dir']}")
  _assert_usage_error(result, "--output_dir is not read with --engine=ctranslate2",
                      "t2t-lite-decoder")
  result = cli("t2t-lite-decoder", *args, f"--export_dir={exported['dirs']['sm_greedy']}")
  _assert_usage_error(result, "holds a saved_model export, not ctranslate2", "t2t-lite-decoder")


def test_killed_export_leaves_no_export_and_the_old_one_whole(exported, tiny_run, tmp_path):
  run = tiny_run["output_dir"]
  fresh, old = tmp_path / "fresh", tmp_path / "old"
  shutil.copytree(exported["dirs"]["ct2"], old)
  before = _tree_digest(old)
  fault = {"T2T_LITE_FAULT": "export:written"}
  killed = [_start("t2t-lite-exporter", f"--output_dir={run}", f"--export_dir={fresh}",
                   "--format=ctranslate2", env=fault),
            _start("t2t-lite-exporter", f"--output_dir={run}", f"--export_dir={old}",
                   "--format=ctranslate2", "--quantization=int8", "--overwrite", env=fault)]
  for process in killed:
    process.communicate(timeout=300)
    assert process.returncode == -9, process.returncode
  assert not fresh.exists()
  assert _tree_digest(old) == before
  export.export_run(run, str(old), "ctranslate2", quantization="int8")  # what --overwrite runs
  with open(old / "t2t_lite_export.json") as f:
    info = json.load(f)
  assert info["quantization"] == "int8" and info["files"] == sorted(os.listdir(old))
  assert info["checkpoint"] == os.path.abspath(tf.train.latest_checkpoint(run))
  # an earlier export beside files it did not write is not replaced
  (old / "README").write_text("notes on this model")
  result = cli("t2t-lite-exporter", f"--output_dir={run}", f"--export_dir={old}",
               "--format=ctranslate2", "--overwrite")
  _assert_usage_error(result, "holds an earlier export and files it did not write (README)",
                      "t2t-lite-exporter")
  os.remove(old / "README")
  # What a killed export leaves is a hidden temporary directory; the next export to the same
  # place clears its own (so only the never-completed "fresh" one's remains).
  left = sorted(os.listdir(tmp_path))
  assert left[-1] == "old" and all(name.startswith(".fresh.tmp-") for name in left[:-1]), left


def test_score_file_with_ctranslate2_matches_ours(exported, tiny_run, tmp_path):
  pairs = [("A man is riding a bike.", "Ein Mann fährt Fahrrad."), ("Kids.", "Kinder."),
           ("Two dogs play in the snow near a red house.", "Zwei Hunde spielen im Schnee.")]
  (tmp_path / "pairs.tsv").write_text("".join(f"{s}\t{t}\n" for s, t in pairs))
  args = [f"--score_file={tmp_path / 'pairs.tsv'}"]
  _finish([
      _start("t2t-lite-decoder", f"--output_dir={tiny_run['output_dir']}", *args,
             f"--decode_to_file={tmp_path / 'ours.txt'}"),
      _start("t2t-lite-decoder", "--engine=ctranslate2",
             f"--export_dir={exported['dirs']['ct2']}", *args,
             f"--decode_to_file={tmp_path / 'theirs.txt'}")])
  ours, theirs = ([float(x) for x in (tmp_path / name).read_text().split()]
                  for name in ("ours.txt", "theirs.txt"))
  assert len(ours) == len(pairs) and all(score < 0 for score in ours)
  np.testing.assert_allclose(theirs, ours, atol=1e-3, rtol=0)


def test_the_export_record_names_the_checkpoint_exported(tiny_run, tmp_path, monkeypatch):
  """The checkpoint is looked up once: a save in the meantime (here, the lookup answering
  otherwise when asked again) cannot make t2t_lite_export.json name another one."""
  run = str(tmp_path / "run")
  shutil.copytree(tiny_run["output_dir"], run)
  from t2t_lite.runs import checkpoints
  real, answers = checkpoints.newest_first, []

  def newest_first(directory, *args, **kwargs):  # a newer checkpoint each time it is asked
    answers.append(os.path.join(run, "ckpt-4") if answers else real(directory)[0])
    return [answers[-1]]

  monkeypatch.setattr(checkpoints, "newest_first", newest_first)
  export.export_run(run, str(tmp_path / "ct2"), "ctranslate2")
  with open(tmp_path / "ct2" / export.INFO_FILE) as f:
    info = json.load(f)
  assert [os.path.basename(a) for a in answers] == ["ckpt-8"]
  assert info["checkpoint"] == os.path.abspath(answers[0])


def test_ctranslate2_samples_with_the_same_options(exported, source, tiny_run):
  """sampling_method=random through --engine=ctranslate2: its own sampler, seeded (a rerun
  draws the same), top-k 1 is its greedy output, other seeds other draws; the draws stay in
  the top-k set (checked through ours: each drawn token among the 3 likeliest)."""
  vocab = SubwordVocab(vocab_path(tiny_run["data_dir"]))
  sources = [vocab.encode(line.strip()) for line in source["lines"][:12] if line.strip()]
  decoder = ctranslate2_decoder.Ctranslate2Decoder(exported["dirs"]["ct2"], EXTRA, 1)
  draw = lambda **options: decoder.translate_nbest(  # noqa: E731
      sources, 1, 0.6, batch_size=0, sampling=decode.Sampling(**options))
  first = draw(seed=3, top_k=3, samples=2)
  assert first == draw(seed=3, top_k=3, samples=2) != draw(seed=4, top_k=3, samples=2)
  assert all(len(draws) == 2 for draws in first)
  greedy = decoder.translate_ids(sources, 1, 0.6, batch_size=0)
  assert [d[0][0] for d in draw(seed=3, top_k=1)] == greedy
  assert [d[0][0] for d in draw(seed=3, temperature=0.0)] == greedy
  run = translator.load(tiny_run["output_dir"])
  for ids, draws in zip(sources[:4], first[:4]):
    drawn = draws[0][0] + [1]
    logits = run.model(tf.constant([ids]), tf.constant([drawn]))[0].numpy()
    logits[:, 0] = -np.inf  # padding, which CTranslate2 is told never to draw
    for position, token in enumerate(drawn[:20]):
      assert token in np.argsort(-logits[position])[:3]
