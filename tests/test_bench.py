"""`make bench` code on a tiny configuration (the benchmarks themselves are not tests)."""

from t2t_lite import bench


def test_train_worker_reports_memory_speed_and_state_bytes():
  spec = {"kind": "train", "hparams_set": "transformer_tiny", "rows": 4, "length": 8,
          "vocab": 100, "n": 2, "warmup_micro_steps": 2, "micro_steps": 2}
  result = bench.run_worker(spec)
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


def test_flop_count_of_a_batch():
  from t2t_lite import registry
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


def test_before_rows_run_right_after_their_now_rows():
  suite = bench.suite(False, "data", "raw", None, before=True)
  names = [name for name, _ in suite]
  befores = [n for n in names if n.startswith("before/")]
  assert sorted(befores) == sorted(f"before/{n}" for n in (
      "profile/n=1", "host_syncs/n=1", "host_syncs/n=4"))
  for name in befores:
    assert names[names.index(name) - 1] == name[len("before/"):]
  # The n=1 speeds are measured in turns with the version before (paired_train).
  assert sorted(n for n, spec in suite if spec.get("paired")) == ["speed/n=1",
                                                                   "speed/n=1/float32"]


def test_paired_train_alternates_the_two_versions():
  """Both processes measure the same micro-steps in turns; the ratios are per block."""
  spec = {"kind": "train", "hparams_set": "transformer_tiny", "rows": 4, "length": 6,
          "vocab": 50, "n": 1, "warmup_micro_steps": 1, "micro_steps": 4}
  now, before = bench.paired_train(spec, bench.REPO, blocks=2)
  assert "error" not in now, now
  for result in (now, before):
    assert result["tokens_per_second"] > 0 and result["peak_rss_mib"] > 0
    assert result["blocks"] == 2 and result["micro_steps_per_block"] == 2
    assert len(result["block_ratios"]) == 2 and all(r > 0 for r in result["block_ratios"])
  row = bench.before_after_rows({"speed/n=1": now, "before/speed/n=1": before})[0]
  assert "in turns, 2 blocks of 2 micro-steps each" in row


def test_paired_train_reports_a_failed_worker():
  spec = {"kind": "train", "hparams_set": "no_such_hparams_set", "rows": 4, "length": 6,
          "vocab": 50, "n": 1, "micro_steps": 2}
  now, before = bench.paired_train(spec, bench.REPO, blocks=2)
  assert now["error"].startswith("paired measurement failed: ") and before == {}
  assert "no_such_hparams_set" in now["error"]


def test_profile_worker_breaks_a_micro_step_down():
  result = bench.run_worker({"kind": "profile", "hparams_set": "transformer_tiny", "rows": 8,
                             "length": 8, "vocab": 100, "n": 2, "micro_steps": 2})
  assert "error" not in result, result
  assert result["seconds_per_micro_step"] > 0 and 0 <= result["host_share"] < 1
  assert abs(sum(result["shares"].values()) - 1.0) < 1e-6
  assert result["shares"]["matmul"] > 0 and result["shares"]["dropout"] > 0
  assert any("MatMul" in op for op in result["op_types"])


def test_xla_row_runs_the_compiled_step_and_compares_it_with_the_plain_one():
  spec = {"kind": "train", "hparams_set": "transformer_tiny", "rows": 4, "length": 8,
          "vocab": 100, "n": 1, "warmup_micro_steps": 1, "micro_steps": 2, "xla_compile": True}
  result = bench.run_worker(spec)
  assert "error" not in result, result
  assert result["tokens_per_second"] > 0
  assert "speed/n=1/xla" in dict(bench.suite(False, None, None, None))
  speed = {"tokens_per_second": 4000.0, "compute_dtype": "bfloat16"}
  results = {"speed/n=1": speed, "speed/n=8": speed,
             "speed/n=1/xla": {"tokens_per_second": 3000.0, "compute_dtype": "bfloat16"}}
  assert ("| --xla_compile (bfloat16, n=1): tokens/s with / without | 3000 / 4000 (0.75x) |"
          in bench.table(results))
