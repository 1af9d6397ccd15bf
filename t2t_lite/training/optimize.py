"""Learning-rate and dropout schedules counted in updates, and Adam applied once per update.

Adam here is tensor2tensor's (tf.train.AdamOptimizer): bias-corrected step size
lr * sqrt(1 - b2^t) / (1 - b1^t), epsilon outside the square root, t = updates so far + 1.
It is ours (rather than Keras's) so that every gradient takes the same dense path and the
step counter is ours; under a tf.distribute strategy each device applies it to its own copy
of the variables and slots (see learner.Learner._apply).
"""

from __future__ import annotations

import tensorflow as tf

from t2t_lite.core import hparams_check
from t2t_lite.core.errors import UsageError

from t2t_lite.core.hparams_check import check_schedule  # noqa: F401 (re-exported


def residual_dropout(hparams, update):
  """The residual and embedding dropout rate of update number `update` (1 = the first) when
  the hparams have a dropout ramp (dropout_ramp_end > 0), else None (the constant
  layer_prepostprocess_dropout, a Python number in the model).

  Ours, not tensor2tensor's: the rate is dropout_ramp_initial up to update dropout_ramp_start,
  rises linearly to layer_prepostprocess_dropout at update dropout_ramp_end and stays there.
  A function of the update alone, so a resumed run, or any layout, trains with the same rates.
  """
  if not hparams_check.has_dropout_ramp(hparams):
    return None
  start, end = float(hparams.dropout_ramp_start), float(hparams.dropout_ramp_end)
  progress = tf.clip_by_value((tf.cast(update, tf.float32) - start) / (end - start), 0.0, 1.0)
  initial = hparams.dropout_ramp_initial
  return initial + (hparams.layer_prepostprocess_dropout - initial) * progress


def learning_rate(hparams, update, cooldown_end=0):
  """The learning rate of update number `update` (1 = the first update), float32.

  tensor2tensor's product of factors, e.g. constant*linear_warmup*rsqrt_decay*rsqrt_hidden_size
  = constant * min(1, u / warmup) * max(u, warmup)^-0.5 * hidden^-0.5.

  Our factor `linear_cooldown` falls linearly to 0 over the last L = ceil(c x E) updates of
  a run that ends at update E = `cooldown_end` (c = learning_rate_cooldown):
  min(1, (E + 1 - u) / L), 1/L at update E; 1 while E is 0 (not fixed yet; see
  t2t_lite.training.budget for how a time budget fixes it).
  """
  update = tf.cast(update, tf.float32)
  warmup = float(hparams.learning_rate_warmup_steps)
  rate = tf.constant(1.0)
  for factor in hparams.learning_rate_schedule.split("*"):
    factor = factor.strip()
    if factor == "constant":
      rate *= hparams.learning_rate_constant
    elif factor == "linear_warmup":
      rate *= tf.minimum(1.0, update / max(warmup, 1.0))
    elif factor == "rsqrt_decay":
      rate *= tf.math.rsqrt(tf.maximum(update, max(warmup, 1.0)))
    elif factor == "rsqrt_hidden_size":
      rate *= float(hparams.hidden_size) ** -0.5
    elif factor == "linear_cooldown":
      rate *= cooldown_factor(update, cooldown_end, hparams.learning_rate_cooldown)
    else:
      raise UsageError(f"learning_rate_schedule has unknown factor '{factor}'")
  return rate


def cooldown_length(end, fraction: float):
  """L of `learning_rate` for a run ending at update `end` (a tensor): at least 1."""
  return tf.maximum(tf.math.ceil(fraction * tf.cast(end, tf.float32)), 1.0)


def cooldown_factor(update, end, fraction: float):
  end = tf.cast(end, tf.float32)
  falling = tf.clip_by_value((end + 1.0 - update) / cooldown_length(end, fraction), 0.0, 1.0)
  return tf.where(end > 0, falling, 1.0)


class Adam(tf.Module):
  """Adam with an update counter (`iterations`) and one slot pair per variable, kept by the
  variable's name (`names`, see Transformer.variable_names): a checkpoint holds them as
  `optimizer/m_of/<name>` and `optimizer/v_of/<name>`, so that a resume on which other
  variables train (frozen_parts) finds each variable's moments (see training.resume)."""

  def __init__(self, variables, names, beta1: float, beta2: float, epsilon: float):
    super().__init__(name="adam")
    self.beta1, self.beta2, self.epsilon = beta1, beta2, epsilon
    self.iterations = tf.Variable(0, dtype=tf.int64, trainable=False, name="iterations")
    self.m_of = {name: tf.Variable(tf.zeros_like(v), trainable=False, name="m")
                 for name, v in zip(names, variables)}
    self.v_of = {name: tf.Variable(tf.zeros_like(v), trainable=False, name="v")
                 for name, v in zip(names, variables)}

  @property
  def m(self) -> list:
    """The first moments, in the order of the variables."""
    return list(self.m_of.values())

  @property
  def v(self) -> list:
    return list(self.v_of.values())

  def apply(self, grads, variables, lr):
    """One Adam step for every variable, each one fused kernel (ResourceApplyAdam computes
    exactly the step above). Under a distribution strategy, call it inside
    `strategy.extended.update`: the handles are then those of the device being updated."""
    with tf.name_scope("adam"):
      step = tf.cast(self.iterations + 1, tf.float32)
      beta1_power, beta2_power = tf.pow(self.beta1, step), tf.pow(self.beta2, step)
      for grad, var, m, v in zip(grads, variables, self.m, self.v):
        tf.raw_ops.ResourceApplyAdam(var=var.handle, m=m.handle, v=v.handle,
                                     beta1_power=beta1_power, beta2_power=beta2_power, lr=lr,
                                     beta1=self.beta1, beta2=self.beta2, epsilon=self.epsilon,
                                     grad=grad)
      self.iterations.assign_add(1)


class GradientAccumulator(tf.Module):
  """Per-replica sums of the micro-steps' gradients (by variable name, as Adam's slots),
  summed losses and token counts.

  ON_READ/SUM variables: each replica adds to its own copy with no communication; a read in
  cross-replica context (at the update) sums the copies.
  """

  def __init__(self, variables, names):
    super().__init__(name="accumulator")
    local = dict(trainable=False, synchronization=tf.VariableSynchronization.ON_READ,
                 aggregation=tf.VariableAggregation.SUM)
    self.gradient_of = {name: tf.Variable(tf.zeros_like(v), name="gradient", **local)
                        for name, v in zip(names, variables)}
    self.loss = tf.Variable(0.0, name="loss", **local)
    self.tokens = tf.Variable(0.0, name="tokens", **local)

  @property
  def gradients(self) -> list:
    """The sums, in the order of the variables."""
    return list(self.gradient_of.values())

  def add(self, grads, loss, tokens) -> None:
    for acc, grad in zip(self.gradients, grads):
      acc.assign_add(grad)
    self.loss.assign_add(loss)
    self.tokens.assign_add(tokens)

  def reset(self) -> None:
    for acc in self.gradients:
      acc.assign(tf.zeros_like(acc))
    self.loss.assign(0.0)
    self.tokens.assign(0.0)

  def nbytes(self) -> int:
    return sum(v.shape.num_elements() * v.dtype.size for v in self.gradients)
