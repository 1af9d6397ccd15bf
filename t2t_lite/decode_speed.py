"""Speed of t2t-lite's own decoder, each measurement in a fresh process.

    python t2t_lite/decode_speed.py '{"output_dir": "runs/multi30k_ende_avg",
        "source": "test.en.gz", "reference": "test.de.gz", "beam_size": 4}'

`measure_process(spec, package_root)` runs `measure(spec)` in a new Python whose `t2t_lite`
is the package under `package_root` (default: this one), so that this version and an older
one (`git archive <commit> t2t_lite | tar -x -C DIR`) compare in one run. It uses only
`Decoder.translate_ids` and `load_model`, which every version has. `cli_process` times the
whole `t2t-lite-decoder` process of a version, start-up included.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

START = time.perf_counter()


def measure(spec: dict) -> dict:
  """Decodes spec["source"] in this process; seconds of each stage, sentences/s and BLEU.

  spec: output_dir (a run or averaged run), checkpoint_path, data_dir (default: the run's),
  source, reference (optional: BLEU), beam_size (4), alpha (0.6), batch_size (sentences, 64),
  batch_tokens (source tokens, padding included, per batch; 0: not limited; versions
  without it refuse it), sentences (0: all), use_cache (true).
  """
  times = {"python_seconds": time.perf_counter() - START}
  mark = time.perf_counter()
  from t2t_lite.cli.common import import_tensorflow
  tf = import_tensorflow()
  from t2t_lite import decode
  from t2t_lite.cli.decoder import load_model
  from t2t_lite.problems.base import read_lines
  times["import_seconds"] = time.perf_counter() - mark

  mark = time.perf_counter()
  model, vocab, hparams = load_model(spec["output_dir"], spec.get("checkpoint_path"), None, "",
                                     None, spec.get("data_dir"))
  lines = read_lines(spec["source"])
  if spec.get("sentences"):
    lines = lines[:spec["sentences"]]
  sources = [vocab.encode(line.strip()) for line in lines]
  times["build_seconds"] = time.perf_counter() - mark

  decoder = decode.Decoder(model, hparams.max_length, spec.get("extra_decode_length", 50))
  options = (spec.get("beam_size", 4), spec.get("alpha", 0.6), spec.get("batch_size", 64),
             spec.get("use_cache", True))
  extra = {"batch_tokens": spec["batch_tokens"]} if spec.get("batch_tokens") else {}
  mark = time.perf_counter()
  decoder.translate_ids(sources[:2], *options, **extra)  # the first trace
  times["trace_seconds"] = time.perf_counter() - mark

  mark = time.perf_counter()
  outputs = decoder.translate_ids(sources, *options, **extra)
  seconds = time.perf_counter() - mark
  translations = [vocab.decode(ids) for ids in outputs]
  result = {**times, "decode_module": decode.__file__, "decode_seconds": seconds,
            "sentences": len(sources), "sentences_per_second": len(sources) / seconds,
            "target_tokens": sum(len(ids) + 1 for ids in outputs)}
  if spec.get("reference"):
    import sacrebleu
    references = read_lines(spec["reference"])[:len(lines)]
    result["bleu"] = sacrebleu.corpus_bleu(translations, [references]).score
  if spec.get("translations_to"):
    with open(spec["translations_to"], "w", encoding="utf-8") as f:
      f.write("".join(t + "\n" for t in translations))
  return result


def _environment(package_root: str | None) -> dict:
  env = dict(os.environ)
  if package_root:  # its t2t_lite comes before the installed one
    env["PYTHONPATH"] = os.pathsep.join([package_root, env.get("PYTHONPATH", "")]).rstrip(
        os.pathsep)
  return env


def measure_process(spec: dict, package_root: str | None = None, timeout: int = 1800) -> dict:
  """`measure(spec)` in a fresh process (t2t_lite from package_root when given), plus the
  process's whole wall time ("process_seconds"); {"error": ...} when it fails."""
  start = time.perf_counter()
  result = subprocess.run([sys.executable, os.path.abspath(__file__), json.dumps(spec)],
                          capture_output=True, text=True, env=_environment(package_root),
                          timeout=timeout, cwd=os.getcwd())
  if result.returncode != 0:
    return {"error": (result.stderr.strip().splitlines() or ["failed"])[-1]}
  return {**json.loads(result.stdout.strip().splitlines()[-1]),
          "process_seconds": time.perf_counter() - start}


def cli_process(args: list[str], package_root: str | None = None, timeout: int = 1800) -> dict:
  """Wall seconds of one whole t2t-lite-decoder process (of package_root's version)."""
  start = time.perf_counter()
  # -P: not the working directory's t2t_lite before package_root's.
  result = subprocess.run([sys.executable, "-P", "-c",
                           "from t2t_lite.cli.decoder import run; run()", *args],
                          capture_output=True, text=True,
                          env=_environment(package_root), timeout=timeout)
  if result.returncode != 0:
    return {"error": (result.stderr.strip().splitlines() or ["failed"])[-1]}
  return {"process_seconds": time.perf_counter() - start}


if __name__ == "__main__":
  sys.path.remove(os.path.dirname(os.path.abspath(__file__)))  # not the package's own folder
  print(json.dumps(measure(json.loads(sys.argv[1]))))
