"""Model + Adam + exact gradient accumulation, as compiled steps.

Per micro-step, every replica adds the gradient of its *summed* token loss, the summed loss
and its count of non-padding target tokens to replica-local accumulators; nothing crosses
replicas. At the update, the accumulators are summed across replicas once, the gradient is
divided by the total token count T (so n micro-batches are exactly one batch of their union,
token-weighted), optionally clipped, and Adam is applied once. With
accumulate_steps = 1 there are no accumulators: one fused step does gradient and update.
With an accumulation schedule (see steps.AccumulateSchedule) n varies by update; the
accumulators then exist throughout, and an n=1 phase uses the fused step.

Dropout seeds are (random_seed, micro_step x replicas + replica), the index of the
micro-batch in the one training stream that all replicas share (see training.loop.Trainer): a
function of checkpointed counters and the same on any layout, so a resumed run, on the same
layout or another, draws the same masks as one never stopped.
"""

from __future__ import annotations

import tensorflow as tf

from t2t_lite.runs import ema as ema_lib
from t2t_lite.core import faults as faults_lib
from t2t_lite.core import hparams_check, registry
from t2t_lite.models.transformer import compute_dtype
from t2t_lite.training.divergence import NONFINITE, SPIKE, DivergenceState
from t2t_lite.training.optimize import Adam, GradientAccumulator, learning_rate, residual_dropout
from t2t_lite.core.errors import UsageError
from t2t_lite.training.steps import AccumulateSchedule

SUM = tf.distribute.ReduceOp.SUM
# Cross-replica sums of an update are packed into chunks of about this size: a few collectives
# per update instead of one per variable, without a second copy of all gradients at once
# (TensorFlow's 0 would pack everything into one).
PACK_BYTES = 32 * 2 ** 20  # the default of Learner(pack_bytes=)
MIN_LOSS_SCALE = 1.0
BATCH_SPEC = {"inputs": tf.TensorSpec([None, None], tf.int32),
              "targets": tf.TensorSpec([None, None], tf.int32)}
# What this process asks of all: (stop signal, time budget reached, timed save); see
# Learner.read_agreed and t2t_lite.training.decide.
FLAGS_SPEC = tf.TensorSpec([3], tf.float32)
NO_FLAGS = (0.0, 0.0, 0.0)


class Window(tf.Module):
  """What the training loop reports about the updates since it last looked, kept on the
  device(s) and written inside the compiled update, so that the host reads nothing between
  its log lines (see Learner.read_window). Not checkpointed: a resumed run starts a new
  window. `padding`/`slots` are summed per replica (each counts its own batches).

  A divergence (training.divergence) is latched at the first update that shows it: its kind,
  update, and the micro-steps [diverged_from, diverged_to) of the updates that diverged."""

  COUNTS = ("attempts", "updates", "skipped", "overflows", "consecutive", "last_skip_update",
            "last_skip_micro_step", "diverged", "diverged_update", "diverged_from",
            "diverged_to", "float16_due")
  SUMS = ("loss", "tokens", "learning_rate", "grad_norm", "diverged_loss", "diverged_mean")
  # What a read resets; the rest carries over (a run of non-finite updates, the last
  # update's figures).
  RESET = ("attempts", "updates", "skipped", "overflows", "diverged", "float16_due")

  def __init__(self):
    super().__init__(name="window")
    first = dict(trainable=False, aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)
    for name in self.COUNTS:
      setattr(self, name, tf.Variable(0, dtype=tf.int64, name=name, **first))
    for name in self.SUMS:
      setattr(self, name, tf.Variable(0.0, name=name, **first))
    local = dict(trainable=False, synchronization=tf.VariableSynchronization.ON_READ,
                 aggregation=tf.VariableAggregation.SUM)
    self.padding = tf.Variable(0.0, name="padding", **local)
    self.slots = tf.Variable(0.0, name="slots", **local)
    # The cross-replica sum of the flags of the last update (what the workers agreed on).
    self.agreed = tf.Variable(NO_FLAGS, name="agreed", **first)
    # The first micro-step of the run of non-finite updates in progress.
    self.run_from = tf.Variable(0, dtype=tf.int64, name="run_from", **first)

  def count_batch(self, batch) -> None:
    """Padding and token slots of one replica's micro-batch."""
    for ids in (batch["inputs"], batch["targets"]):
      size = tf.cast(tf.size(ids), tf.float32)
      self.padding.assign_add(size - tf.cast(tf.math.count_nonzero(ids), tf.float32))
      self.slots.assign_add(size)

  def record(self, stats, micro_step, update, flags, first_micro_step,
             max_consecutive: int) -> None:
    """One update's outcome (on one device, inside strategy.extended.update): `micro_step`
    counts the micro-steps after it, `first_micro_step` before it."""
    finite, overflow = stats["finite"], stats["overflow"]
    nonfinite = ~finite & ~overflow
    count = lambda flag: tf.cast(flag, tf.int64)  # noqa: E731
    self.attempts.assign_add(1)
    self.updates.assign_add(count(finite))
    self.skipped.assign_add(count(nonfinite))
    self.overflows.assign_add(count(overflow))
    # An absorbed float16 overflow neither breaks nor extends a run of non-finite updates.
    run_from = tf.where(nonfinite & tf.equal(self.consecutive, 0), first_micro_step,
                        self.run_from)
    self.run_from.assign(run_from)
    self.consecutive.assign(tf.where(finite, tf.constant(0, tf.int64),
                                     self.consecutive + count(nonfinite)))
    self._latch(stats, update, micro_step, first_micro_step, run_from,
                nonfinite & (self.consecutive >= max_consecutive))
    self.last_skip_update.assign(tf.where(nonfinite, update, self.last_skip_update))
    self.last_skip_micro_step.assign(tf.where(nonfinite, micro_step, self.last_skip_micro_step))
    self.loss.assign_add(tf.where(finite, stats["loss"], 0.0))
    self.tokens.assign_add(tf.where(finite, stats["tokens"], 0.0))
    for name in ("learning_rate", "grad_norm"):  # of the last applied update
      getattr(self, name).assign(tf.where(finite, stats[name], getattr(self, name)))
    self.agreed.assign(flags)
    self.float16_due.assign(tf.maximum(self.float16_due, count(stats["float16_due"])))

  def _latch(self, stats, update, micro_step, first_micro_step, run_from, run_reached):
    """The first divergence since the last read: its kind, update and span."""
    kind = tf.where(run_reached, tf.constant(NONFINITE, tf.int64),
                    tf.where(stats["spike"], tf.constant(SPIKE, tf.int64),
                             tf.constant(0, tf.int64)))
    new = tf.equal(self.diverged, 0) & (kind > 0)
    for variable, value in ((self.diverged, kind), (self.diverged_update, update),
                            (self.diverged_from, tf.where(run_reached, run_from,
                                                          first_micro_step)),
                            (self.diverged_to, micro_step),
                            (self.diverged_loss, stats["loss"]),
                            (self.diverged_mean, stats["loss_mean"])):
      variable.assign(tf.where(new, tf.cast(value, variable.dtype), variable))

  def take(self) -> dict:
    """The statistics, then a new window (the run of non-finite updates and the last
    update's learning rate and norm carry over). Cross-replica context."""
    values = {name: getattr(self, name).read_value() for name in self.COUNTS + self.SUMS}
    values["padding"], values["slots"] = self.padding.read_value(), self.slots.read_value()
    with tf.control_dependencies(list(values.values())):
      for name in self.RESET:
        getattr(self, name).assign(tf.constant(0, tf.int64))
      for name in ("loss", "tokens"):
        getattr(self, name).assign(0.0)
    return values

  def reset_counts(self) -> None:
    """Replica context: this replica's padding counts back to 0."""
    self.padding.assign(0.0)
    self.slots.assign(0.0)

  def forget_run(self) -> None:
    """After a rollback: no run of non-finite updates in progress (as in a new process)."""
    self.consecutive.assign(0)


WINDOW_FIELDS = (*Window.COUNTS, *Window.SUMS, "padding", "slots", "updates_done", "micro_step")


def _any_shape(spec):
  """`spec` (of a tensor, or of a tf.distribute per-replica value) with every dimension
  unknown."""
  parts = [tf.TensorSpec([None] * part.shape.rank, part.dtype)
           for part in tf.nest.flatten(spec, expand_composites=True)]
  return parts[0] if isinstance(spec, tf.TensorSpec) else type(spec)(*parts)


class OneTrace:
  """A compiled step over batches of any shape, traced once. Under a distribution strategy
  a batch is a per-replica value, whose input signature cannot be written before one
  exists: it is taken from the first batch, every dimension unknown. (Without it, the
  second batch shape traced the step again: about 4 s of a 2-replica run's start on a
  2-core CPU.)"""

  def __init__(self, fn, *more_specs):
    self.fn, self.more_specs, self.compiled = fn, list(more_specs), None

  def __call__(self, batch, *more):
    if self.compiled is None:
      specs = tf.nest.map_structure(tf.type_spec_from_value, batch)
      self.compiled = tf.function(
          self.fn, input_signature=[tf.nest.map_structure(_any_shape, specs), *self.more_specs],
          autograph=False)
    return self.compiled(batch, *more)


class HostCounters:
  """The host's mirrors of a learner's device counters, so that a micro-step reads nothing
  from the device: the update count last read, the updates tried since (applied unless a
  non-finite one was skipped; a read of the window says which), the micro-step counter and
  the micro-steps done of the update in progress. Read from the device once after a start
  or a restore (`forget`)."""

  def __init__(self, learner):
    self._learner = learner
    self.forget()

  def forget(self) -> None:
    """After a restore: the counters are read from the device when next asked for."""
    self._position = self._updates_done = self._micro_step = None
    self._attempts = 0

  def _sync(self) -> None:
    if self._position is None:
      learner = self._learner
      self._updates_done, self._attempts = int(learner.update_step.numpy()), 0
      self._position = int(learner.in_update.numpy())
      self._micro_step = int(learner.micro_step.numpy())

  def confirm(self, updates_done: int) -> None:
    """The device's update count, read: no update tried since."""
    self._sync()
    self._updates_done, self._attempts = updates_done, 0

  def update_in_progress(self, differ=None) -> int:
    """The number (1-based) of the update in progress, counting every update tried as
    applied. Where that matters, `differ(first, last)` says so for the range of updates it
    may be: then the count is read from the device (updates skipped for a non-finite loss
    are tried again)."""
    self._sync()
    first, last = self._updates_done + 1, self._updates_done + self._attempts + 1
    if self._attempts and differ is not None and differ(first, last):
      self.confirm(int(self._learner.update_step.numpy()))
      return self._updates_done + 1
    return last

  def position(self) -> int:
    """Micro-steps done of the update in progress (0 between updates)."""
    self._sync()
    return self._position

  def micro_step(self) -> int:
    """The micro-step counter."""
    self._sync()
    return self._micro_step

  def stepped(self, update_done: bool) -> None:
    """A micro-step ran; it completed an update (tried) or not."""
    self._sync()
    self._position = 0 if update_done else self._position + 1
    self._attempts += int(update_done)

  def counted(self) -> int:
    """The micro-step counter after one more micro-step of run_update."""
    self._sync()
    self._micro_step += 1
    return self._micro_step

  def moved_to(self, micro_step: int) -> None:
    """The micro-step counter was set to `micro_step`, between updates."""
    self._sync()
    self._micro_step = micro_step


class Learner:
  """Holds the trainable state and runs micro-steps and updates."""

  def __init__(self, hparams, vocab_size: int, accumulate_steps: int | AccumulateSchedule,
               seed: int = 1, strategy: tf.distribute.Strategy | None = None,
               faults: faults_lib.NoFaults | None = None, xla_compile: bool = False,
               pack_bytes: int = PACK_BYTES):
    """`xla_compile`: each replica's forward and backward pass is compiled by XLA (once per
    batch shape); the accumulation, cross-replica sum and update are not. `pack_bytes`: the
    cross-replica sum of the gradients is packed into all-reduces of at least this many
    bytes (1: one all-reduce per tensor)."""
    hparams_check.check(hparams)
    self.hparams = hparams
    self.schedule = (accumulate_steps if isinstance(accumulate_steps, AccumulateSchedule)
                     else AccumulateSchedule.constant(accumulate_steps))
    self.seed = seed
    self.pack_bytes = pack_bytes
    self.strategy = strategy or tf.distribute.get_strategy()
    self.replicas = self.strategy.num_replicas_in_sync
    self.dropout_on = any(rate > 0 for rate in (hparams.layer_prepostprocess_dropout,
                                                 hparams.attention_dropout,
                                                 hparams.relu_dropout,
                                                 hparams.dropout_ramp_initial))
    self.faults = faults or faults_lib.NoFaults()
    self.host = HostCounters(self)  # the host's mirrors of the counters
    self.in_step = False  # inside a compiled micro-step or update (see step)
    self.reduction = None  # tensors and collective ops of the cross-replica sum, once traced
    with self.strategy.scope():
      self._make_state(hparams, vocab_size, seed)
    self.xla_compile = xla_compile
    self._compile(xla_compile)

  def _make_state(self, hparams, vocab_size: int, seed: int) -> None:
    """The model, Adam, the counters and the optional parts (accumulators, moving average,
    loss scale), created in the strategy's scope."""
    self.model = registry.model(hparams.model)(hparams, vocab_size, seed)
    # What trains: all but the frozen parts (hparams frozen_parts), which get no gradient,
    # no Adam slots, no accumulator and no moving average.
    self.variables = list(self.model.trained_variables())
    if not self.variables:
      raise UsageError(f"frozen_parts={hparams.frozen_parts!r} freezes every variable; "
                       "nothing would train")
    # Adam's slots, the accumulators and the moving average are kept by these names.
    names = self.model.variable_names()
    self.names = [names[v.ref()] for v in self.variables]
    self.adam = Adam(self.variables, self.names, hparams.optimizer_adam_beta1,
                     hparams.optimizer_adam_beta2, hparams.optimizer_adam_epsilon)
    counter = dict(dtype=tf.int64, trainable=False,
                   aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)
    self.micro_step = tf.Variable(0, name="micro_step", **counter)
    self.skipped_updates = tf.Variable(0, name="skipped_updates", **counter)
    # Micro-steps done of the update in progress.
    self.in_update = tf.Variable(0, name="in_update", **counter)
    # The layout a checkpoint was written on: [replicas, micro-steps of the update in
    # progress]; a resume on another layout is checked against it (see training.loop.Trainer).
    self.layout = tf.Variable([self.replicas, self.schedule.steps_for(1)], name="layout",
                              **counter)
    # The last update of a schedule with a cooldown; 0 until fixed (see t2t_lite.training.budget).
    self.cooldown = hparams_check.has_cooldown(hparams)
    self.cooldown_end = tf.Variable(0, name="cooldown_end", **counter)
    self.accumulator = (GradientAccumulator(self.variables, self.names)
                        if self.schedule.needs_accumulators else None)
    # The moving average of the weights (t2t_lite.runs.ema), updated after each applied update.
    self.average = (ema_lib.WeightAverage(self.variables, self.names, hparams.ema_decay,
                                          hparams.ema_reference_tokens)
                    if ema_lib.enabled(hparams) else None)
    self.window = Window()
    self.divergence = DivergenceState(hparams)
    # float16 needs loss scaling; bfloat16 has float32's range and does not. `scaling` turns
    # False once a float16 run continues in float32 (continue_in_float32).
    self.loss_scale = None
    self.scaling = compute_dtype(hparams) == tf.float16
    if self.scaling:
      self.loss_scale = tf.Variable(2.0 ** 15, trainable=False, name="loss_scale",
                                    aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)
      self.good_updates = tf.Variable(0, name="good_updates", **counter)

  def _compile(self, xla_compile: bool) -> None:
    """The compiled steps."""
    # No autograph: the steps branch on tensors only through explicit tf.cond, and
    # converting every layer's Python source took most of a small model's first trace.
    # `flags` [stop, save] of this process ride in the update's cross-replica sum (the
    # multi-worker stop agreement); the sum lands in window.agreed.
    self._loss_gradients = (
        tf.function(self._loss_gradients_of, jit_compile=True, autograph=False)
        if xla_compile else self._loss_gradients_of)
    if self.replicas > 1:  # traced once, at the first batch (see OneTrace)
      self.micro_step_fn = OneTrace(self._distributed_micro_step)
      self.fused_step_fn = OneTrace(self._distributed_fused_step, FLAGS_SPEC)
    else:
      compile_fn = lambda fn, signature: tf.function(  # noqa: E731
          fn, input_signature=signature, autograph=False)
      self.micro_step_fn = compile_fn(self._distributed_micro_step, [BATCH_SPEC])
      self.fused_step_fn = compile_fn(self._distributed_fused_step, [BATCH_SPEC, FLAGS_SPEC])
    self.update_fn = tf.function(self._update, input_signature=[FLAGS_SPEC], autograph=False)
    self.take_window_fn = tf.function(self._take_window, autograph=False)
    self.eval_fn = tf.function(self._eval_loss, input_signature=[BATCH_SPEC], autograph=False)

  # --- state -------------------------------------------------------------------------
  @property
  def update_step(self) -> tf.Variable:
    return self.adam.iterations

  def trackables(self) -> dict:
    """What a checkpoint must hold to resume exactly."""
    state = {"model": self.model, "optimizer": self.adam, "micro_step": self.micro_step,
             "skipped_updates": self.skipped_updates, "in_update": self.in_update,
             "layout": self.layout, "divergence": self.divergence}
    if self.accumulator is not None:
      state["accumulator"] = self.accumulator
    if self.average is not None:
      state[ema_lib.CHECKPOINT_KEY] = self.average
    if self.cooldown:
      state["cooldown_end"] = self.cooldown_end
    if self.loss_scale is not None:
      state["loss_scale"] = self.loss_scale
      state["good_updates"] = self.good_updates
    return state

  def state_bytes(self) -> dict:
    params = sum(v.shape.num_elements() * 4 for v in self.variables)
    return {"parameters": params, "adam_slots": 2 * params,
            "accumulators": self.accumulator.nbytes() if self.accumulator else 0,
            "moving_average": self.average.nbytes() if self.average else 0}

  # --- one replica -------------------------------------------------------------------
  def _gradients(self, batch):
    """Gradients of the summed token loss of `batch` on this replica (dense, float32)."""
    seed = rate = None
    if self.dropout_on:
      replica = tf.distribute.get_replica_context().replica_id_in_sync_group
      seed = tf.stack([tf.constant(self.seed, tf.int64),
                       self.micro_step * self.replicas + tf.cast(replica, tf.int64)])
      # the update this micro-batch belongs to; None unless the hparams ramp the dropout
      rate = residual_dropout(self.hparams, self.update_step + 1)
    return self._loss_gradients(batch, seed, rate)

  def _loss_gradients_of(self, batch, seed, rate=None):
    """The forward and backward pass of `_gradients` (what XLA compiles, if asked)."""
    with tf.GradientTape() as tape:
      loss, tokens = self.model.loss(batch["inputs"], batch["targets"], seed,
                                     residual_rate=rate)
      scaled = self.faults.loss(loss, self.micro_step + 1)  # the loss itself, but in tests
      loss = self.faults.reported_loss(loss, self.micro_step + 1)
      if self.scaling:
        # Scale the per-token mean, not the sum: a summed loss times 2^15 would overflow
        # float16. The factor is undone exactly below, in float32.
        scale = self.loss_scale / tf.maximum(tokens, 1.0)
        scaled = scaled * scale
    grads = tape.gradient(scaled, self.variables)
    # Embedding gradients arrive as IndexedSlices; densify so every path (n = 1 or n > 1)
    # gives Adam the same dense gradient with duplicate ids summed.
    grads = [tf.cast(tf.convert_to_tensor(g), tf.float32) for g in grads]
    if self.scaling:
      grads = [g / scale for g in grads]
    return grads, loss, tokens

  def _accumulate(self, batch):
    grads, loss, tokens = self._gradients(batch)
    self.accumulator.add(grads, loss, tokens)
    self.window.count_batch(batch)

  def _fused_gradients(self, batch, flags):
    self.window.count_batch(batch)
    return (*self._gradients(batch), tf.identity(flags))

  # --- across replicas ---------------------------------------------------------------
  def _distributed_micro_step(self, batch):
    self.strategy.run(self._accumulate, args=(batch,))
    self.micro_step.assign_add(1)
    self.in_update.assign_add(1)

  def _sum_over_replicas(self, values):
    """Each of `values` (per-replica tensors or replica-local variables) summed over all
    replicas, as one batched reduction that TensorFlow packs into pack_bytes chunks."""
    if self.replicas == 1:
      return [v.read_value() if isinstance(v, tf.Variable) else v for v in values]
    options = tf.distribute.experimental.CommunicationOptions(bytes_per_pack=self.pack_bytes)
    graph = tf.compat.v1.get_default_graph()  # the graph being traced
    first_new_op = len(graph.get_operations())
    # Reducing onto a model variable's devices: an all-reduce among this worker's devices.
    reduced = self.strategy.extended.batch_reduce_to(
        SUM, [(v, self.variables[0]) for v in values], options=options)
    self.reduction = {"tensors": len(values), "collective_ops": sum(
        op.type.startswith("Collective") for op in graph.get_operations()[first_new_op:])}
    return reduced  # a copy on every device of the variables (Mirrored)

  def _distributed_fused_step(self, batch, flags):
    grads, loss, tokens, flags = self.strategy.run(self._fused_gradients, args=(batch, flags))
    *grads, loss, tokens, flags = self._sum_over_replicas([*grads, loss, tokens, flags])
    stats = self._apply(grads, loss, tokens, flags, self.micro_step + 1, self.micro_step)
    self.micro_step.assign_add(1)
    return stats

  def _update(self, flags):
    acc = self.accumulator
    flags = self.strategy.run(tf.identity, args=(flags,))  # one copy per replica
    *grads, loss, tokens, flags = self._sum_over_replicas(
        [*acc.gradients, acc.loss, acc.tokens, flags])
    stats = self._apply(grads, loss, tokens, flags, self.micro_step,
                        self.micro_step - self.in_update)
    self.strategy.run(acc.reset)
    self.in_update.assign(0)
    return stats

  def _take_window(self):
    """The window's values and counters packed into one float64 vector (one read; counts
    are exact in float64 up to 2^53)."""
    values = self.window.take()
    with tf.control_dependencies(list(values.values())):
      self.strategy.run(self.window.reset_counts)
    values.update(updates_done=self.update_step.read_value(),
                  micro_step=self.micro_step.read_value())
    return tf.stack([tf.cast(values[name], tf.float64) for name in WINDOW_FIELDS])

  def _apply(self, grad_sums, loss_sum, tokens, flags, micro_step, first_micro_step):
    """Divides by the token count, clips, and applies Adam unless something is non-finite:
    on every device at once, each from its own copy of the summed gradients (as Keras
    optimizers do), so no device waits for another's weights or slots to be copied over."""
    stats = self.strategy.extended.update(
        self.variables[0], self._apply_on_device,
        args=(grad_sums, loss_sum, tokens, flags, micro_step, first_micro_step), group=False)
    return {name: per_device[0] for name, per_device in stats.items()}  # group=False: tuples

  def _apply_on_device(self, _, grad_sums, loss_sum, tokens, flags, micro_step,
                       first_micro_step):
    """The update on one device: the variables and slots read and written here are that
    device's copies (inside strategy.extended.update)."""
    hparams = self.hparams
    denominator = tf.maximum(tokens, 1.0)
    grads = [g / denominator for g in grad_sums]
    norm = tf.linalg.global_norm(grads)
    finite = tf.math.is_finite(norm) & tf.math.is_finite(loss_sum)
    if hparams.clip_grad_norm > 0:
      grads, _ = tf.clip_by_global_norm(grads, hparams.clip_grad_norm, use_norm=norm)
    update = self.adam.iterations + 1
    lr = learning_rate(hparams, update, self.cooldown_end) * self.divergence.lr_factor(update)

    def apply():
      self.adam.apply(grads, self.variables, lr)
      if self.average is not None:  # reads the weights Adam just wrote (same resources)
        self.average.update(self.variables, tokens)
      return tf.constant(True)

    def skip():
      self.skipped_updates.assign_add(1)
      return tf.constant(False)

    tf.cond(finite, apply, skip)
    overflow = float16_due = tf.constant(False)
    if self.scaling:
      # Under float16 loss scaling, a finite loss with a non-finite gradient is an overflow
      # that lowering the scale handles, not a sign of a diverging run; at the minimum
      # scale nothing is left to lower, and it counts as non-finite.
      overflow = tf.math.is_finite(loss_sum) & ~finite & (self.loss_scale > MIN_LOSS_SCALE)
      self._adjust_loss_scale(finite)
      float16_due = self.divergence.count_min_scale(self.loss_scale <= MIN_LOSS_SCALE)
    loss = loss_sum / denominator
    stats = {"loss": loss, "grad_norm": norm, "learning_rate": lr, "tokens": tokens,
             "finite": finite, "overflow": overflow, "loss_mean": self.divergence.mean(),
             "float16_due": float16_due}
    stats["spike"] = self.divergence.judge(loss, finite, update)
    self.window.record(stats, micro_step, update, flags, first_micro_step,
                       self.divergence.max_consecutive)
    return stats

  def _adjust_loss_scale(self, finite):
    """Dynamic loss scaling: halve on overflow, double after 2000 good updates."""
    good = tf.where(finite, self.good_updates + 1, 0)
    grow = good >= 2000
    scale = tf.where(finite, tf.where(grow, self.loss_scale * 2.0, self.loss_scale),
                     tf.maximum(self.loss_scale / 2.0, MIN_LOSS_SCALE))
    self.loss_scale.assign(scale)
    self.good_updates.assign(tf.where(grow, tf.constant(0, tf.int64), good))

  def _eval_loss(self, batch):
    """(summed negative log-likelihood, tokens): no label smoothing, so dev figures compare
    across label_smoothing values and with other toolkits."""
    return self.model.loss(batch["inputs"], batch["targets"], smoothing=0.0)

  # --- the public steps --------------------------------------------------------------
  def accumulate_steps(self, update: int | None = None) -> int:
    """Micro-steps of update `update` (1-based; default: the update in progress)."""
    if update is None:
      steps_for = self.schedule.steps_for
      update = self.host.update_in_progress(
          lambda first, last: steps_for(first) != steps_for(last))
    return self.schedule.steps_for(update)

  def record_layout(self) -> None:
    """Before a save: the layout the checkpoint is written on."""
    self.layout.assign([self.replicas, self.accumulate_steps()])

  # --- after a restore (training.resume) ---------------------------------------------
  def derive_in_update(self, steps: int) -> None:
    """A checkpoint from before the update in progress was recorded: n was constant
    (`steps`), so the position follows from the micro-step counter."""
    self.in_update.assign(int(self.micro_step.numpy()) % steps)
    self.host.forget()

  def take_layout(self, replicas: int, steps: int, micro_step: int | None = None) -> None:
    """The state now belongs to `replicas` x `steps`: an older checkpoint's assumed layout,
    or a move to another layout with the micro-step counter rescaled to `micro_step` (the
    same micro-batch of the shared training stream)."""
    if micro_step is not None:
      self.micro_step.assign(micro_step)
    self.layout.assign([replicas, steps])
    self.host.forget()

  def start_fresh(self, names: list[str]) -> None:
    """Between updates, the variables `names` start training as in a new run (a resume on
    which they train and the checkpoint's run did not): Adam's moments at 0, the moving
    average at their weights (unchanged while they were frozen)."""
    variables = dict(zip(self.names, self.variables))
    for name in names:
      self.adam.m_of[name].assign(tf.zeros_like(variables[name]))
      self.adam.v_of[name].assign(tf.zeros_like(variables[name]))
      if self.average is not None:
        self.average.average_of[name].assign(variables[name])

  def skip_to(self, micro_step: int) -> None:
    """Between updates: the run goes on at micro-step `micro_step` of the training stream,
    past the micro-batches before it (a recovery's skip; training.recovery)."""
    if self.host.position():
      raise RuntimeError(f"a skip mid-update ({self.host.position()} micro-steps into it)")
    self.micro_step.assign(micro_step)
    self.host.moved_to(micro_step)

  def continue_in_float32(self) -> None:
    """A float16 run computes in float32 from the next step on, without loss scaling (the
    scale stays in the checkpoint, unused); the steps are traced again."""
    self.scaling = False
    self.model.compute_in(tf.float32)
    self._compile(self.xla_compile)

  def fix_cooldown_end(self, end: int) -> None:
    """The run's last update under a learning-rate cooldown, once fixed (budget.RunEnd)."""
    self.cooldown_end.assign(end)

  def run_update(self, next_batch, flags=NO_FLAGS, after_micro_step=None) -> bool:
    """Runs the micro-steps of one update, each on `next_batch()`; True once the update is
    done. `after_micro_step(micro_step)` is called after each micro-step: True cuts the update
    short there (False is then returned; the state stays resumable mid-update on one
    replica). `flags` ride in the update's cross-replica sum (see read_agreed)."""
    while True:
      done = self.step(next_batch(), flags) is not None
      micro_step = self.host.counted()
      if after_micro_step is not None and after_micro_step(micro_step) and not done:
        return False
      if done:
        return True

  def step(self, batch, flags=NO_FLAGS):
    """One micro-step; returns the update's statistics (device tensors, not read) when it
    completed an update, else None. `flags` (see FLAGS_SPEC) of this process are summed over
    all replicas in the update (see read_agreed)."""
    steps = self.accumulate_steps()
    self.in_step = True  # stays True if a compiled step raises: its state may be half-written
    if steps == 1 and self.host.position() == 0:
      stats = self.fused_step_fn(batch, tf.constant(flags, tf.float32))
    else:
      self.micro_step_fn(batch)
      if self.host.position() + 1 < steps:
        self.host.stepped(update_done=False)
        self.in_step = False
        return None
      stats = self.update_fn(tf.constant(flags, tf.float32))
    self.host.stepped(update_done=True)
    self.in_step = False
    return stats

  def read_window(self) -> dict:
    """The statistics of the updates since the last call, read from the device at once (as
    Python numbers), and a new window begun: updates_done, micro_step, attempts, updates
    (applied), skipped (non-finite), overflows (absorbed float16 overflows), consecutive
    (non-finite in a row), last_skip_update/_micro_step, loss (sum of the applied updates'
    mean losses), tokens, learning_rate and grad_norm (of the last applied update), padding
    and slots (token slots of the micro-batches)."""
    self.host.position()  # (the mirrors read before the window moves them on)
    packed = self.take_window_fn().numpy()
    values = {name: float(value) if name in Window.SUMS + ("padding", "slots") else int(value)
              for name, value in zip(WINDOW_FIELDS, packed)}
    self.host.confirm(values["updates_done"])
    return values

  def read_agreed(self) -> tuple[bool, bool, bool]:
    """(stop signal, time budget, timed save): whether any process asked for them in the
    last update's flags (a read of this process's copy of the sum; no collective)."""
    return tuple(bool(flag > 0) for flag in self.window.agreed.numpy())
