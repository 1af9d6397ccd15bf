"""The fairseq comparison's data export, log reading and flags (fairseq itself is not a
dependency: the comparison runs where --fairseq_bin points at an install of it)."""


import pytest
import sentencepiece as spm

from benchmarks import fairseq as bench_fairseq
from t2t_lite.core import hparams_check, registry

# fairseq-train's own lines, as long as it writes them.
FAIRSEQ_LOG = """\
2026-12-03 07:31:02 | INFO | train_inner | epoch 001:     10 / 136 loss=13.941, nll_loss=13.918, ppl=15474.6, wps=1951.6, ups=0.57, wpb=3425.8, bsz=244, num_updates=10, lr=8e-05, gnorm=3.977, train_wall=19, wall=20
2026-12-03 07:31:18 | INFO | train_inner | epoch 001:     20 / 136 loss=12.35, nll_loss=12.194, ppl=4684.38, wps=2000, ups=0.62, wpb=3000, bsz=220, num_updates=20, lr=0.00016, gnorm=2.079, train_wall=16, wall=37
2026-12-03 07:31:33 | INFO | train_inner | epoch 001:     30 / 136 loss=11.14, nll_loss=10.844, ppl=1837.55, wps=4000, ups=0.7, wpb=4000, bsz=200, num_updates=30, lr=0.00024, gnorm=1.401, train_wall=14, wall=51
2026-12-03 07:31:33 | INFO | train | epoch 001 | loss 9.963 | nll_loss 9.459 | ppl 703.91 | wps 2404.2 | ups 0.7 | wpb 3432.3 | bsz 212.6 | num_updates 30 | lr 0.0008
"""


def test_fairseq_log_windows_give_tokens_over_seconds():
  points = bench_fairseq.fairseq_progress(FAIRSEQ_LOG)
  assert points == [(10, 1951.6, 3425.8), (20, 2000.0, 3000.0), (30, 4000.0, 4000.0)]
  # After update 10: (10, 20] is 30,000 tokens in 15 s and (20, 30] 40,000 tokens in 10 s.
  assert bench_fairseq.tokens_per_second(points, 10) == pytest.approx(70000 / 25)
  assert bench_fairseq.tokens_per_second(points, 20) == pytest.approx(4000)
  with pytest.raises(ValueError, match="no progress lines after update 30"):
    bench_fairseq.tokens_per_second(points, 30)


def test_trainer_progress_lines_are_read(tiny_run):
  points = bench_fairseq.t2t_progress(tiny_run["first"].stderr)
  assert [update for update, _, _ in points] == [1, 2, 3, 4]
  assert all(rate > 0 and 0 < per_update <= 2 * 512 for _, rate, per_update in points)
  windows = points[1:]
  expected = (sum(t for _, _, t in windows) / sum(t / r for _, r, t in windows))
  assert bench_fairseq.tokens_per_second(points, 1) == pytest.approx(expected)


def test_training_shards_become_fairseq_text_with_our_pieces(sampled_data, tmp_path):
  """(On the 3,000 pairs of sampled_data: its one-best split is what fairseq reads.)"""
  import tensorflow as tf
  from t2t_lite.data.eval_input import parse_example
  problem = registry.problem("translate_ende_multi30k")
  multi30k_data = sampled_data
  counts = bench_fairseq.write_fairseq_text(multi30k_data, problem.name, str(tmp_path))
  files = problem.data_files(multi30k_data, "train")
  examples = list(tf.data.TFRecordDataset(files).map(parse_example).take(300)
                  .as_numpy_iterator())
  model = spm.SentencePieceProcessor(model_file=problem.vocab_file(multi30k_data))
  for suffix, name in (("src", "inputs"), ("tgt", "targets")):
    with open(tmp_path / f"train.{suffix}", encoding="utf-8") as text:
      lines = text.read().splitlines()
    assert len(lines) == counts["sentences"] == 3000
    for line, example in zip(lines, examples):  # our ids, less the end-of-sentence id
      assert [model.piece_to_id(piece) for piece in line.split(" ")] == list(example[name][:-1])
    with open(tmp_path / f"valid.{suffix}", encoding="utf-8") as valid:
      assert valid.read().splitlines() == lines[:100]
  assert counts["target_tokens"] > counts["sentences"] * 5
  with open(tmp_path / "dict.txt", encoding="utf-8") as dictionary:
    entries = [line.split(" ") for line in dictionary.read().splitlines()]
  assert len(entries) == model.get_piece_size() - 3  # padding, end of sentence, unknown
  assert {piece for piece, _ in entries}.isdisjoint({"<pad>", "</s>", "<unk>"})


def test_a_folder_without_fairseq_is_a_usage_error(tmp_path, capsys):
  with pytest.raises(SystemExit) as exit_info:
    bench_fairseq.main([f"--fairseq_bin={tmp_path}", f"--data_dir={tmp_path}"])
  assert exit_info.value.code == 2
  assert f"--fairseq_bin={tmp_path} has no fairseq-preprocess" in capsys.readouterr().err


def test_table_gives_each_programs_median_and_its_ratio_to_fairseq():
  def rounds(*pairs):
    return [{"tokens_per_second": speed, "peak_rss_mib": rss} for speed, rss in pairs]

  results = {"cpu": "Some CPU, 2 cores", "default_precision": "bfloat16",
             "updates_measured": "updates 20-100",
             "rounds": {"fairseq": rounds((2000, 2000), (2500, 2100), (2400, 1900)),
                        "t2t-lite float32": rounds((3600, 1700), (3700, 1700), (3000, 1800)),
                        "t2t-lite default": rounds((7200, 1600), (6000, 1700), (7000, 1640))}}
  text = bench_fairseq.table(results)
  assert text.startswith("Some CPU, 2 cores; default precision bfloat16.")
  assert "| program (updates 20-100, 3 round(s), medians) |" in text
  assert "| fairseq | 2,400 | 1.00x | 2,000 | 1.00x |" in text
  assert "| t2t-lite float32 | 3,600 | 1.50x | 1,700 | 0.85x |" in text
  assert "| t2t-lite default | 7,000 | 2.92x | 1,640 | 0.82x |" in text


def test_a_capped_instruction_set_is_named_with_the_kernels_pytorch_ran():
  results = {"cpu": "Some CPU, 2 cores", "default_precision": "float32", "isa": "avx2",
             "pytorch_cpu_capability": "AVX2", "updates_measured": "updates 20-100",
             "rounds": {"fairseq": [{"tokens_per_second": 1000, "peak_rss_mib": 2000}],
                        "t2t-lite float32": [{"tokens_per_second": 1600, "peak_rss_mib": 1500}]}}
  text = bench_fairseq.table(results)
  assert text.startswith("Some CPU, 2 cores; kernels capped at avx2 (ONEDNN_MAX_CPU_ISA, "
                         "MKL_ENABLE_INSTRUCTIONS, ATEN_CPU_CAPABILITY); PyTorch's kernels at "
                         "AVX2; default precision float32.")
  assert "| t2t-lite float32 | 1,600 | 1.60x | 1,500 | 0.75x |" in text
  assert "t2t-lite default" not in text


def test_an_instruction_set_cap_sets_every_librarys_variable_and_needs_the_cpu_to_have_it():
  amx = "model name\t: Xeon\nflags\t\t: fpu avx2 avx512f avx512_bf16 amx_bf16\n"
  assert bench_fairseq.isa_environment("native", "") == {}
  assert bench_fairseq.isa_environment("avx2", amx) == {
      "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2",
      "ATEN_CPU_CAPABILITY": "avx2"}
  assert bench_fairseq.isa_environment("avx512_core_bf16", amx)["ONEDNN_MAX_CPU_ISA"] == (
      "AVX512_CORE_BF16")
  with pytest.raises(ValueError, match="this CPU has no avx512_bf16, so "
                                       "--isa=avx512_core_bf16 would measure the native"):
    bench_fairseq.isa_environment("avx512_core_bf16", "flags\t\t: fpu avx2\n")


def test_pytorchs_instruction_set_is_asked_of_the_fairseq_environment_under_the_cap(tmp_path):
  python = tmp_path / "python"  # stands in for the environment's python: echoes the cap
  python.write_text('#!/bin/sh\necho "${ATEN_CPU_CAPABILITY:-AVX512}"\n')
  python.chmod(0o755)
  capped = {"ATEN_CPU_CAPABILITY": "avx2"}
  assert bench_fairseq.pytorch_cpu_capability(str(tmp_path), capped) == "avx2"
  assert bench_fairseq.pytorch_cpu_capability(str(tmp_path), {}) == "AVX512"
  python.write_text("#!/bin/sh\nexit 1\n")
  assert bench_fairseq.pytorch_cpu_capability(str(tmp_path), {}) == "unknown"


def test_fairseq_trains_the_model_of_the_registered_hparams_set():
  hparams = registry.hparams(bench_fairseq.HPARAMS_SET)
  hparams.hidden_size, hparams.batch_size = 384, 2048
  args = bench_fairseq.fairseq_train_args("bin", "data", 100, 1, hparams)
  flag = lambda name: args[args.index(name) + 1]  # noqa: E731
  assert args[:2] == ["bin/fairseq-train", "data"]
  assert flag("--encoder-embed-dim") == flag("--decoder-embed-dim") == "384"
  assert flag("--encoder-layers") == flag("--decoder-layers") == "3"
  assert flag("--encoder-ffn-embed-dim") == "1024" and flag("--encoder-attention-heads") == "4"
  assert flag("--max-tokens") == "2048" and flag("--warmup-updates") == "250"
  assert flag("--label-smoothing") == "0.1" and flag("--adam-betas") == "(0.9, 0.98)"
  # the peak of our schedule: constant (the set's 0.8) * 250^-0.5 * 384^-0.5
  assert hparams.learning_rate_constant == 0.8
  assert float(flag("--lr")) == pytest.approx(0.8 * 250 ** -0.5 * 384 ** -0.5, rel=1e-5)


def test_both_programs_train_at_one_constant_dropout():
  """fairseq has no dropout ramp: both train at the set's starting rate, 0.1."""
  hparams = bench_fairseq.bench_hparams()
  args = bench_fairseq.fairseq_train_args("bin", "data", 100, 1, hparams)
  flag = lambda name: args[args.index(name) + 1]  # noqa: E731
  assert flag("--dropout") == flag("--attention-dropout") == flag("--activation-dropout") == "0.1"
  ours = bench_fairseq.t2t_train_args("p", "d", "o", 100, 1, True)
  overrides = next(a for a in ours if a.startswith("--hparams="))[len("--hparams="):]
  mine = registry.hparams(bench_fairseq.HPARAMS_SET)
  mine.parse(overrides)
  assert not hparams_check.has_dropout_ramp(mine) and mine.layer_prepostprocess_dropout == 0.1
  hparams_check.check(mine)
  # The one best segmentation, as fairseq's, also on data with sampled ones: the run is
  # shorter than the set's minimum for reading them.
  assert mine.subword_sampling_min_updates == 101 and "--train_steps=100" in ours
