"""Mixed precision: low-precision compute, float32 weights, loss and accumulators."""

import numpy as np
import pytest
import tensorflow as tf

from t2t_lite.core import faults
from t2t_lite.training import learner as learner_lib
from t2t_lite.models import transformer
from t2t_lite.training.equivalence import ragged_batches
from test_multistep import VOCAB, no_dropout


def _force(monkeypatch, dtype):
  """Pretend this machine runs `dtype` natively (bfloat16 CPU, or float16 as on a GPU)."""
  forced = lambda hparams: dtype if hparams.mixed_precision else tf.float32  # noqa: E731
  monkeypatch.setattr(transformer, "compute_dtype", forced)
  monkeypatch.setattr(learner_lib, "compute_dtype", forced)


def _cosine(a, b):
  a = np.concatenate([x.numpy().ravel() for x in a])
  b = np.concatenate([x.numpy().ravel() for x in b])
  return float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))


@pytest.mark.parametrize("dtype", [tf.bfloat16, tf.float16])
def test_low_precision_compute_keeps_float32_state(monkeypatch, dtype):
  _force(monkeypatch, dtype)
  batches = ragged_batches(4, seed=12)
  full = learner_lib.Learner(no_dropout(), VOCAB, accumulate_steps=2, seed=3)
  mixed = learner_lib.Learner(no_dropout(mixed_precision=True), VOCAB, accumulate_steps=2,
                              seed=3)
  assert mixed.model.dtype == dtype and full.model.dtype == tf.float32
  assert all(v.dtype == tf.float32 for v in mixed.variables)
  assert all(a.dtype == tf.float32 for a in mixed.accumulator.gradients)
  assert (mixed.loss_scale is not None) == (dtype == tf.float16)

  grads_full, loss_full, _ = full._gradients(batches[0])
  grads_mixed, loss_mixed, _ = mixed._gradients(batches[0])
  assert loss_mixed.dtype == tf.float32
  assert float(loss_mixed) == pytest.approx(float(loss_full), rel=0.02)
  assert _cosine(grads_mixed, grads_full) > 0.99
  for batch in batches:
    stats = mixed.step(batch)
  assert bool(stats["finite"]) and int(mixed.update_step.numpy()) == 2


def test_float16_overflow_halves_the_loss_scale_and_skips(monkeypatch):
  _force(monkeypatch, tf.float16)
  mixed = learner_lib.Learner(no_dropout(mixed_precision=True), VOCAB, accumulate_steps=1,
                              seed=3, faults=faults.InjectedFault("nan", (2,)))
  batches = ragged_batches(3, seed=2)
  scale = float(mixed.loss_scale.numpy())
  assert bool(mixed.step(batches[0])["finite"])
  assert not bool(mixed.step(batches[1])["finite"])
  assert float(mixed.loss_scale.numpy()) == scale / 2
  assert int(mixed.skipped_updates.numpy()) == 1 and int(mixed.update_step.numpy()) == 1
  assert bool(mixed.step(batches[2])["finite"])


def test_without_native_bfloat16_the_cpu_stays_float32(monkeypatch):
  monkeypatch.setattr(transformer, "cpu_has_fast_bfloat16", lambda: False)
  monkeypatch.setattr(tf.config, "list_logical_devices", lambda kind=None: [])  # as if no GPU
  assert transformer.compute_dtype(no_dropout(mixed_precision=True)) == tf.float32
  monkeypatch.setattr(transformer, "cpu_has_fast_bfloat16", lambda: True)
  assert transformer.compute_dtype(no_dropout(mixed_precision=True)) == tf.bfloat16


@pytest.mark.parametrize("variable, ceiling, fast", [
    (None, None, True), ("ONEDNN_MAX_CPU_ISA", "AVX2", False),
    ("ONEDNN_MAX_CPU_ISA", "avx512_core", False), ("DNNL_MAX_CPU_ISA", "AVX2", False),
    ("ONEDNN_MAX_CPU_ISA", "AVX512_CORE_BF16", True), ("ONEDNN_MAX_CPU_ISA", "ALL", True)])
def test_native_bfloat16_needs_the_flags_and_onednn_allowed_to_use_them(
    monkeypatch, tmp_path, variable, ceiling, fast):
  """A oneDNN instruction-set ceiling below AVX512_CORE_BF16 rules bfloat16 out even on a CPU
  that has it (oneDNN then has no bfloat16 matmul for some shapes at all)."""
  for name in ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA"):
    monkeypatch.delenv(name, raising=False)
  if variable:
    monkeypatch.setenv(variable, ceiling)
  amx, avx2_only = tmp_path / "amx", tmp_path / "avx2"
  amx.write_text("flags\t\t: fpu avx2 avx512f avx512_bf16 amx_bf16 amx_tile\n")
  avx2_only.write_text("flags\t\t: fpu avx avx2 fma\n")
  assert transformer.cpu_has_fast_bfloat16(str(amx)) == fast
  assert not transformer.cpu_has_fast_bfloat16(str(avx2_only))
  assert not transformer.cpu_has_fast_bfloat16(str(tmp_path / "missing"))


def test_overflow_at_the_minimum_loss_scale_is_not_absorbed(monkeypatch):
  """Above the minimum scale an overflow is handled by halving it; at the minimum nothing is
  left to halve, so it is reported as non-finite and counts toward max_consecutive_nonfinite."""
  _force(monkeypatch, tf.float16)
  mixed = learner_lib.Learner(no_dropout(mixed_precision=True), VOCAB, accumulate_steps=1,
                              seed=3, faults=faults.InjectedFault("nan", (1, 2)))
  batches = ragged_batches(2, seed=2)
  mixed.loss_scale.assign(2.0)
  above = mixed.step(batches[0])
  assert not bool(above["finite"]) and bool(above["overflow"])
  assert float(mixed.loss_scale.numpy()) == learner_lib.MIN_LOSS_SCALE == 1.0
  at_minimum = mixed.step(batches[1])
  assert not bool(at_minimum["finite"]) and not bool(at_minimum["overflow"])
  assert int(mixed.skipped_updates.numpy()) == 2
