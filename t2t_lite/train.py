"""The training loop: micro-steps and updates, logs and summaries, stops.

The loop's collaborators each sit in their own module: `learner` (the compiled micro-steps
and updates), `checkpoints` (save, restore, multi-worker agreement), `evaluation` (dev loss,
perplexity, BLEU, the best model) and `faults` (fault injection for the reliability tests).

Checkpoints (`output_dir/ckpt-<micro-batches>`, counting the micro-batches of all replicas)
hold the model, Adam's slots and step, the accumulators and token counter, the micro-step
counters and the training data iterator, so a run stopped anywhere, mid-accumulation
included, resumes to the same parameters as a run never stopped.

All replicas share one training stream: micro-step m of replica r trains on micro-batch
m x replicas + r of it. Between updates the state is therefore layout-free, and a run may
resume on another layout with the same tokens per update (1 replica x n=8, 2 x n=4, 8 x 1):
it continues the same stream, and ends where a run never moved would. Checkpoints are
written every `save_checkpoints_steps` updates, before every evaluation and at exit (end,
time budget, Ctrl-C or SIGTERM). With more than one replica a stop waits for the end
of the update in progress, so that such a checkpoint holds no replica-local accumulators
(they would be restored as their sum spread over the replicas of the new process).
"""

from __future__ import annotations

import dataclasses
import os
import signal
import time
from dataclasses import dataclass

import tensorflow as tf
from absl import logging

from t2t_lite import budget, distribute
from t2t_lite import faults as faults_lib
from t2t_lite import formats, hparams_check, rundir
from t2t_lite import stream as stream_lib
from t2t_lite.checkpoints import Checkpoints, checkpoint_number, warm_start, warm_start_source
from t2t_lite.errors import RunError, UsageError
from t2t_lite.evaluation import Evaluator
from t2t_lite.decide import (EARLY_STOP, SIGNAL, TIME_BUDGET, TRAIN_STEPS, Agreed,
                             Checkpointing, Evaluation, Progress, Schedule, Stopping, decide)
from t2t_lite.learner import NO_FLAGS, Learner
from t2t_lite.problems.base import SAMPLED
from t2t_lite.steps import BatchPlan

# The checkpoint's name of the micro-batch of the training stream from which the sampled
# segmentations are read (see stream.TrainingStream); that is UNDECIDED until the run's
# length is judged (hparams.subword_sampling_min_updates), NEVER if too short.
SAMPLED_FROM = "sampled_from_batch"
# The run's training time in seconds over all its processes, which --train_minutes budgets.
TRAIN_SECONDS = "train_seconds"
UNDECIDED, NEVER = -1, -2


@dataclass
class RunOptions:
  output_dir: str
  data_dir: str
  seed: int = 1
  checkpointing: Checkpointing = Checkpointing()
  evaluation: Evaluation = Evaluation()
  stopping: Stopping = Stopping()
  log_every: int = 100                  # updates; 0 = only the last update
  warm_start_from: str = ""             # a run or checkpoint whose weights a new run starts from
  warm_start_optimizer: bool = False    # ... and its Adam slots
  allow_hparams_change: bool = False    # resume on a layout with other tokens per update
  allow_stream_change: bool = False     # resume a checkpoint of an older data position on
                                        # the planned stream
  xla_compile: bool = False             # XLA for the forward and backward pass; batches
                                        # padded to their bucket's boundary (a shape each)


def _layout(replicas: int, steps: int) -> str:
  return (f"{replicas} replica{'s' if replicas > 1 else ''} x {steps} micro-step"
          f"{'s' if steps > 1 else ''} per update")


def format_duration(seconds: float) -> str:
  seconds = int(max(seconds, 0))
  hours, rest = divmod(seconds, 3600)
  return f"{hours}h{rest // 60:02d}m" if hours else f"{rest // 60}m{rest % 60:02d}s"


class NonFiniteGuard:
  """Stops a diverging run: too many updates in a row skipped for a non-finite loss or
  gradient (the device counts them; see learner.Window). A float16 overflow that the loss
  scale can still absorb (the scale was above its minimum and is halved) is not divergence;
  at the minimum scale it counts like any non-finite one."""

  def __init__(self, max_consecutive: int, output_dir: str = ""):
    self.max_consecutive = max_consecutive
    self.output_dir = output_dir

  def check(self, consecutive: int, update: int) -> None:
    """Raises RunError when `consecutive` non-finite updates in a row reach the limit."""
    if consecutive >= self.max_consecutive:
      raise RunError(
          f"{consecutive} updates in a row had a non-finite loss or gradient "
          f"(max_consecutive_nonfinite={self.max_consecutive}); stopped at update {update}. "
          f"The last good checkpoint is kept in {self.output_dir}; lower "
          "learning_rate_constant or set clip_grad_norm, then resume")


class Trainer:
  """Trains one problem's model in `output_dir`, resuming from it when it holds checkpoints."""

  def __init__(self, hparams, problem, plan: BatchPlan, options: RunOptions,
               strategy: tf.distribute.Strategy | None = None, is_chief: bool = True,
               worker_name: str = "worker", after_update=None):
    """`after_update(tried)`, if given, is called after each update and what followed it
    (log, save, evaluation) with the number of updates tried: a hook for observers such as
    a count of device reads per update; it must not read the device itself."""
    self.hparams, self.problem, self.plan, self.options = hparams, problem, plan, options
    self.strategy = strategy or tf.distribute.get_strategy()
    self.is_chief = is_chief
    self._after_update = after_update
    self.vocab = problem.get_vocab(options.data_dir)
    self._recorded = rundir.read_meta(options.output_dir)  # the run's record, if it has one
    self.faults = faults_lib.from_environment()
    splits = self._splits = self._training_splits()  # (refusals before the model is built)
    self.learner = Learner(hparams, self.vocab.size, plan.accumulation, options.seed,
                           self.strategy, self.faults, options.xla_compile)
    self.dev_files = problem.data_files(options.data_dir, "dev")
    self.stream = self._make_stream(splits)
    self._sampled_from = UNDECIDED  # the host's mirror of sampled_from (see _start_sampling)
    with self.strategy.scope():
      self.sampled_from = tf.Variable(UNDECIDED, name=SAMPLED_FROM, dtype=tf.int64,
                                      trainable=False,
                                      aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)
      self.train_seconds = tf.Variable(0.0, name=TRAIN_SECONDS, dtype=tf.float64,
                                       trainable=False,
                                       aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)
    streams = {TRAIN_SECONDS: self.train_seconds}
    if len(splits) == 2:
      streams[SAMPLED_FROM] = self.sampled_from
    # Every worker resumes from the chief's checkpoints in output_dir (a shared filesystem;
    # the data position is the micro-step counter, the same on all) and takes part in every
    # save (reading the accumulators is a collective), which only the chief keeps. The
    # accumulators exist only for n > 1; what later versions added may be missing from an
    # older checkpoint, and formats.upgrade_restored fills it in.
    self.checkpoints = Checkpoints(
        {**streams, **self.learner.trackables()}, options.output_dir, options.checkpointing,
        self.strategy, self.faults, is_chief=is_chief, before_restore=self._check_stream,
        optional=("accumulator", "cooldown_end", SAMPLED_FROM, TRAIN_SECONDS,
                  *formats.ADDED_TO_CHECKPOINTS),
        shape_differences=tuple(rundir.shape_differences(
            self._recorded, hparams, self.vocab.size)))
    self._multi_worker = self.checkpoints.multi_worker
    if self._multi_worker:
      distribute.check_shared_directory(self.strategy, is_chief, worker_name,
                                        options.output_dir)
    self._stop_signal = None
    self._restored = False
    self.warm_started_from = None  # the checkpoint a new run started from
    self._reduction_logged = False
    self._lacks = set()  # what the checkpoint restored lacked (see _check_stream)
    self.train_writer = tf.summary.create_noop_writer()
    self.evaluator = None
    if is_chief:
      self.train_writer = None  # opened by train(), after the resume was accepted
      if options.evaluation.frequency:
        self.evaluator = Evaluator(
            self.learner, hparams, self.vocab, self.dev_files, options.output_dir,
            options.evaluation, options.stopping,
            problem.manifest(options.data_dir).get("settings", {}).get("target_lang", ""))
    self.schedule = Schedule(plan.train_steps, options.stopping, options.checkpointing,
                             options.evaluation, options.log_every)
    self._pace = None  # since the first budget check (see _plan_cooldown)
    self._clock = None  # while the loop runs

  def _training_splits(self) -> list[str]:
    """The training splits read in turn: "train", or on data with sampled segmentations
    the sampled split, after the one best's updates if the hparams may want any (see
    _start_sampling)."""
    manifest = self.problem.manifest(self.options.data_dir)
    start = self.plan.sampling_start
    minimum = self.hparams.subword_sampling_min_updates
    if SAMPLED not in manifest["splits"]:
      return ["train"]  # nothing to switch to: the one best throughout (logged)
    if minimum and not start and self.options.stopping.train_minutes:
      raise UsageError(
          f"subword_sampling_min_updates={minimum} with a time budget is judged by the "
          "budget's projection at update subword_sampling_start, which is 0: set "
          "subword_sampling_start to an update after the first budget checks (e.g. 100)")
    if minimum and self.options.stopping.train_minutes and not hparams_check.has_cooldown(
        self.hparams):
      raise UsageError(
          f"subword_sampling_min_updates={minimum} with a time budget is judged by the "
          "projection of the learning-rate cooldown, which learning_rate_schedule="
          f"{self.hparams.learning_rate_schedule!r} lacks; append '*linear_cooldown', or "
          "drop --train_minutes or subword_sampling_min_updates")
    if "train" not in manifest["splits"] and (start or minimum):
      raise UsageError(
          f"{self.options.data_dir} holds only sampled segmentations (made by an earlier "
          f"t2t-lite-datagen), and subword_sampling_start={start} with "
          f"subword_sampling_min_updates={minimum} may want the one best; make it again "
          "with t2t-lite-datagen --overwrite (the same sampled records, the one best beside "
          "them), or set both to 0 to read its sampled records from the start")
    return ["train", SAMPLED] if start or minimum else [SAMPLED]

  def _make_stream(self, splits: list[str]) -> stream_lib.TrainingStream:
    """The training stream, whatever the layout (see stream.TrainingStream): this process
    reads only its own replicas' batches, so 2 replicas in one process, 2 worker processes
    and 1 replica with twice the micro-steps train on the same batches. With two `splits`
    (the one best, then the sampled segmentations), the switch is a position in the stream,
    counted in micro-batches as the micro-step counter is (a skipped update has read its
    batches too), so a resumed run, on any layout, switches where a run never stopped does.
    """
    ids = self.strategy.experimental_distribute_values_from_function(
        lambda context: context.replica_id_in_sync_group)
    self.replica_ids = [int(i) for i in self.strategy.experimental_local_results(ids)]
    stores = [self.problem.training_store(self.options.data_dir, split) for split in splits]
    return stream_lib.TrainingStream(
        stores, stream_lib.Batching.of(self.hparams, self.options.xla_compile),
        self.options.seed, self.plan.replicas, self.replica_ids)

  # --- when the sampled segmentations are read (see steps.BatchPlan) --------------------
  def _start_sampling(self, update: int) -> None:
    """The micro-batch the sampled segmentations are read from: recorded in the checkpoint,
    or decided now (no minimum length, or the run's length is --train_steps), or left to
    the time budget's projection (see _judge_sampling)."""
    minimum, start = self.hparams.subword_sampling_min_updates, self.plan.sampling_start
    if len(self._splits) < 2:
      if self._splits == [SAMPLED]:
        logging.info("subword sampling: the sampled segmentations from the start")
      elif start or minimum:
        logging.info("subword sampling: the one best segmentation throughout (%s has no "
                     "sampled segmentations)", self.options.data_dir)
      return
    self._sampled_from = int(self.sampled_from.numpy())
    if self._sampled_from != UNDECIDED:
      logging.info("subword sampling: %s (recorded in the run)", self._sampling_said())
    elif not minimum:
      self._decide_sampling(True, update, "")
    elif int(self.learner.cooldown_end.numpy()):  # fixed: no more checks of the budget
      end = int(self.learner.cooldown_end.numpy())
      self._decide_sampling(end >= minimum, update, f"the run's last update, {end}")
    elif not self.options.stopping.train_minutes:
      self._decide_sampling(self.plan.train_steps >= minimum, update,
                            f"--train_steps={self.plan.train_steps}")
    else:
      logging.info("subword sampling: from update %d if the time budget's projection at "
                   "update %d reaches %d updates, else the one best throughout",
                   start + 1, start, minimum)

  def _judge_sampling(self, update: int, length: int, final: bool) -> None:
    """At a check of the time budget, which projects the run's `length` (`final`: fixed):
    decides the segmentations at the last check before subword_sampling_start is passed,
    or at the first one after it that has a projection."""
    if len(self._splits) < 2 or self._sampled_from != UNDECIDED or not length:
      return
    if final or update + self.schedule.cooldown_every > self.plan.sampling_start:
      self._decide_sampling(length >= self.hparams.subword_sampling_min_updates, update,
                            f"the time budget's projection at update {update}: "
                            f"{length} updates")

  def _decide_sampling(self, switch: bool, update: int, why: str) -> None:
    start = self.plan.sampling_start
    chosen = NEVER
    if switch:
      # From where the stream is now: the micro-steps of the updates still to come before
      # start (the counter's past may have run on another layout, or skipped updates).
      ahead = (self.plan.accumulation.micro_steps(start)
               - self.plan.accumulation.micro_steps(update)) if update < start else 0
      done = self.learner.host_micro_step() - self.learner.position()  # at the update's start
      chosen = self.plan.replicas * (done + ahead)
    self.sampled_from.assign(chosen)
    self._sampled_from = chosen
    minimum = self.hparams.subword_sampling_min_updates
    logging.info("subword sampling: %s%s", self._sampling_said(),
                 f" ({why}; subword_sampling_min_updates={minimum})" if why else "")

  def _sampling_said(self) -> str:
    if self._sampled_from == NEVER:
      return "the one best segmentation throughout"
    update = self.plan.accumulation.last_update_within(
        self._sampled_from // self.plan.replicas, 1 << 40)
    return (f"the sampled segmentations from update {update + 1}" if update else
            "the sampled segmentations from the start")

  def next_batch(self):
    """The next micro-batch of every local replica, as the strategy's per-replica value."""
    micro_step = self.learner.host_micro_step()
    if (self._sampled_from >= 0 and len(self._splits) == 2
        and micro_step * self.plan.replicas == self._sampled_from):
      logging.info("update %d: training reads the sampled segmentations from here on",
                   int(self.learner.update_step.numpy()) + 1)  # (one device read, once)
    taken = self.stream.micro_batches(micro_step, self._sampled_from)
    batches = dict(zip(self.replica_ids, taken))
    if len(batches) == 1 and self.strategy.num_replicas_in_sync == 1:
      return {name: tf.constant(value) for name, value in taken[0].items()}
    return self.strategy.experimental_distribute_values_from_function(
        lambda context: {name: tf.constant(value) for name, value in
                         batches[context.replica_id_in_sync_group].items()})

  # --- checkpoints -------------------------------------------------------------------
  def _check_stream(self, path: str, names: set[str]) -> None:
    """What an older checkpoint lacks (upgraded once restored), or its refusal."""
    self._lacks = formats.checkpoint_lacks(path, names, self.options.allow_stream_change)

  def _check_layout(self, path: str) -> None:
    """A checkpoint written on another layout (replicas x accumulate steps): resumable
    between updates, when the tokens per update stay the same; the micro-step counter is
    rescaled so that the run continues the same stream."""
    learner, plan = self.learner, self.plan
    old_replicas, old_steps = (int(x) for x in learner.layout.numpy())
    steps = learner.accumulate_steps()
    if (old_replicas, old_steps) == (plan.replicas, steps):
      return
    update = int(learner.update_step.numpy())
    position = learner.position()
    layouts = f"from {_layout(old_replicas, old_steps)} to {_layout(plan.replicas, steps)}"
    if position:
      raise UsageError(
          f"checkpoint {path} was written mid-update ({position} of {old_steps} micro-steps "
          f"of update {update + 1}) and cannot resume on another layout ({layouts}); resume "
          f"it on its own layout with --train_steps={update + 1} to reach the end of that "
          "update, then move")
    if old_replicas * old_steps != plan.replicas * steps and not self.options.allow_hparams_change:
      raise UsageError(
          f"resuming {path} on {layouts} changes the tokens per update from "
          f"{old_replicas * old_steps * plan.batch_size} to "
          f"{plan.replicas * steps * plan.batch_size}; "
          f"{self._layout_hint(old_replicas, old_steps, update)}")
    batches = int(learner.micro_step.numpy()) * old_replicas
    if batches % plan.replicas:
      raise UsageError(f"checkpoint {path} is at micro-batch {batches} of the training "
                       f"stream, which {plan.replicas} replicas cannot continue evenly; "
                       "resume on its own layout")
    learner.micro_step.assign(batches // plan.replicas)
    learner.layout.assign([plan.replicas, steps])
    learner.forget_host_counters()
    logging.info("resumed on another layout: %s (%d tokens per update), at micro-batch %d "
                 "of the training stream", layouts, plan.replicas * steps * plan.batch_size,
                 batches)

  def _layout_hint(self, old_replicas: int, old_steps: int, update: int) -> str:
    """How to keep the tokens per update on this replica count."""
    replicas, schedule = self.plan.replicas, self.learner.schedule
    if not schedule.explicit:
      wanted = old_replicas * old_steps / replicas
      hint = (f"optimizer_multistep_accumulate_steps={int(wanted)}" if wanted == int(wanted)
              else f"a replica count that divides {old_replicas * old_steps}")
      return (f"use {hint} (or set effective_batch_tokens), or pass --allow_hparams_change "
              "to accept the change")
    # A schedule: its phases from the update in progress on, scaled to the new replicas
    # (the phases before it are done and stay as they were).
    current = [i for i, (_, after) in enumerate(schedule.phases) if after <= update][-1]
    scaled = [(n, after) if i < current else (n * old_replicas / replicas, after)
              for i, (n, after) in enumerate(schedule.phases)]
    if any(n != int(n) or n < 1 for n, _ in scaled[current:]):
      return (f"use a replica count that divides every n from update {update + 1} on, or "
              "pass --allow_hparams_change to accept the change")
    text = ";".join(f"{int(n)}@{after}" for n, after in scaled)
    return (f"pass --hparams=optimizer_multistep_accumulate_schedule={text} (the schedule's "
            "n from here on scaled to the new replicas) with --allow_hparams_change, or "
            "pass --allow_hparams_change alone to accept the change")

  def restore(self) -> bool:
    """Restores the newest usable checkpoint (see t2t_lite.checkpoints); a new run with
    `warm_start_from` starts from that run's weights instead. Called by `train`, or before
    it to check a resume before anything is written."""
    if self._restored:
      return self._resumed
    self._restored = True
    self._resumed = self._restore()
    return self._resumed

  def _restore(self) -> bool:
    path = self.checkpoints.restore()
    if path is None:
      if self.options.warm_start_from:
        source = self.warm_started_from = self._warm_start_checkpoint()
        warm_start(self.learner, source, self.options.warm_start_optimizer,
                   self.options.warm_start_from)
        logging.info("warm start from %s: model weights%s; update 0", source,
                     " and Adam's slots" if self.options.warm_start_optimizer else "")
      return False
    if self.options.warm_start_from:
      logging.warning("%s has checkpoints: resuming this run; --warm_start_from applies to "
                      "a new run only", self.checkpoints.directory)
    self.learner.forget_host_counters()
    formats.upgrade_restored(self.learner, self._lacks, self._recorded,
                             path)
    self._check_layout(path)
    logging.info("resumed from %s: update %d, micro-step %d", path,
                 int(self.learner.update_step.numpy()), int(self.learner.micro_step.numpy()))
    return True

  def _warm_start_checkpoint(self) -> str:
    """The checkpoint that --warm_start_from names, resolved once, by the chief: a run's
    newest checkpoint may change while the workers start, and all must read the same."""
    source = self.options.warm_start_from
    if not self._multi_worker:
      return warm_start_source(source)
    number = 0.0
    if self.is_chief:
      path = warm_start_source(source)
      if os.path.isdir(source):
        if not os.path.basename(path).startswith("ckpt-"):
          raise UsageError(f"--warm_start_from={source}: its newest checkpoint {path} is not "
                           "a t2t-lite ckpt-N; on a cluster give the checkpoint prefix itself")
        number = float(checkpoint_number(path))
    number = int(self._from_chief([number])[0])
    return os.path.join(source, f"ckpt-{number}") if os.path.isdir(source) else source

  def save(self) -> str:
    if self._clock is not None:
      self.train_seconds.assign(self._clock.spent())
    micro_step = int(self.learner.micro_step.numpy())
    number = micro_step * self.plan.replicas  # micro-batches of the stream
    already_saved = self.checkpoints.last_saved == number
    if not already_saved:
      self.learner.record_layout()
    path = self.checkpoints.save(number)
    if not already_saved:
      logging.info("saved %s (update %d, micro-step %d)", path,
                   int(self.learner.update_step.numpy()), micro_step)
    return path

  # --- stops and what the workers share -------------------------------------------------
  def request_stop(self, signum: int) -> None:
    if self._stop_signal is not None:  # a second Ctrl-C stops at once
      raise KeyboardInterrupt
    self._stop_signal = signum
    logging.warning("received signal %d: finishing this %s and saving", signum,
                    "micro-step" if self._stops_mid_update() else
                    f"update ({self.plan.replicas} replicas save only between updates)")

  def _on_signal(self, signum, frame):
    self.request_stop(signum)

  def _stops_mid_update(self) -> bool:
    """One replica in one process may stop between micro-steps; replicas save only between
    updates (replica-local accumulators are not checkpointed)."""
    return self.plan.replicas == 1 and not self._multi_worker

  def _after_micro_step(self, micro_step: int) -> bool:
    """Whether to cut the update short after this micro-step (a stop signal)."""
    self.faults.after_micro_step(micro_step, self.request_stop)
    return self._stop_signal is not None and self._stops_mid_update()

  def _from_chief(self, values: list[float]) -> list[float]:
    """The chief's `values`, on every worker (distribute.from_chief). One process: `values`."""
    if not self._multi_worker:
      return values
    return distribute.from_chief(self.strategy, values)

  # --- the loop ----------------------------------------------------------------------
  def train(self) -> dict:
    """Runs updates until --train_steps, the time budget, or a signal; returns a summary."""
    self.restore()
    if self.train_writer is None:
      self.train_writer = tf.summary.create_file_writer(
          os.path.join(self.options.output_dir, "train"))
    for line in self.plan.lines():
      logging.info("%s", line)
    hparams = self.hparams
    if hparams_check.has_dropout_ramp(hparams):
      logging.info("residual dropout: %g until update %d, rising linearly to %g at update %d",
                   hparams.dropout_ramp_initial, hparams.dropout_ramp_start,
                   hparams.layer_prepostprocess_dropout, hparams.dropout_ramp_end)
    previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    for s in previous:
      signal.signal(s, self._on_signal)
    try:
      return self._loop()
    except (RunError, UsageError, OSError):
      raise  # a diverging run keeps its last good checkpoint; a full disk would fail again
    except Exception as err:
      # Save what is consistent: not from inside a compiled step (its state may be half
      # written), and not with several workers (a save is a collective they are not in).
      if self._multi_worker or self.learner.in_step:
        raise
      path = self.save()
      cause = str(err).strip().splitlines()[0][:200] if str(err).strip() else ""
      raise RunError(f"{type(err).__name__}{': ' + cause if cause else ''}; the run was saved "
                     f"first ({path}): fix the cause and rerun to resume") from err
    finally:
      for s, handler in previous.items():
        signal.signal(s, handler)

  def _loop(self) -> dict:
    """Runs updates and does what `decide` says follows each (see t2t_lite.decide). The
    micro-steps read nothing from the device: the host counts the updates it tried and
    reads the device's window of statistics only when `decide` asks for it."""
    learner = self.learner
    clock = self._clock = _Clock(self.options, float(self.train_seconds.numpy()))
    if clock.spent_before and self.options.stopping.train_minutes:
      logging.info("time budget: %s of %g minutes trained by this run's earlier processes; "
                   "%s left", format_duration(clock.spent_before),
                   self.options.stopping.train_minutes,
                   format_duration(clock.deadline - clock.start))
    self._guard = NonFiniteGuard(self.hparams.max_consecutive_nonfinite,
                                 self.options.output_dir)
    self._window = {"updates": 0, "tokens": 0.0, "loss": 0.0, "padding": 0.0, "slots": 0.0}
    update = self._read_window()  # a new window
    self._start_cooldown(update)
    self._start_sampling(update)
    progress = Progress(tried=update, seen=update, applied=update)
    # A resumed run that early stopping had stopped stays stopped.
    early = self.evaluator is not None and self.evaluator.early_stop(update) is not None
    actions = decide(progress, Agreed(early_stop=self._from_chief([float(early)])[0] > 0),
                     self.schedule)
    agreement = _Agreement(learner, self._multi_worker, clock,
                           lambda: self._stop_signal is not None)
    while actions.stop is None:
      completed = learner.run_update(self.next_batch, agreement.outgoing,
                                     self._after_micro_step)
      self._log_reduction()
      progress = progress.next(completed)
      agreed = agreement.after_update()
      actions = decide(progress, agreed, self.schedule)  # (its end may be fixed on the way)
      if actions.read:
        progress = Progress(progress.tried, progress.seen, applied=self._read_window())
        actions = decide(progress, agreed, self.schedule)
      actions = self._follow(actions, progress, agreed, clock)
      agreement.before_next_update()
      if self._after_update is not None:
        self._after_update(progress.tried)
    return self._finish(actions.stop, progress, clock)

  def _follow(self, actions, progress: Progress, agreed: Agreed, clock: _Clock):
    """Logs, saves and evaluates as `actions` say; returns them, or, when the evaluation
    says to stop early, what `decide` answers to that."""
    update = progress.applied
    if update is not None and update > progress.seen:
      self._log_phase(update)
    if actions.log:
      self._log(update, clock)
    if actions.plan:
      self._plan_cooldown(update, clock)
    if actions.save:
      pause = time.time()
      self.save()
      clock.saved(pause)
    if actions.evaluate and self._evaluate(update, clock):
      return decide(Progress(update, update, update), agreed.with_early_stop(), self.schedule)
    return actions

  def _evaluate(self, update: int, clock: _Clock) -> bool:
    """Evaluates on the chief (the update is saved already) while the other workers wait
    for its verdict; whether early stopping says to stop."""
    pause = time.time()
    early = False
    if self.evaluator is not None:
      self.evaluator.evaluate(update)
      early = self.evaluator.early_stop(update) is not None
    early = self._from_chief([float(early)])[0] > 0
    clock.paused(pause)
    return early

  def _finish(self, stop: str, progress: Progress, clock: _Clock) -> dict:
    learner = self.learner
    update = progress.applied if progress.applied is not None else progress.seen
    path = self.save()
    self.train_writer.flush()
    if self.evaluator is not None:
      self.evaluator.flush()
    reason = stop
    if stop == EARLY_STOP:
      reason = (self.evaluator.early_stop(update) if self.evaluator is not None
                else "early stopping, by the chief's evaluation")
    elif stop == SIGNAL:
      reason = (f"signal {self._stop_signal}" if self._stop_signal is not None
                else "a stop signal on another worker")
    elif stop == TIME_BUDGET:
      reason = f"time budget of {self.options.stopping.train_minutes:g} minutes reached"
    elif stop == TRAIN_STEPS and self.schedule.train_steps < self.plan.train_steps:
      reason = (f"the learning-rate cooldown's last update ({self.schedule.train_steps}) "
                "reached")
    micro_step = learner.host_micro_step()
    logging.info("stopped: %s; update %d, micro-step %d, %s", reason, update, micro_step, path)
    stream = self.stream
    logging.info("input: this process read %d examples in %d micro-batches of the training "
                 "stream (its %d of %d replicas)", stream.examples_read, stream.batches_read,
                 len(self.replica_ids), self.plan.replicas)
    stream.close()
    return {"updates": update, "micro_steps": micro_step, "stop_reason": reason,
            "checkpoint": path, "train_seconds": round(time.time() - clock.start, 1),
            "skipped_updates": int(learner.skipped_updates.numpy()),
            "examples_read": stream.examples_read, "batches_read": stream.batches_read}

  # --- the cooldown's last update (see t2t_lite.budget) ----------------------------------
  def _start_cooldown(self, update: int) -> None:
    """The run's last update, if its schedule has a cooldown: the one recorded in the
    checkpoint, or --train_steps without a time budget; with one, checks of the budget
    every log interval (25 updates if there are no log lines) until it is fixed."""
    learner = self.learner
    if not learner.cooldown:
      return
    end, source = int(learner.cooldown_end.numpy()), "recorded in the run"
    if end == 0 and not self.options.stopping.train_minutes:
      end, source = self.plan.train_steps, "--train_steps"
      learner.cooldown_end.assign(end)
    if end == 0:
      self.schedule = dataclasses.replace(self.schedule,
                                          cooldown_every=self.options.log_every or 25)
      logging.info("learning-rate cooldown over the last %g of the updates that the time "
                   "budget allows, projected every %d updates until it starts",
                   self.hparams.learning_rate_cooldown, self.schedule.cooldown_every)
      return
    self._fix_end(end, source)
    if end < self.plan.train_steps and update >= end:
      logging.info("this run ended at update %d, the end of its learning-rate cooldown; to "
                   "train longer, start a new run with --warm_start_from=%s", end,
                   self.options.output_dir)

  def _plan_cooldown(self, update: int, clock: _Clock) -> None:
    """A check of the time budget: projects the run's last update from the pace since the
    first check (the chief's, on a cluster) and fixes it before the cooldown would start."""
    now = time.time()
    if self._pace is None:
      self._pace = budget.Pace(update, now, self.learner.schedule)
      return
    projected = self._pace.project(update, now, clock.deadline, self.plan.train_steps)
    projected = int(self._from_chief([float(projected or 0) if self.is_chief else 0.0])[0])
    fraction = self.hparams.learning_rate_cooldown
    final = bool(projected) and budget.fix_now(update, projected, fraction,
                                               self.schedule.cooldown_every)
    self._judge_sampling(update, projected, final)
    if final:
      self.learner.cooldown_end.assign(projected)
      self._fix_end(projected, f"the time budget's projection at update {update}, "
                    f"{(self._pace.rate(update, now) or 0.0) * 60:.0f} "
                    "updates a minute")

  def _fix_end(self, end: int, source: str) -> None:
    self.schedule = dataclasses.replace(
        self.schedule, train_steps=min(self.plan.train_steps, end), cooldown_every=0)
    fraction = self.hparams.learning_rate_cooldown
    logging.info("learning-rate cooldown: updates %d-%d, falling to 0 after update %d (%s)",
                 budget.cooldown_start(end, fraction), end, end, source)

  def _log_phase(self, update: int) -> None:
    """With an accumulation schedule: says when the next update starts another phase."""
    schedule, plan = self.learner.schedule, self.plan
    if schedule.varies and update < plan.train_steps:
      old, new = schedule.steps_for(update), schedule.steps_for(update + 1)
      if old != new:
        logging.info("accumulate steps %d -> %d from update %d (%d tokens per update)", old,
                     new, update + 1, plan.batch_size * new * plan.replicas)

  def _log_reduction(self) -> None:
    """Once, after the first update: how the update's cross-replica sum was built."""
    if self.learner.reduction is None or self._reduction_logged:
      return
    self._reduction_logged = True
    collectives = self.learner.reduction["collective_ops"]
    logging.info("cross-replica sum per update: %d tensors in %s",
                 self.learner.reduction["tensors"],
                 f"{collectives} collective all-reduce op(s)" if collectives
                 else "a reduction to one device")

  def _read_window(self) -> int:
    """Reads the device's window of statistics (a collective across workers): adds it to
    the window of the next log line, reports skipped updates, stops a diverging run.
    Returns the updates applied."""
    read = self._last_read = self.learner.read_window()
    for name in self._window:
      self._window[name] += read[name]
    update = read["updates_done"]
    if read["overflows"]:
      logging.info("float16 overflow at %s: update%s skipped, loss scale lowered to %g",
                   f"update {update + 1}" if read["overflows"] == 1 else
                   f"{read['overflows']} updates since update {update - read['updates']}",
                   "" if read["overflows"] == 1 else "s", float(self.learner.loss_scale.numpy()))
    if read["skipped"]:
      where = (f"update {read['last_skip_update']} (micro-step {read['last_skip_micro_step']})")
      if read["skipped"] > 1:
        where = f"{read['skipped']} updates, the last at {where}"
      logging.warning("non-finite loss or gradient at %s: update%s skipped, accumulators "
                      "reset (%d in a row, %d skipped in all)", where,
                      "" if read["skipped"] == 1 else "s", read["consecutive"],
                      int(self.learner.skipped_updates.numpy()))
    self._guard.check(read["consecutive"], update)
    return update

  def _log(self, update: int, clock: _Clock) -> None:
    """One progress line and the train summaries of the updates since the previous one
    (the window, then emptied; the learning rate and norm of the last read)."""
    window, read = self._window, self._last_read
    now = time.time()
    elapsed = max(now - clock.window_start, 1e-9)
    clock.window_start = now
    window_updates, window_tokens = max(window["updates"], 1), window["tokens"]
    end = self.schedule.train_steps  # --train_steps, or the end of a cooldown
    remaining = (end - update) / max(window_updates / elapsed, 1e-9)
    if clock.deadline is not None:
      remaining = min(remaining, clock.deadline - now)
    tokens_per_second = window_tokens / elapsed
    loss = window["loss"] / window_updates
    padding = window["padding"] / max(window["slots"], 1)
    for name in window:
      window[name] = 0
    logging.info("update %d/%d (micro-step %d): loss %.4f, lr %.3g, %.0f tokens/s, "
                 "%.0f tokens/update, %.1f%% padding, ETA %s", update, end,
                 read["micro_step"], loss, read["learning_rate"], tokens_per_second,
                 window_tokens / window_updates, 100 * padding, format_duration(remaining))
    with self.train_writer.as_default(step=update):  # a no-op writer off the chief
      tf.summary.scalar("loss", loss)
      tf.summary.scalar("learning_rate", read["learning_rate"])
      tf.summary.scalar("grad_norm", read["grad_norm"])
      tf.summary.scalar("tokens_per_second", tokens_per_second)
      tf.summary.scalar("tokens_per_update", window_tokens / window_updates)
      tf.summary.scalar("padding_fraction", padding)


class _Clock:
  """This process's clocks: the time budget (the run's training time, `spent_before` by
  its earlier processes and recorded in its checkpoints), timed saves, and the training time
  that tokens/s is measured over (saves and evaluations excluded)."""

  def __init__(self, options: RunOptions, spent_before: float = 0.0):
    self.start = self.window_start = self.last_save = time.time()
    self.spent_before = spent_before
    minutes = options.stopping.train_minutes
    self.deadline = self.start + minutes * 60 - spent_before if minutes > 0 else None
    self.save_secs = options.checkpointing.save_secs

  def spent(self) -> float:
    """The run's training time so far, this process's included."""
    return self.spent_before + time.time() - self.start

  def flags(self, signalled: bool) -> tuple[float, float, float]:
    """This process's (stop signal, time budget reached, timed save due). A timed save is
    asked for once; the clock restarts when it is asked (the save follows within an
    update), so workers that act on it an update later do not ask twice."""
    now = time.time()
    out_of_time = self.deadline is not None and now >= self.deadline
    timed_save = self.save_secs > 0 and now - self.last_save >= self.save_secs
    if timed_save:
      self.last_save = now
    return float(signalled), float(out_of_time), float(timed_save)

  def saved(self, since: float) -> None:
    self.last_save = time.time()
    self.paused(since)

  def paused(self, since: float) -> None:
    """Time since `since` was not training: tokens/s leaves it out."""
    self.window_start += time.time() - since


class _Agreement:
  """What every worker acts on. One process acts on its own flags (see _Clock.flags) at
  once. Several workers send theirs in the next update's cross-replica sum and all act on
  that sum, read after the update from each worker's own copy of it (no extra collective).
  A worker's flags are taken after it has done what the last update asked (a save, say), so
  that it does not ask again for what was just done."""

  def __init__(self, learner: Learner, multi_worker: bool, clock: _Clock, signalled):
    self.learner, self.multi_worker, self.clock = learner, multi_worker, clock
    self.signalled = signalled  # () -> whether this process got a stop signal
    self.outgoing = NO_FLAGS

  def after_update(self) -> Agreed:
    """The flags to act on after this update."""
    if not self.multi_worker:
      return Agreed(*(bool(flag) for flag in self.clock.flags(self.signalled())))
    return Agreed(*self.learner.read_agreed())

  def before_next_update(self) -> None:
    """Several workers: this process's flags, sent with the next update."""
    if self.multi_worker:
      self.outgoing = self.clock.flags(self.signalled())
