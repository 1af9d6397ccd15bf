"""Decoding benchmarks: the search with and without its cache, and a trained run decoded by
t2t-lite's own search, its SavedModel and its CTranslate2 exports (float32, int8).

    python -m benchmarks.decoding --run_dir=runs/multi30k_ende_avg [--sentences=200]

Each engine decodes in a fresh process: the same test_2016_flickr sentences, beam 4, alpha
0.6, batches of 64 sentences in length order; BLEU through t2t_lite.inference.metrics. `make bench`
runs this after benchmarks/training.py (see benchmarks/run.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from benchmarks.common import import_tf, run_worker, worker_main

MODULE = "benchmarks.decoding"
START = time.perf_counter()
ENGINES = (("tensorflow", "t2t-lite's search"), ("saved_model", "SavedModel"),
           ("ctranslate2_float32", "CTranslate2 float32"), ("ctranslate2_int8", "CTranslate2 int8"))
OPTIONS = {"beam_size": 4, "alpha": 0.6, "batch_size": 64}
# What back-translation by sampling would use (Edunov et al. 2018: unrestricted sampling;
# a top-k of 10 is their other variant): the cost is of the draw, not of k
SAMPLING_SPEC = {"temperature": 1.0, "top_k": 10}


def worker_cache(spec: dict) -> dict:
  """Sentences per second translating test_2016_flickr (greedy / beam 4, cached / not), with
  the trained model of spec["run_dir"] or, without one, an untrained transformer_multi30k_cpu
  (which decodes to the length limit: slower, but the ratio is what this row shows)."""
  import_tf()
  from t2t_lite.inference import translator
  from t2t_lite.core import registry
  from t2t_lite.data.text import read_lines
  if spec.get("run_dir"):
    run = translator.load(spec["run_dir"])
  else:
    hparams = registry.hparams("transformer_multi30k_cpu")
    problem = registry.problem("translate_ende_multi30k")
    vocab = problem.get_vocab(spec["data_dir"])
    run = translator.RunModel(registry.model("transformer")(hparams, vocab.size), vocab, hparams,
                             problem, None, spec["data_dir"])
  lines = read_lines(spec["source"])[:spec["sentences"]]
  sources = run.vocab.encode_batch(lines)
  decoder = run.decoder(translator.DecodeOptions())
  results = {}
  timed = lambda name, decoder, beam, cached=True, sampling=None: results.__setitem__(  # noqa: E731
      name, _sentences_per_second(decoder, sources, beam, cached, sampling))
  for beam in (1, 4):
    for cached in (True, False):
      timed(f"beam{beam}_{'cached' if cached else 'uncached'}", decoder, beam, cached)
  from t2t_lite.inference import decode
  timed("sampling", decoder, 1, sampling=decode.Sampling(**SAMPLING_SPEC))
  # An ensemble of two: the model twice (its speed is what this row shows)
  pair = decode.Decoder(decode.Ensemble([run.model, run.model]), run.hparams.max_length,
                        translator.DecodeOptions().extra_decode_length)
  for beam in (1, 4):
    timed(f"ensemble2_beam{beam}", pair, beam)
  results["trained_model"] = bool(spec.get("run_dir"))
  return results


def _sentences_per_second(decoder, sources, beam: int, cached: bool, sampling) -> float:
  """Sentences per second of `decoder` translating `sources` in batches of 64 (after a first
  batch that traces the search)."""
  decoder.translate_ids(sources[:8], beam, 0.6, 64, cached, sampling=sampling)  # trace
  start = time.perf_counter()
  decoder.translate_ids(sources, beam, 0.6, 64, cached, sampling=sampling)
  return len(sources) / (time.perf_counter() - start)


def _tensorflow(spec, options):
  from t2t_lite.inference import translator
  run = translator.load(spec["run_dir"])
  return run.translator(options)


def _ctranslate2(spec, options):
  from t2t_lite.inference import translator
  from t2t_lite.inference.export.ctranslate2_decoder import Ctranslate2Decoder
  from t2t_lite.data.vocab import SubwordVocab
  decoder = Ctranslate2Decoder(spec["export_dir"], options.extra_decode_length)
  return translator.Translator(decoder, SubwordVocab(decoder.vocab_file), decoder.max_length,
                              options)


def _saved_model(spec, options):
  """Strings into the export's serving_default signature (beam and alpha were fixed at
  export), in the batches the decoder would make (by subword length, batch_size sentences)."""
  import tensorflow as tf
  import tensorflow_text  # noqa: F401  (registers the SentencePiece ops)
  from t2t_lite.inference.batches import decode_batches
  from t2t_lite.inference.export import VOCAB_FILE, read_info
  from t2t_lite.data.vocab import SubwordVocab
  translate = tf.saved_model.load(spec["export_dir"]).signatures["serving_default"]
  vocab = SubwordVocab(os.path.join(spec["export_dir"], "assets", VOCAB_FILE))
  max_length = read_info(spec["export_dir"], "saved_model")["max_length"]

  def run(lines):
    out = [""] * len(lines)
    lengths = [[0] * len(vocab.encode(line)) for line in lines]
    for chunk in decode_batches(lengths, max_length, options.batch_size):
      texts = translate(inputs=tf.constant([lines[i] for i in chunk]))["translations"].numpy()
      for i, text in zip(chunk, texts):
        out[i] = (text if isinstance(text, bytes) else text[0]).decode("utf-8")
    return out
  return run


def worker_engine(spec: dict) -> dict:
  """Decodes spec["source"] with one engine in this process: seconds of each stage,
  sentences/s and BLEU (target language German)."""
  times = {"python_seconds": time.perf_counter() - START}
  mark = time.perf_counter()
  import_tf()
  from t2t_lite.inference import translator, metrics
  from t2t_lite.data.text import read_lines
  times["import_seconds"] = time.perf_counter() - mark
  options = translator.DecodeOptions(**OPTIONS)
  lines = [line.strip() for line in read_lines(spec["source"])]
  if spec.get("sentences"):
    lines = lines[:spec["sentences"]]
  mark = time.perf_counter()
  engine = spec["engine"].split("_float32")[0].split("_int8")[0]
  translate = {"tensorflow": _tensorflow, "saved_model": _saved_model,
               "ctranslate2": _ctranslate2}[engine](spec, options)
  times["build_seconds"] = time.perf_counter() - mark
  mark = time.perf_counter()
  translate(lines[:2])  # the first call traces or prepares the search
  times["trace_seconds"] = time.perf_counter() - mark
  mark = time.perf_counter()
  translations = translate(lines)
  seconds = time.perf_counter() - mark
  result = {**times, "decode_seconds": seconds, "sentences": len(lines),
            "sentences_per_second": len(lines) / seconds}
  if spec.get("reference"):
    references = read_lines(spec["reference"])[:len(lines)]
    result["bleu"] = metrics.bleu(translations, references, "de").score
  return result


def compare_engines(run_dir: str, raw_dir: str, out_dir: str, sentences: int = 0) -> dict:
  """`run_dir` decoded by each engine of ENGINES, one fresh process each, one after another;
  the exports are made first into out_dir/exports (not timed)."""
  exports = os.path.join(out_dir, "exports")
  exporter = [os.path.join(os.path.dirname(sys.executable), "t2t-lite-exporter"),
              f"--output_dir={run_dir}", "--overwrite",
              f"--decode_hparams=beam_size={OPTIONS['beam_size']},alpha={OPTIONS['alpha']}"]
  for name, args in (("saved_model", []), ("ctranslate2_float32", ["--format=ctranslate2"]),
                     ("ctranslate2_int8", ["--format=ctranslate2", "--quantization=int8"])):
    done = subprocess.run([*exporter, f"--export_dir={os.path.join(exports, name)}", *args],
                          capture_output=True, text=True)
    if done.returncode:
      return {"error": f"export {name}: {done.stderr.strip().splitlines()[-1]}"}
  spec = {"run_dir": run_dir, "sentences": sentences,
          "source": os.path.join(raw_dir, "test_2016_flickr.en.gz"),
          "reference": os.path.join(raw_dir, "test_2016_flickr.de.gz")}
  results = {"_sentences": sentences or 1000}
  for name, _ in ENGINES:
    start = time.perf_counter()
    results[name] = run_worker(MODULE, {**spec, "kind": "engine", "engine": name,
                                        "export_dir": os.path.join(exports, name)})
    results[name]["process_seconds"] = time.perf_counter() - start
  return results


def table_rows(results: dict) -> list[str]:
  """The cache rows, then per engine: sentences/s while decoding (start-up excluded), its
  ratio to t2t-lite's search, decoding and whole-process seconds, BLEU."""
  rows = []
  d = results.get("decode/cache", {})
  if "beam4_cached" in d:
    model = "trained" if d.get("trained_model") else "untrained"
    rows.append(f"| decode sentences/s ({model} model), greedy cached / uncached | "
                f"{d['beam1_cached']:.1f} / {d['beam1_uncached']:.1f} "
                f"({d['beam1_cached'] / d['beam1_uncached']:.1f}x) |")
    rows.append(f"| decode sentences/s ({model} model), beam 4 cached / uncached | "
                f"{d['beam4_cached']:.1f} / {d['beam4_uncached']:.1f} "
                f"({d['beam4_cached'] / d['beam4_uncached']:.1f}x) |")
  if "sampling" in d:
    rows.append(f"| decode sentences/s ({model} model), greedy / sampling (top-k 10) | "
                f"{d['beam1_cached']:.1f} / {d['sampling']:.1f} "
                f"({d['sampling'] / d['beam1_cached']:.2f}x) |")
    for beam, name in ((1, "greedy"), (4, "beam 4")):
      ours, pair = d[f"beam{beam}_cached"], d[f"ensemble2_beam{beam}"]
      rows.append(f"| decode sentences/s ({model} model), {name}: one model / an ensemble of "
                  f"two | {ours:.1f} / {pair:.1f} ({pair / ours:.2f}x) |")
  engines = results.get("decode/engines", {})
  ours = engines.get("tensorflow", {}).get("sentences_per_second")
  for name, label in ENGINES:
    r = engines.get(name)
    if r is None:
      continue
    if "sentences_per_second" not in r:
      rows.append(f"| decode, {label} | {r.get('error', 'not measured')} |")
      continue
    ratio = f" ({r['sentences_per_second'] / ours:.1f}x)" if ours and name != "tensorflow" else ""
    rows.append(f"| decode {engines.get('_sentences', 1000)} test_2016_flickr sentences, beam "
                f"4, batch 64: {label} | {r['sentences_per_second']:.1f} sentences/s{ratio}; "
                f"{r['decode_seconds']:.1f} s decoding, {r['process_seconds']:.1f} s whole "
                f"process; BLEU {r.get('bleu', float('nan')):.2f} |")
  if "error" in engines:
    rows.append(f"| decode engines | {engines['error']} |")
  return rows


def measure(quick: bool, data_dir: str | None, raw_dir: str, run_dir: str | None,
            out_dir: str) -> dict:
  """The cache rows (with data) and the engine comparison (with a trained run)."""
  results = {}
  source = os.path.join(raw_dir, "test_2016_flickr.en.gz")
  if data_dir and os.path.isfile(source):
    results["decode/cache"] = run_worker(MODULE, {
        "kind": "cache", "data_dir": data_dir, "run_dir": run_dir, "source": source,
        "sentences": 16 if quick else 200})
    print(f"decode/cache: {json.dumps(results['decode/cache'])}", flush=True)
  if run_dir:
    results["decode/engines"] = compare_engines(run_dir, raw_dir, out_dir,
                                                20 if quick else 0)
    print(f"decode/engines: {json.dumps(results['decode/engines'])}", flush=True)
  return results


WORKERS = {"cache": worker_cache, "engine": worker_engine}

if __name__ == "__main__" and not worker_main(WORKERS):
  from benchmarks import run
  run.main(["--decoding_only", *sys.argv[1:]])
