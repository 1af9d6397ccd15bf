"""`make bench` code on tiny configurations (the benchmarks themselves are not tests)."""

import os

from benchmarks import common, decoding, run
from benchmarks import input as input_bench
from benchmarks import training as bench
from conftest import multi30k_dir


def test_train_worker_reports_memory_speed_and_state_bytes():
  spec = {"kind": "train", "hparams_set": "transformer_tiny", "rows": 4, "length": 8,
          "vocab": 100, "n": 2, "warmup_micro_steps": 2, "micro_steps": 2}
  result = common.run_worker(bench.MODULE, spec)
  assert "error" not in result, result
  assert result["tokens_per_second"] > 0 and result["peak_rss_mib"] > 100
  assert result["accumulators_mib"] == result["parameters_mib"] > 0
  assert result["adam_slots_mib"] == 2 * result["parameters_mib"]


def test_table_judges_the_memory_target():
  state = {"parameters_mib": 10.0, "adam_slots_mib": 20.0}
  results = {
      "memory/transformer_multi30k_cpu/n=1": {"peak_rss_mib": 1000.0, **state,
                                              "accumulators_mib": 0.0},
      "memory/transformer_multi30k_cpu/n=2": {"peak_rss_mib": 1055.0, **state,
                                              "accumulators_mib": 10.0},
      "memory/transformer_multi30k_cpu/n=4": {"peak_rss_mib": 1070.0, **state,
                                              "accumulators_mib": 10.0},
  }
  text = bench.table(results)
  assert "peak RSS at n=2 | 1055 MiB (+55 vs n=1; target <= +60: within target)" in text
  assert "peak RSS at n=4 | 1070 MiB (+70 vs n=1; target <= +60: OVER target)" in text


def test_the_table_judges_the_moving_averages_cost_and_frozen_memory():
  """(The worker, benchmarks.training.worker_ema_speed, runs in `make bench`.)"""
  state = {"parameters_mib": 10.0, "adam_slots_mib": 20.0, "accumulators_mib": 0.0}
  text = bench.table({
      "memory/transformer_multi30k_cpu/n=1": {"peak_rss_mib": 1000.0, **state},
      "memory/transformer_multi30k_cpu/n=1/ema": {"peak_rss_mib": 1012.0, **state,
                                                  "moving_average_mib": 10.0},
      "speed/n=1": {"tokens_per_second": 100.0}, "speed/n=8": {"tokens_per_second": 100.0},
      "speed/n=1/ema": {"tokens_per_second_on": 96.0, "tokens_per_second_off": 100.0,
                        "ratio": 0.96, "rounds": 7, "compute_dtype": "bfloat16"}})
  assert ("peak RSS at n=1 with the moving average of the weights | 1012 MiB (+12 vs "
          "without; the average: 10.0 MiB)") in text
  assert "tokens/s on / off, median of 7 alternating blocks | 96 / 100 (0.960; target >= " \
         "0.97: OVER target)" in text
  assert "peak RSS at n=1/ema" not in text
  frozen = bench.table({
      "memory/transformer_base/n=1": {"peak_rss_mib": 1000.0, **state},
      "memory/transformer_base/n=2": {"peak_rss_mib": 1100.0, "parameters_mib": 10.0,
                                      "adam_slots_mib": 20.0, "accumulators_mib": 10.0},
      "memory/transformer_base/n=2/frozen": {"peak_rss_mib": 1040.0, "parameters_mib": 10.0,
                                             "adam_slots_mib": 8.0, "accumulators_mib": 4.0}})
  assert ("transformer_base, n=2, frozen_parts=embeddings;encoder: peak RSS; Adam slots / "
          "accumulators | 1040 MiB (-60 vs nothing frozen); 8.0 / 4.0 MiB (against 20.0 / "
          "10.0) |") in frozen


def test_flop_count_of_a_batch():
  from t2t_lite.core import registry
  hparams = registry.hparams("transformer_multi30k_cpu")
  flops = bench.matmul_flops_per_batch(hparams, 8000, 128, 32, 32)
  # about 6 x (non-embedding parameters + softmax) x tokens, plus attention
  assert 1.8e11 < flops < 2.0e11


def test_table_compares_packed_and_per_tensor_sums():
  member = {"variables": 55, "tensors": 57}
  results = {"two_workers/transformer_tiny/n=1": {
      "packed": {**member, "collective_ops": 1, "seconds_per_update": 0.2},
      "per_tensor": {**member, "collective_ops": 57, "seconds_per_update": 0.3}}}
  assert ("| 2 local workers, transformer_tiny n=1 (55 variables): collective ops and "
          "s/update, packed / one per tensor | 1, 0.200 s / 57, 0.300 s (1.5x) |"
          in bench.table(results))


def test_profile_worker_breaks_a_micro_step_down():
  """In this process (the worker's own process is run_worker's, tested above)."""
  result = bench.worker_profile({"hparams_set": "transformer_tiny", "rows": 8, "length": 8,
                                 "vocab": 100, "n": 2, "micro_steps": 2})
  assert "error" not in result, result
  assert result["seconds_per_micro_step"] > 0 and 0 <= result["host_share"] < 1
  assert abs(sum(result["shares"].values()) - 1.0) < 1e-6
  assert result["shares"]["matmul"] > 0 and result["shares"]["dropout"] > 0
  assert any("MatMul" in op for op in result["op_types"])


def test_xla_row_compares_the_compiled_step_with_the_plain_one():
  """(The compiled step itself is tested in test_multistep.py and test_train.py.)"""
  assert dict(bench.suite(False, None))["speed/n=1/xla"]["xla_compile"] is True
  speed = {"tokens_per_second": 4000.0, "compute_dtype": "bfloat16"}
  results = {"speed/n=1": speed, "speed/n=8": speed,
             "speed/n=1/xla": {"tokens_per_second": 3000.0, "compute_dtype": "bfloat16"}}
  assert ("| --xla_compile (bfloat16, n=1): tokens/s with / without | 3000 / 4000 (0.75x) |"
          in bench.table(results))


def test_the_rows_that_read_data_run_only_with_a_data_directory():
  with_data = {name for name, _ in bench.suite(False, "data")}
  without = {name for name, _ in bench.suite(False, None)}
  assert with_data - without == {"host_syncs/n=1", "host_syncs/n=4"}
  assert input_bench.measure(False, None) == {}


def test_the_input_workers_before_and_after(multi30k_data):
  """One worker's input before (tf.data, whose iterator a checkpoint held) and after (the
  planned stream), as one of 1 and of 64 replicas; the plan of a synthetic corpus. The
  workers run in this process (run_worker's own process is tested above)."""
  before = input_bench.worker_before({"data_dir": multi30k_data, "batches": 10})
  after = input_bench.worker_after({"data_dir": multi30k_data, "batches": 10, "replicas": 64})
  plan = input_bench.worker_plan({"pairs": 20000})
  for result in (before, after, plan):
    assert "error" not in result, result
  assert before["iterator_bytes"] > 1e6  # the shuffle buffer's examples
  assert after["batches_per_second"] > 0 and 0 < after["padding_fraction"] < 0.2
  assert plan["pairs"] == 20000 and plan["batches"] > 100 and plan["plan_mib"] > 0
  results = {"input/before": before, "input/after/replicas=64": after, "input/plan": plan,
             "input/workers=2": {"workers": 2, "updates": 2, "read": [[300, 4], [310, 4]]}}
  rows = "\n".join(input_bench.table_rows(results))
  assert "| input of one worker's micro-step at 64 replica(s)" in rows
  assert "| plan of 20,000 synthetic pairs" in rows
  assert "examples read in 2 updates by each of N localhost workers (transformer_tiny, 4 " \
      "micro-batches an update) | 2: 300 + 310 = 610 |" in rows


def test_the_table_goes_between_the_markers_of_its_page(tmp_path):
  page = tmp_path / "performance.md"
  page.write_text("# Performance\nprose\n<!-- make bench: begin -->\nold table\n"
                  "<!-- make bench: end -->\nmore prose\n")
  assert common.write_block(run.MARKER, "| a | b |\n", str(page))
  assert page.read_text() == ("# Performance\nprose\n<!-- make bench: begin -->\n| a | b |\n"
                              "<!-- make bench: end -->\nmore prose\n")
  other = tmp_path / "other.md"
  other.write_text("no markers\n")
  assert not common.write_block(run.MARKER, "| a | b |\n", str(other))
  assert other.read_text() == "no markers\n"
  assert not common.write_block(run.MARKER, "x", str(tmp_path / "missing.md"))


def test_the_performance_page_has_the_markers_of_both_benchmarks():
  with open(common.PERFORMANCE_DOC) as f:
    page = f.read()
  for name in ("make bench", "make bench-fairseq"):
    assert page.count(f"<!-- {name}: begin -->") == 1 == page.count(f"<!-- {name}: end -->")


def test_the_engine_worker_decodes_a_run_through_the_inference_layer(tiny_run):
  """t2t-lite's own search on a trained run, as the engine comparison times it; BLEU is
  scored by t2t_lite.metrics."""
  raw = multi30k_dir()
  result = decoding.worker_engine({
      "engine": "tensorflow", "run_dir": tiny_run["output_dir"], "sentences": 6,
      "source": os.path.join(raw, "test_2016_flickr.en.gz"),
      "reference": os.path.join(raw, "test_2016_flickr.de.gz")})
  assert result["sentences"] == 6 and result["sentences_per_second"] > 0
  assert 0 <= result["bleu"] <= 100
  rows = decoding.table_rows({"decode/engines": {
      "_sentences": 6, "tensorflow": {**result, "process_seconds": 9.0},
      "ctranslate2_int8": {**result, "sentences_per_second": 2 * result["sentences_per_second"],
                           "process_seconds": 4.0}}})
  assert "t2t-lite's search | " in rows[0] and "(2.0x)" in rows[1]


def test_the_decoding_rows_state_sampling_and_an_ensemble_against_one_model():
  rows = decoding.table_rows({"decode/cache": {
      "beam1_cached": 40.0, "beam1_uncached": 10.0, "beam4_cached": 20.0,
      "beam4_uncached": 4.0, "sampling": 36.0, "ensemble2_beam1": 21.0,
      "ensemble2_beam4": 11.0, "trained_model": True}})
  assert rows[2] == ("| decode sentences/s (trained model), greedy / sampling (top-k 10) | "
                     "40.0 / 36.0 (0.90x) |")
  assert rows[3].endswith("greedy: one model / an ensemble of two | 40.0 / 21.0 (0.53x) |")
  assert rows[4].endswith("beam 4: one model / an ensemble of two | 20.0 / 11.0 (0.55x) |")
