"""A diverging run recovers without a person: it rolls back to its newest checkpoint, skips
exactly the micro-batches that diverged, trains on at a lowered learning rate, and ends where
a run killed during its recovery ends too (training.recovery)."""

import os
import re

import numpy as np
import pytest
import tensorflow as tf

from conftest import TINY_HPARAMS, cli

FLAGS = ["--problem=translate_ende_multi30k", "--hparams_set=transformer_tiny",
         f"--hparams={TINY_HPARAMS}", "--save_checkpoints_steps=4", "--log_every=3",
         "--local_eval_frequency=0", "--random_seed=7", "--train_steps=14"]


def _train(data_dir, output_dir, fault, *more, check=True):
  return cli("t2t-lite-trainer", *FLAGS, *more, f"--data_dir={data_dir}",
             f"--output_dir={output_dir}", env={"T2T_LITE_FAULT": fault}, check=check)


def _state(output_dir):
  """The newest checkpoint's name, and its model, Adam and divergence values."""
  path = tf.train.latest_checkpoint(str(output_dir))
  reader = tf.train.load_checkpoint(path)
  return os.path.basename(path), {
      name.split("/.ATTRIBUTES")[0]: reader.get_tensor(name)
      for name, _ in tf.train.list_variables(path)
      if name.startswith(("model/", "optimizer/", "divergence/", "micro_step"))
      and name.endswith("VARIABLE_VALUE")}


def test_a_run_of_nonfinite_updates_rolls_back_skips_its_batches_and_finishes(multi30k_data,
                                                                               tmp_path):
  """The 14 updates of a run whose micro-steps 5-10 have a NaN loss: the 5th non-finite in a
  row (micro-step 9, still update 5) is a divergence; the run rolls back to ckpt-4 (update
  4), skips micro-batches 4-8 (0-based: the five that diverged), meets the sixth NaN, skips
  that update as before, and trains updates 5-14 at half the learning rate (exit 0). Its
  log, TensorBoard and final lines say so, and the checkpoint records it."""
  from test_train import _scalars
  output_dir = tmp_path / "run"
  result = _train(multi30k_data, output_dir, "nan:5,6,7,8,9,10", "--log_every=1")
  assert result.returncode == 0
  err = result.stderr
  assert ("diverged at update 5: 5 updates in a row had a non-finite loss or gradient "
          "(max_consecutive_nonfinite=5). Recovery 1 of 3: rolled back to "
          f"{output_dir}/ckpt-4 (update 4); micro-batches 4-8 of the training stream (5) will "
          "be skipped, then 100 updates train at 0.5 x the learning rate") in err, err[-3000:]
  assert ("update 5: skipped micro-batches 4-8 of the training stream, as the recovery "
          "planned; updates 5-104 train at 0.5 x the learning rate") in err
  # the sixth NaN (micro-step 10, the first after the skip) is an ordinary skipped update
  assert "non-finite loss or gradient at update 5 (micro-step 10): update skipped" in err
  assert ("recovered from a divergence 1 time(s): update 5 (non-finite), batches 4-8 "
          "skipped") in err
  assert "trained 14 updates (20 micro-steps)" in result.stdout
  name, state = _state(output_dir)
  assert name == "ckpt-20" and int(state["optimizer/iterations"]) == 14
  assert int(state["divergence/recoveries"]) == 1
  assert state["divergence/history"][:2].tolist() == [[5, 4, 9, 1], [0, 0, 0, 0]]
  assert state["divergence/lowered"].tolist() == [5, 105]
  lines = {int(line.split("update ")[1].split("/")[0]): float(line.split(" lr ")[1].split(",")[0])
           for line in err.splitlines() if "/14 (micro-step" in line}
  from t2t_lite.core import registry
  from t2t_lite.training.optimize import learning_rate
  hparams = registry.hparams("transformer_tiny")
  for update in (4, 5, 14):
    factor = 0.5 if update >= 5 else 1.0
    assert lines[update] == pytest.approx(
        factor * float(learning_rate(hparams, update)), rel=1e-3), (update, lines)
  scalars = _scalars(str(output_dir / "train"))
  assert scalars["recovery/rollbacks"] == [(5, 1.0)]
  assert scalars["recovery/skipped_batches"] == [(5, 5.0)]



def test_a_run_that_diverges_again_skips_every_span_and_stops_after_the_last_recovery(
    multi30k_data, tmp_path):
  """A learning rate without warmup: update 2 spikes whatever batches it is given. Each
  rollback returns to ckpt-2, from before every span, so the run skips all the spans
  recorded so far (2-3, then 2-3 and 4-5, ...) and meets a new one; the fourth divergence
  stops it (exit 1) in one line naming the three recoveries and the checkpoint kept."""
  result = cli("t2t-lite-trainer", *FLAGS[:2],
               f"--hparams={TINY_HPARAMS},optimizer_multistep_accumulate_steps=2,"
               "learning_rate_warmup_steps=1", "--save_checkpoints_steps=1",
               "--local_eval_frequency=0", "--log_every=0", "--random_seed=7",
               "--train_steps=3", f"--data_dir={multi30k_data}",
               f"--output_dir={tmp_path / 'run'}")
  assert result.returncode == 1
  skips = [line.split("update 2: skipped micro-batches ")[1].split(" ")[0]
           for line in result.stderr.splitlines() if "update 2: skipped micro-batches" in line]
  assert skips == ["2-3", "2-3", "4-5", "2-3", "4-5", "6-7"], skips
  last = result.stderr.strip().splitlines()[-1]
  assert last.startswith("t2t-lite-trainer: error: the loss spiked to "), last
  assert last.endswith(
      "at update 2; stopped after 3 recoveries (divergence_max_recoveries=3): update 2 (loss "
      "spike, batches 2-3 skipped); update 2 (loss spike, batches 4-5 skipped); update 2 "
      "(loss spike, batches 6-7 skipped). The last good checkpoint, ckpt-2, is kept; lower "
      "learning_rate_constant or set clip_grad_norm, then resume"), last


def test_a_loss_spike_recovers_the_same_uninterrupted_and_killed(multi30k_data, tmp_path):
  """Micro-step 7's loss times 30 (update 7) is a spike: noticed at the read of update 8
  (a save), the run rolls back to ckpt-4 and skips micro-batch 6 only; update 8 is trained
  again on the weights without the spike. Killed right after the rollback (then resumed:
  it meets the same spike and decides the same), it ends with the same weights, Adam's
  state and record, bit for bit; so does a run stopped between the rollback and the skip
  (the checkpoint it saves holds the skip to come)."""
  straight = _train(multi30k_data, tmp_path / "straight", "spike:7")
  assert "diverged at update 7: the loss spiked to " in straight.stderr
  assert ", more than divergence_spike_margin=2 above its running mean " in straight.stderr
  assert (f"rolled back to {tmp_path}/straight/ckpt-4 (update 4); micro-batches 6-6 of the "
          "training stream (1) will be skipped") in straight.stderr
  spiked, mean = (float(x) for x in re.search(
      r"the loss spiked to ([0-9.]+), more than divergence_spike_margin=2 above its running "
      r"mean ([0-9]+\.[0-9]{3})", straight.stderr).groups())
  assert 25 * mean < spiked < 35 * mean  # 30 x a loss near the mean
  expected_name, expected = _state(tmp_path / "straight")
  assert expected["divergence/history"][0].tolist() == [7, 6, 7, 2]
  assert expected_name == "ckpt-15"  # 14 updates of the micro-batches but number 6
  output_dir = tmp_path / "killed"
  killed = _train(multi30k_data, output_dir, "spike:7;rollback:1", check=False)
  assert killed.returncode == -9
  _train(multi30k_data, output_dir, "spike:7")
  _assert_equal(_state(output_dir), (expected_name, expected))

  # Stopped (SIGTERM) between the rollback and the skip: the checkpoint it saves records
  # the span, and the run resumed from it skips it (in this process).
  output_dir = tmp_path / "stopped"
  os.environ["T2T_LITE_FAULT"] = "spike:7"
  try:
    trainer = _trainer(multi30k_data, output_dir)
    trainer.restore()  # a new run: its initial state kept until the first save
    initial = trainer.recovery.initial.folder
    assert os.path.isfile(os.path.join(initial, "initial.index"))
    trainer._after_update = lambda tried: trainer.recovery.count() and \
        trainer.stops.signal is None and trainer.stops.request(15)
    assert trainer.train()["stop_reason"] == "signal 15"
    assert not os.path.exists(initial)
    name, state = _state(output_dir)
    assert name == "ckpt-5" and state["divergence/history"][0].tolist() == [7, 6, 7, 2]
    _trainer(multi30k_data, output_dir).train()
  finally:
    del os.environ["T2T_LITE_FAULT"]
  _assert_equal(_state(output_dir), (expected_name, expected), exact=False)


def _trainer(data_dir, output_dir):
  """FLAGS's run, in this process."""
  from conftest import tiny_hparams
  from t2t_lite.core import registry
  from t2t_lite.training.loop import Trainer
  from t2t_lite.training.options import Checkpointing, Evaluation, RunOptions
  from t2t_lite.training.steps import run_steps
  hparams = tiny_hparams()
  options = RunOptions(output_dir=str(output_dir), data_dir=data_dir, seed=7, log_every=3,
                       evaluation=Evaluation(frequency=0),
                       checkpointing=Checkpointing(save_steps=4))
  return Trainer(hparams, registry.problem("translate_ende_multi30k"),
                 run_steps(hparams, 1, 14), options)


def _assert_equal(got, expected, exact=True):
  """The same checkpoint name and values: bit for bit, or (`exact` False: a run in this
  process against one in a trainer process, whose kernels may round differently) the
  integers exactly and the floats within 1e-5 of their scale."""
  assert got[0] == expected[0] and got[1].keys() == expected[1].keys()
  for key, value in expected[1].items():
    if exact or value.dtype.kind != "f":
      np.testing.assert_array_equal(got[1][key], value, err_msg=key)
    else:
      scale = max(float(np.abs(value).max()), 1.0)
      assert float(np.abs(got[1][key] - value).max()) <= 1e-5 * scale, key


def test_float16_at_the_minimum_loss_scale_continues_in_float32(monkeypatch, tmp_path):
  """float16 (forced, as on a GPU) with non-finite gradients: the scale falls to 1 and, once
  it has sat there float16_fallback_updates=2 updates, the next read switches the run to
  float32, recorded in the checkpoint; the steps then compute in float32 (the loss of a
  float32 model with the same weights), and a run restored from it does from the start."""
  from test_mixed_precision import _force, no_dropout, ragged_batches
  from t2t_lite.core.faults import InjectedFault
  from t2t_lite.training.learner import Learner
  from t2t_lite.training.recovery import Recovery
  from test_multistep import VOCAB
  _force(monkeypatch, tf.float16)
  hparams = no_dropout(mixed_precision=True, float16_fallback_updates=2)
  learner = Learner(hparams, VOCAB, 1, seed=3, faults=InjectedFault("nan", (1, 2)))
  recovery = Recovery(learner, hparams, 1, None)
  batches = ragged_batches(3, seed=2)
  learner.loss_scale.assign(2.0)
  learner.step(batches[0])  # an overflow at scale 2: absorbed, the scale falls to 1
  read = learner.read_window()
  assert float(learner.loss_scale.numpy()) == 1.0 and read["overflows"] == 1
  assert read["float16_due"] == 0  # one update at the minimum so far
  recovery.float16_fallback(read)
  assert learner.scaling
  learner.step(batches[1])  # at the minimum: non-finite, the second update there
  read = learner.read_window()
  assert read["float16_due"] == 1 and read["skipped"] == 1
  recovery.float16_fallback(read)
  assert not learner.scaling and learner.model.dtype == tf.float32
  assert int(learner.divergence.float32_from.numpy()) == 1  # no update applied yet
  plain = Learner(no_dropout(), VOCAB, 1, seed=3)
  for mine, theirs in zip(plain.variables, learner.variables, strict=True):
    mine.assign(theirs)
  mixed_loss, plain_loss = learner.step(batches[2])["loss"], plain.step(batches[2])["loss"]
  assert float(mixed_loss) == pytest.approx(float(plain_loss), rel=1e-6)
  path = tf.train.Checkpoint(divergence=learner.divergence).write(str(tmp_path / "c"))
  restored = Learner(hparams, VOCAB, 1, seed=3)
  tf.train.Checkpoint(divergence=restored.divergence).read(path).assert_consumed()
  Recovery(restored, hparams, 1, None).sync()
  assert not restored.scaling and restored.model.dtype == tf.float32


def test_a_skip_on_a_stream_of_several_corpora_moves_it_as_reading_would(mixed_data):
  """A recovery's skip on data of two corpora: the position (batches per corpus and
  segmentation, target tokens) moves past the skipped micro-batches as reading them would,
  so the run's checkpoints stay consistent, and the next micro-batch is the same."""
  from t2t_lite.core import registry
  from t2t_lite.data.curriculum import Curriculum
  from t2t_lite.data.mixing import MixedStream, corpus_splits
  from t2t_lite.data.stream import Batching
  from conftest import tiny_hparams
  snapshot = registry.problem("translate_ende_multi30k").snapshot(mixed_data)
  stores = [[snapshot.store(split) for split in corpus_splits(c, ["train", "train_sampled"])]
            for c in snapshot.corpora]

  def stream():
    return MixedStream(stores, Curriculum.of("flickr:3/other:1", snapshot.corpora),
                       Batching.of(tiny_hparams()), 7, 2, [0, 1])
  read, skipped = stream(), stream()
  for micro_step in range(6):
    read.micro_batches(micro_step, sampled_from=8, update=1)
  skipped.micro_batches(0, sampled_from=8, update=1)
  skipped.skip_to(6, 8, 1)
  assert skipped.at == read.at == 6 and read.taken.sum() == 12
  assert skipped.taken.tolist() == read.taken.tolist()
  assert skipped.tokens.tolist() == read.tokens.tolist()
  for a, b in zip(read.micro_batches(6, 8, 1), skipped.micro_batches(6, 8, 1), strict=True):
    assert all(np.array_equal(a[name], b[name]) for name in ("inputs", "targets"))
  read.close()
  skipped.close()
