"""No hparam is accepted and ignored: each one changes the model, the data, the optimizer,
the step plan or the divergence guard, or its changed value is refused.

Every registered set has exactly the hparams of `basic_params`, so walking them once on a
shrunken set covers every set; each registered set itself must pass the check as it is.
"""

import os

import numpy as np
import pytest
import tensorflow as tf

from t2t_lite.configs.transformer import basic_params
from t2t_lite.core import hparams_check, registry
from t2t_lite.training import steps
from t2t_lite.core.errors import RunError, UsageError
from t2t_lite.training.learner import Learner
from t2t_lite.models import transformer

VOCAB = 40
# Changed values for hparams whose generic change (+0.05 or x 0.5, +1, not, +"x")
# would not say much.
CHANGES = {
    "model": "transformer_v2", "optimizer": "adafactor",
    "layer_preprocess_sequence": "none", "layer_postprocess_sequence": "dan",
    "learning_rate_schedule": "constant*linear_warmup",
    "batch_size": 96, "effective_batch_tokens": 128, "num_heads": 4, "max_length": 24,
    "min_length_bucket": 16, "length_bucket_step": 1.5, "hidden_size": 32,
    "optimizer_multistep_accumulate_schedule": "1@0;2@5",
    # a ramp that ends at update 1 would give update 1 the constant rate
    "dropout_ramp_end": 4,
    "frozen_parts": "encoder",
}


def small():
  hparams = registry.hparams("transformer_tiny")
  hparams.override_from_dict(dict(
      hidden_size=16, filter_size=32, num_heads=2, num_encoder_layers=1, num_decoder_layers=1,
      batch_size=64, max_length=32, learning_rate_warmup_steps=4))
  return hparams


def changed_value(hparams, name):
  if name in CHANGES:
    return CHANGES[name]
  value = getattr(hparams, name)
  kind = hparams.kind(name)
  if kind is bool:
    return not value
  if kind is int:
    return value + 1
  if kind is float:
    return value + 0.05 if value < 0.5 else value * 0.5
  return value + "x"


@pytest.fixture(scope="module")
def train_file(tmp_path_factory):
  path = str(tmp_path_factory.mktemp("records") / "train.tfrecord")
  rng = np.random.RandomState(0)
  with tf.io.TFRecordWriter(path) as writer:
    for _ in range(300):
      source, target = rng.randint(3, VOCAB, rng.randint(1, 40)), rng.randint(3, VOCAB,
                                                                             rng.randint(1, 40))
      feature = {name: tf.train.Feature(int64_list=tf.train.Int64List(value=list(ids) + [1]))
                 for name, ids in (("inputs", source), ("targets", target))}
      writer.write(tf.train.Example(
          features=tf.train.Features(feature=feature)).SerializeToString())
  return path


def _plan(hparams, train_file):
  return steps.run_steps(hparams, 1, 10)


def _guard(hparams, train_file):
  """The divergence detector and the recovery's plan on fixed updates: which losses are
  spikes and the running mean after them, the update at which a run of non-finite ones is
  noticed, after how many updates at the minimum float16 scale the run falls back, whether a
  4th rollback is allowed, the learning-rate factor around the end of a lowered span."""
  from types import SimpleNamespace
  from t2t_lite.training.divergence import DivergenceState
  from t2t_lite.training.learner import Window
  from t2t_lite.training.recovery import Recovery
  state, window, scalar = DivergenceState(hparams), Window(), tf.constant
  spikes = [bool(state.judge(scalar(loss), scalar(True), scalar(update, tf.int64)))
            for update, loss in enumerate((6.0, 5.0, 5.5, 6.0, 7.2, 9.0, 5.0))]
  for update in range(1, 12):  # non-finite from update 2
    stats = dict(finite=scalar(update == 1), overflow=scalar(False), loss=scalar(1.0),
                 tokens=scalar(1.0), learning_rate=scalar(1.0), grad_norm=scalar(1.0),
                 spike=scalar(False), loss_mean=scalar(0.0), float16_due=scalar(False))
    window.record(stats, scalar(update, tf.int64), scalar(update, tf.int64), tf.zeros([3]),
                  scalar(update - 1, tf.int64), state.max_consecutive)
  due = [bool(state.count_min_scale(scalar(True))) for _ in range(30)]
  recovery = Recovery(SimpleNamespace(divergence=state), hparams, 1, None)
  state.record([(4, 8, 10, 2)] * 3)
  recovery.sync()
  try:
    recovery.check(dict(diverged=2, diverged_update=9, updates_done=9, diverged_loss=9.0,
                        diverged_mean=5.0, consecutive=0), None)
    allowed = True
  except RunError:
    allowed = False
  state.lowered.assign(recovery.lowered_span(10))
  factors = [float(state.lr_factor(scalar(u, tf.int64))) for u in (9, 10, 109, 110, 111)]
  return (spikes, round(float(state.mean()), 6), int(window.diverged_update.numpy()),
          due.index(True), allowed, factors)


def _batches(hparams, train_file, pad_to_bucket_boundary=False):
  """Two training batches of the planned stream; padded to their bucket (--xla_compile), the
  batches that tensor2tensor's bucket hparams shape."""
  from t2t_lite.data import store
  from t2t_lite.data.stream import Batching, TrainingStream
  folder = os.path.dirname(train_file)
  info = store.write([train_file], folder, "train", VOCAB)
  stream = TrainingStream([store.ExampleStore(folder, info)],
                          Batching.of(hparams, pad_to_bucket_boundary), 1, 1, [0])
  batches = [stream.micro_batches(m)[0] for m in range(2)]
  stream.close()
  return [{k: tf.constant(v) for k, v in b.items()} for b in batches]


def _data(hparams, train_file):
  return [(b["inputs"].numpy().tolist(), b["targets"].numpy().tolist())
          for padded in (False, True) for b in _batches(hparams, train_file, padded)]


def _model(hparams, train_file):
  model = registry.model(hparams.model)(hparams, VOCAB, seed=5)
  inputs = tf.constant([[5, 6, 7, 8, 1], [9, 10, 1, 0, 0]])
  targets = tf.constant([[11, 12, 1], [13, 1, 0]])
  return (sum(v.shape.num_elements() for v in model.trainable_variables),
          [float(v) for v in model.loss(inputs, targets, tf.constant([5, 1], tf.int64))])


def _optimizer(hparams, train_file):
  """One update: the learning rate, the parameters and Adam's slots after it."""
  accumulate = steps.run_steps(hparams, 1, 10).accumulate_steps
  learner = Learner(hparams, VOCAB, accumulate, seed=5)
  batches = _batches(hparams, train_file)
  for step in range(accumulate):
    result = learner.step(batches[step % 2])
  state = [*learner.model.variables, *learner.adam.m, *learner.adam.v,
           *(learner.average.averages if learner.average is not None else [])]
  return float(result["learning_rate"]), [float(np.sum(np.abs(v.numpy()))) for v in state]


# Cheapest first: a changed hparam stops at the first part that differs.
PARTS = (_plan, _guard, _model, _data, _optimizer)


def refused(hparams) -> bool:
  try:
    hparams_check.check(hparams)
    registry.models.canonical(hparams.model)
    steps.run_steps(hparams, 1, 10)
  except UsageError:
    return True
  return False


@pytest.fixture(autouse=True)
def eager_and_bfloat16_capable(monkeypatch):
  # mixed_precision matters only on CPUs with native bfloat16: pretend this is one.
  monkeypatch.setattr(transformer, "cpu_has_fast_bfloat16", lambda: True)
  tf.config.run_functions_eagerly(True)  # 30+ small learners: no tracing
  yield
  tf.config.run_functions_eagerly(False)


def test_every_registered_set_has_the_basic_hparams_and_passes_the_check():
  names = set(basic_params().values())
  for set_name in registry.hparams_sets.names():
    hparams = registry.hparams(set_name)
    assert set(hparams.values()) == names, set_name
    hparams_check.check(hparams)


def test_every_hparam_is_read_or_refused(train_file):
  base = {part: part(small(), train_file) for part in PARTS}
  assert base == {part: part(small(), train_file) for part in PARTS}, "must be deterministic"
  ignored, refusals, read_by = [], [], {}
  for name in sorted(small().values()):
    hparams = small()
    hparams.set_hparam(name, changed_value(hparams, name))
    if refused(hparams):
      refusals.append(name)
      continue
    read_by[name] = next((part.__name__ for part in PARTS
                          if part(hparams, train_file) != base[part]), None)
    if read_by[name] is None:
      ignored.append(name)
  assert not ignored, f"accepted and ignored: {ignored}"
  # learning_rate_cooldown: refused unless the schedule has the factor that reads it;
  # dropout_ramp_start and _initial: refused unless dropout_ramp_end turns the ramp on;
  # ema_reference_tokens: refused unless ema_decay turns the moving average on;
  # corpus_weights: "x" is no curriculum, and a curriculum is refused on data of one corpus
  # and read on data of several (tests/test_corpora.py)
  assert set(refusals) == {"model", "optimizer", "layer_preprocess_sequence",
                           "layer_postprocess_sequence", "learning_rate_cooldown",
                           "dropout_ramp_start", "dropout_ramp_initial",
                           "ema_reference_tokens", "corpus_weights"}, refusals
  assert read_by["ema_decay"] == read_by["frozen_parts"] == "_optimizer"
  assert read_by["dropout_ramp_end"] == "_optimizer"
  assert {read_by[name] for name in (
      "max_consecutive_nonfinite", "divergence_spike_margin", "divergence_spike_decay",
      "divergence_max_recoveries", "recovery_lr_factor", "recovery_lr_updates",
      "float16_fallback_updates")} == {"_guard"}
  assert read_by["optimizer_adam_beta1"] == read_by["clip_grad_norm"] == "_optimizer"
  assert read_by["min_length_bucket"] == "_data" and read_by["label_smoothing"] == "_model"


def test_post_norm_is_the_papers_block(train_file):
  post = small()
  post.layer_preprocess_sequence, post.layer_postprocess_sequence = "none", "dan"
  model = registry.model("transformer")(post, VOCAB, seed=5)
  pre = registry.model("transformer")(small(), VOCAB, seed=5)
  # no layer norm at the end of the stacks: 2 norms x (scale, bias) fewer
  assert len(pre.trainable_variables) - len(model.trainable_variables) == 4
  from t2t_lite.runs import rundir
  assert sum(v.shape.num_elements() for v in model.trainable_variables) == \
      rundir.parameter_count(post, VOCAB)
  # Each block ends in a layer norm: the encoder output has zero mean and unit variance
  # per position (before the scale and bias, which start at 1 and 0).
  inputs = tf.constant([[5, 6, 7, 8, 1]])
  memory, _ = model.encode(inputs)
  np.testing.assert_allclose(tf.reduce_mean(memory, -1).numpy(), 0.0, atol=1e-5)
  np.testing.assert_allclose(tf.math.reduce_std(memory, -1).numpy(), 1.0, atol=1e-2)
  # and incremental decoding agrees with teacher forcing there too
  from t2t_lite.inference import decode
  cached = tf.function(lambda x: decode.greedy_search(model, x, 6, return_logits=True))(inputs)
  uncached = tf.function(lambda x: decode.greedy_search(
      decode.Uncached(model), x, 6, return_logits=True))(inputs)
  np.testing.assert_array_equal(cached[0].numpy(), uncached[0].numpy())
  np.testing.assert_allclose(cached[2].numpy(), uncached[2].numpy(), atol=1e-5)
