"""Speed of the exports, each measurement in a fresh process, as t2t_lite/decode_speed.py
measures t2t-lite's own decoder (the same result fields, so the bench puts them in one table).

    python t2t_lite/export/serving_speed.py '{"engine": "ctranslate2", "export_dir": "...",
        "source": "test.en.gz", "reference": "test.de.gz", "beam_size": 4}'

engine "saved_model": strings into the `serving_default` signature (its beam and alpha were
fixed at export), loaded with only tensorflow and tensorflow_text; engine "ctranslate2":
Ctranslate2Decoder, as `t2t-lite-decoder --engine=ctranslate2` decodes. Both decode the
sources in the decoder's batches (length order, `batch_size` sentences).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

START = time.perf_counter()


def _saved_model(spec, lines):
  mark = time.perf_counter()
  import tensorflow as tf
  import tensorflow_text  # noqa: F401  (registers the SentencePiece ops)
  imported = time.perf_counter() - mark
  mark = time.perf_counter()
  translate = tf.saved_model.load(spec["export_dir"]).signatures["serving_default"]
  built = time.perf_counter() - mark

  def run(indices):
    out = translate(inputs=tf.constant([lines[i] for i in indices]))["translations"].numpy()
    return [t.decode("utf-8") if isinstance(t, bytes) else t[0].decode("utf-8") for t in out]
  return imported, built, run


def _ctranslate2(spec, lines):
  mark = time.perf_counter()
  from t2t_lite.export.ctranslate2_decoder import Ctranslate2Decoder
  from t2t_lite.problems.vocab import SubwordVocab
  imported = time.perf_counter() - mark
  mark = time.perf_counter()
  decoder = Ctranslate2Decoder(spec["export_dir"], spec.get("extra_decode_length", 50))
  vocab = SubwordVocab(decoder.vocab_file)
  built = time.perf_counter() - mark

  def run(indices):
    sources = [vocab.encode(lines[i]) for i in indices]
    outputs = decoder.translate_ids(sources, spec.get("beam_size", 4), spec.get("alpha", 0.6),
                                    batch_size=len(sources))
    return [vocab.decode(ids) for ids in outputs]
  return imported, built, run


def measure(spec: dict) -> dict:
  """Translates spec["source"] in this process; seconds of each stage, sentences/s, BLEU."""
  from t2t_lite.batching import decode_batches
  from t2t_lite.export import VOCAB_FILE
  from t2t_lite.problems.base import read_lines
  import sentencepiece as spm
  times = {"python_seconds": time.perf_counter() - START}
  lines = [line.strip() for line in read_lines(spec["source"])]
  if spec.get("sentences"):
    lines = lines[:spec["sentences"]]
  # Batches by subword length, as the decoder makes them (the tokenizer is only for sorting).
  with open(os.path.join(spec["export_dir"], "t2t_lite_export.json")) as f:
    info = json.load(f)
  vocab_file = os.path.join(spec["export_dir"], VOCAB_FILE)
  if spec["engine"] == "saved_model":
    vocab_file = os.path.join(spec["export_dir"], "assets", VOCAB_FILE)
  lengths = [[0] * (n + 1) for n in
             map(len, spm.SentencePieceProcessor(model_file=vocab_file).encode(lines))]
  chunks = decode_batches(lengths, info["max_length"], spec.get("batch_size", 64))
  engine = _saved_model if spec["engine"] == "saved_model" else _ctranslate2
  times["import_seconds"], times["build_seconds"], run = engine(spec, lines)
  mark = time.perf_counter()
  run(chunks[0][:2])  # the first call (graph preparation)
  times["trace_seconds"] = time.perf_counter() - mark
  translations = [""] * len(lines)
  mark = time.perf_counter()
  for chunk in chunks:
    for i, translation in zip(chunk, run(chunk)):
      translations[i] = translation
  seconds = time.perf_counter() - mark
  result = {**times, "decode_seconds": seconds, "sentences": len(lines),
            "sentences_per_second": len(lines) / seconds}
  if spec.get("reference"):
    import sacrebleu
    references = read_lines(spec["reference"])[:len(lines)]
    result["bleu"] = sacrebleu.corpus_bleu(translations, [references]).score
  return result


def measure_process(spec: dict, timeout: int = 1800) -> dict:
  """`measure(spec)` in a fresh process, plus its whole wall time ("process_seconds")."""
  start = time.perf_counter()
  result = subprocess.run([sys.executable, os.path.abspath(__file__), json.dumps(spec)],
                          capture_output=True, text=True, timeout=timeout)
  if result.returncode != 0:
    return {"error": (result.stderr.strip().splitlines() or ["failed"])[-1]}
  return {**json.loads(result.stdout.strip().splitlines()[-1]),
          "process_seconds": time.perf_counter() - start}


if __name__ == "__main__":
  sys.path.remove(os.path.dirname(os.path.abspath(__file__)))  # not the package's own folder
  print(json.dumps(measure(json.loads(sys.argv[1]))))
