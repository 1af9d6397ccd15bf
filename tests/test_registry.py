import os
import re

import pytest

from conftest import REPO
from t2t_lite.core import registry
from t2t_lite.core.registry import RegistryError

T2T_SETS = ["transformer_base", "transformer_big", "transformer_base_single_gpu",
            "transformer_small", "transformer_tiny"]


def test_every_registered_set_resolves_and_has_one_accumulate_step_unless_named():
  names = registry.hparams_sets.names()
  for name in T2T_SETS + ["transformer_base_fake_gpu8", "transformer_multi30k_cpu"]:
    assert name in names
  for name in names:
    hparams = registry.hparams(name)
    expected = 8 if name == "transformer_base_fake_gpu8" else 1
    assert hparams.optimizer_multistep_accumulate_steps == expected, name
    assert hparams.hidden_size % hparams.num_heads == 0, name


def test_tensor2tensor_values():
  base = registry.hparams("transformer_base")
  assert (base.num_encoder_layers, base.num_decoder_layers, base.hidden_size, base.filter_size,
          base.num_heads, base.batch_size) == (6, 6, 512, 2048, 8, 4096)
  assert base.learning_rate_schedule == "constant*linear_warmup*rsqrt_decay*rsqrt_hidden_size"
  assert (base.learning_rate_constant, base.learning_rate_warmup_steps) == (2.0, 8000)
  assert (base.optimizer_adam_beta1, base.optimizer_adam_beta2,
          base.optimizer_adam_epsilon) == (0.9, 0.997, 1e-9)
  assert (base.label_smoothing, base.layer_prepostprocess_dropout, base.attention_dropout,
          base.relu_dropout) == (0.1, 0.1, 0.1, 0.1)
  assert (base.layer_preprocess_sequence, base.layer_postprocess_sequence) == ("n", "da")
  assert base.clip_grad_norm == 0.0 and base.shared_embedding_and_softmax_weights
  big = registry.hparams("transformer_big")
  assert (big.hidden_size, big.filter_size, big.num_heads, big.batch_size,
          big.layer_prepostprocess_dropout) == (1024, 4096, 16, 2048, 0.3)
  single = registry.hparams("transformer_base_single_gpu")
  assert (single.batch_size, single.learning_rate_constant, single.learning_rate_warmup_steps,
          single.learning_rate_schedule) == (1024, 0.1, 16000,
                                             "constant*linear_warmup*rsqrt_decay")
  small, tiny = registry.hparams("transformer_small"), registry.hparams("transformer_tiny")
  assert (small.num_encoder_layers, small.hidden_size, small.filter_size, small.num_heads) == (
      2, 256, 1024, 4)
  assert (tiny.num_encoder_layers, tiny.hidden_size, tiny.filter_size, tiny.num_heads) == (
      2, 128, 512, 4)
  cpu = registry.hparams("transformer_multi30k_cpu")
  assert (cpu.num_encoder_layers, cpu.num_decoder_layers, cpu.hidden_size, cpu.filter_size,
          cpu.num_heads, cpu.batch_size, cpu.label_smoothing) == (3, 3, 256, 1024, 4, 4096, 0.1)
  assert (cpu.learning_rate_constant, cpu.learning_rate_warmup_steps) == (0.8, 250)
  assert (cpu.optimizer_adam_beta1, cpu.optimizer_adam_beta2,
          cpu.optimizer_adam_epsilon) == (0.9, 0.98, 1e-9)
  assert (cpu.layer_prepostprocess_dropout, cpu.dropout_ramp_initial, cpu.dropout_ramp_start,
          cpu.dropout_ramp_end, cpu.attention_dropout, cpu.relu_dropout) == (
              0.3, 0.0, 400, 1200, 0.0, 0.0)
  assert (cpu.subword_sampling_start, cpu.subword_sampling_min_updates) == (100, 1800)


def test_fake_gpu8_is_base_with_eight_accumulate_steps_and_has_alias():
  base = registry.hparams("transformer_base").values()
  fake = registry.hparams("transformer_base_fake_gpu8").values()
  alias = registry.hparams("transformer_base_multistep8").values()
  assert fake == alias
  differing = {k for k in base if base[k] != fake[k]}
  assert differing == {"optimizer_multistep_accumulate_steps"}
  assert fake["optimizer_multistep_accumulate_steps"] == 8


def test_unknown_names_get_close_matches():
  with pytest.raises(RegistryError, match="unknown hparams set 'transformer_bse'; did you "
                     "mean transformer_base"):
    registry.hparams("transformer_bse")
  with pytest.raises(RegistryError, match="unknown problem 'translate_ende_multi30'; did you "
                     "mean translate_ende_multi30k"):
    registry.problem("translate_ende_multi30")
  with pytest.raises(RegistryError, match="unknown model 'transfomer'; did you mean transformer"):
    registry.model("transfomer")


def test_problems_and_help():
  for name in ("translate_ende_multi30k", "translate_deen_multi30k", "translate_enfr_multi30k",
               "translate_ende_wmt14", "translate_folder"):
    assert name in registry.problems.names()
  assert registry.problem("translate_deen_multi30k").source_lang == "de"
  assert registry.problem("translate_ende_wmt14").vocab_size == 32000
  assert registry.problem("translate_ende_multi30k").vocab_size == 8000
  text = registry.help_string()
  assert "transformer_base_fake_gpu8  (alias: transformer_base_multistep8)" in text


def test_a_new_set_is_one_decorated_function(monkeypatch):
  # Registered into a copy, so the other tests (in any order) see only the project's sets.
  registry.hparams_sets.names()  # the built-in sets are loaded first
  monkeypatch.setattr(registry.hparams_sets, "_items", dict(registry.hparams_sets._items))
  @registry.register_hparams
  def transformer_test_only_set():
    hparams = registry.hparams("transformer_tiny")
    hparams.batch_size = 123
    return hparams

  assert registry.hparams("transformer_test_only_set").batch_size == 123
  with pytest.raises(ValueError, match="registered twice"):
    registry.register_hparams(transformer_test_only_set)


def test_the_hparams_set_table_of_the_docs_states_each_sets_rate_and_warmup():
  """docs/command-line.md gives some sets' (learning_rate_constant, warmup); they match."""
  with open(os.path.join(REPO, "docs", "command-line.md"), encoding="utf-8") as docs:
    rows = [re.match(r"\| `(\w+)`.*\(([\d.]+), (\d+)\) \|", line) for line in docs]
  stated = {row.group(1): (float(row.group(2)), int(row.group(3))) for row in rows if row}
  assert set(stated) == {"transformer_base", "transformer_base_single_gpu",
                         "transformer_multi30k_cpu"}
  for name, pair in stated.items():
    hparams = registry.hparams(name)
    assert pair == (hparams.learning_rate_constant, hparams.learning_rate_warmup_steps), name
