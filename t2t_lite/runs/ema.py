"""The exponential moving average (EMA) of the weights, weighted by target tokens.

Each applied update moves the average towards the new weights by a decay that depends on the
update's target tokens T (summed over its micro-batches and replicas):

    d = ema_decay ** (T / ema_reference_tokens)

so an update of 4T tokens moves the average as four updates of T tokens would (decays
multiply: d^(4T/R) = (d^(T/R))^4). The average therefore depends on the tokens trained, not
on how they were cut into updates, micro-batches or replicas (Marian rescales its decay by
the target words of each update the same way; a decay per update, as TF Model Garden's,
averages the same run differently with another accumulation count).

Warm-up correction: Adam's bias correction, not a clamp on the decay. The average starts at
zero with weight w = 0, and w = 1 - (product of the decays so far) is the total weight of the
updates in it; the stored average is the corrected one, avg / w, updated in place as

    w' = 1 - (1 - w) d,     avg' = avg + (1 - d) / w' * (theta - avg),

so the first update sets the average to its weights exactly, and the initial (random)
weights have no part in it. The clamp of TensorFlow's ExponentialMovingAverage and of eole /
OpenNMT-py (decay at most (1 + u) / (10 + u) at update u) counts updates, so it would undo
the invariance above while it acts; the correction counts tokens through d and keeps it.

The average lives in the checkpoint beside the raw weights, as `ema` (`average_of` by the
name of each variable that trains, and `weight`): the raw weights keep training, so a resumed
run continues from them and not from the average. Readers of a checkpoint (evaluation,
decoding, averaging, export) take the average by default (`restore_weights`).
"""

from __future__ import annotations

import tensorflow as tf

from t2t_lite.core.errors import UsageError

CHECKPOINT_KEY = "ema"
WEIGHT_KEY = f"{CHECKPOINT_KEY}/weight/.ATTRIBUTES/VARIABLE_VALUE"
# What a reader restores: the average where the checkpoint holds one, else the raw weights;
# the average (refused where there is none); the raw weights.
CHOICES = ("auto", "ema", "raw")
EMA, RAW = "ema", "raw"


class WeightAverage(tf.Module):
  """The moving average of `variables`, one float32 copy of each (see the module doc)."""

  def __init__(self, variables, names, decay: float, reference_tokens: float):
    super().__init__(name="ema")
    self.decay, self.reference_tokens = float(decay), float(reference_tokens)
    # by the variable's name, as Adam's slots (a checkpoint's `ema/average_of/<name>`)
    self.average_of = {name: tf.Variable(tf.zeros(v.shape, tf.float32), trainable=False,
                                         name="average")
                       for name, v in zip(names, variables)}
    # 1 - the product of the decays so far: 0 until the first update (no average yet).
    self.weight = tf.Variable(0.0, dtype=tf.float64, trainable=False, name="weight")

  def update(self, variables, tokens) -> None:
    """After an applied update of `tokens` target tokens (on one device inside
    `strategy.extended.update`, like Adam: the handles are that device's copies)."""
    decay = tf.pow(tf.constant(self.decay, tf.float64),
                   tf.cast(tokens, tf.float64) / self.reference_tokens)
    weight = 1.0 - (1.0 - self.weight) * decay
    rate = tf.cast(tf.math.divide_no_nan(1.0 - decay, weight), tf.float32)
    for average, variable in zip(self.averages, variables):
      average.assign_add(rate * (tf.cast(variable, tf.float32) - average))
    self.weight.assign(weight)

  @property
  def averages(self) -> list:
    """The averages, in the order of the variables."""
    return list(self.average_of.values())

  def nbytes(self) -> int:
    return sum(v.shape.num_elements() * 4 for v in self.averages)

  def holds_updates(self) -> bool:
    """Whether an update was averaged yet (the average is empty before the first)."""
    return float(self.weight.numpy()) > 0

  def swap_with(self, variables) -> None:
    """Exchanges `variables` (the model's) and their averages, one variable at a time (no
    second copy of the model); called twice, everything is as it was, bit for bit."""
    for variable, average in zip(variables, self.averages):
      raw = tf.identity(variable)
      variable.assign(average)
      average.assign(raw)


def enabled(hparams) -> bool:
  return hparams.ema_decay > 0


class _Averages(tf.Module):
  """The checkpoint's `ema` object, with the model's own variables in place of the averages:
  reading it writes the average into the model. `average_of`: by name; `averages`: a list in
  the order of the variables that trained (checkpoints of earlier versions)."""

  def __init__(self, average_of: dict | None = None, averages: list | None = None):
    super().__init__(name="ema")
    if average_of is not None:
      self.average_of = average_of
    else:
      self.averages = list(averages)


def average_weight(path: str) -> float | None:
  """The average's weight in the checkpoint at `path` (0: no update averaged yet), or None
  when it holds no average (a run without ema_decay, or an average of checkpoints)."""
  reader = tf.train.load_checkpoint(path)
  return float(reader.get_tensor(WEIGHT_KEY)) if reader.has_tensor(WEIGHT_KEY) else None


def resolve(path: str, choice: str, flag: str = "--weights") -> str:
  """Which weights of the checkpoint at `path` to read for `choice` (CHOICES): EMA or RAW;
  a usage error for `ema` where the checkpoint holds no average."""
  if choice not in CHOICES:
    raise UsageError(f"{flag}={choice}: choose one of {', '.join(CHOICES)}")
  if choice == RAW:
    return RAW
  weight = average_weight(path)
  if weight:
    return EMA
  if choice == EMA:
    why = ("its run has not applied an update yet" if weight == 0 else
           "it holds none (trained without ema_decay, or an average of checkpoints)")
    raise UsageError(f"{flag}=ema: checkpoint {path} has no moving average of the weights: "
                     f"{why}; use {flag}=raw")
  return RAW


def restore_averages(model, path: str) -> None:
  """Writes the checkpoint's moving average into the variables of `model` that it averaged
  (those that trained; frozen parts keep their weights)."""
  from t2t_lite.runs.checkpoints import state_by_name
  stored = state_by_name(path, f"{CHECKPOINT_KEY}/average_of")
  if stored is None:  # an earlier version's list, over the variables that train
    view = _Averages(averages=model.trained_variables())
  else:
    names = model.variable_names()
    view = _Averages(average_of={names[v.ref()]: v for v in model.trainable_variables
                                 if names[v.ref()] in stored})
    if len(view.average_of) != len(stored):
      raise UsageError(f"checkpoint {path} holds averages of variables this model lacks "
                       f"({', '.join(sorted(stored - set(view.average_of))[:3])}); read it "
                       "with the hparams it was trained with")
  tf.train.Checkpoint(**{CHECKPOINT_KEY: view}).read(
      path).expect_partial().assert_existing_objects_matched()


def describe(weights: str) -> str:
  return ("the moving average of the weights (ema)" if weights == EMA
          else "the raw weights")
