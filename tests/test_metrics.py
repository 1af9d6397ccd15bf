"""BLEU's tokenizer follows the target language; Japanese without MeCab is a clear error."""

import pytest

from conftest import cli
from t2t_lite.inference import metrics
from t2t_lite.core.errors import UsageError

HYPS = ["我们今天去公园散步。", "他喜欢读书"]
REFS = ["我们今天去公园散步了。", "他喜欢看书"]


def test_chinese_targets_use_the_zh_tokenizer():
  zh = metrics.bleu(HYPS, REFS, "zh")
  assert "tok:zh" in zh.signature
  plain = metrics.bleu(HYPS, REFS, "de")
  assert "tok:13a" in plain.signature and metrics.bleu(HYPS, REFS).signature == plain.signature
  # 13a leaves each Chinese sentence one token: nothing but exact sentences would match
  assert zh.score > 30 and plain.score < 5, (zh.score, plain.score)
  assert metrics.bleu_tokenizer("zh-Hans") == metrics.bleu_tokenizer("ZH_tw") == "zh"


def test_japanese_without_mecab_is_a_usage_error():
  try:
    import MeCab  # noqa: F401
    assert metrics.bleu_tokenizer("ja") == "ja-mecab"
  except ImportError:
    with pytest.raises(UsageError, match=r"needs sacreBLEU's ja-mecab tokenizer: pip install"):
      metrics.bleu_tokenizer("ja")


def test_bleu_cli_takes_the_target_language(tmp_path):
  hyp, ref = tmp_path / "hyp.zh", tmp_path / "ref.zh"
  hyp.write_text("\n".join(HYPS) + "\n", encoding="utf-8")
  ref.write_text("\n".join(REFS) + "\n", encoding="utf-8")
  out = cli("t2t-lite-bleu", f"--translation={hyp}", f"--reference={ref}", "--target_lang=zh",
            check=True).stdout
  assert "tok:zh" in out.splitlines()[1]
  assert float(out.split("=")[1].split()[0]) == pytest.approx(metrics.bleu(HYPS, REFS,
                                                                           "zh").score, abs=0.01)


def test_a_closed_output_pipe_ends_the_program_quietly(tmp_path):
  """`t2t-lite-bleu ... | head -1`: a reader that leaves before the scores are written ends
  the program without an error line (exit 141, as a program that SIGPIPE ended)."""
  import subprocess
  from conftest import BIN
  hyp, ref = tmp_path / "hyp", tmp_path / "ref"
  hyp.write_text("the cat sat on the mat today\n" * 3)
  ref.write_text("the cat sat on the mat today\n" * 3)
  command = f"{BIN}/t2t-lite-bleu --translation={hyp} --reference={ref} --metrics=bleu,chrf"
  import os
  env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}  # block-buffered
  whole = subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=60,
                         env=env)
  assert whole.returncode == 0 and whole.stdout.startswith("bleu = 100.00"), whole
  closed = subprocess.run(["bash", "-c", f"set -o pipefail; {command} | true"],
                          capture_output=True, text=True, timeout=60, env=env)
  assert (closed.returncode, closed.stderr) == (141, ""), closed


def test_the_trainers_metrics_take_the_bleu_tools_spelling_too():
  from t2t_lite.inference.metrics import judged_by, parse_metrics
  assert parse_metrics("bleu,chrf,dev_loss", 8) == ("dev_bleu", "dev_chrf", "dev_loss")
  assert parse_metrics("dev_bleu,bleu", 8) == ("dev_bleu",)
  assert judged_by("loss", ("dev_loss", "dev_bleu"), True) == "dev_loss"
  assert judged_by("bleu", ("dev_loss", "dev_bleu"), False) == "dev_bleu"
  with pytest.raises(UsageError, match="unknown metric 'blue'"):
    parse_metrics("blue", 8)
