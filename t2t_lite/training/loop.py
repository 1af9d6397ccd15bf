"""The training loop: micro-steps and updates, what follows each, and stops.

The loop's collaborators each sit in their own module: `learner` (the compiled micro-steps
and updates), `milestones` (the run's last update and its segmentation switch), `stream` (the
training batches), `checkpoints` (save, restore, multi-worker agreement), `layouts` (resuming
on another layout), `train_log` (progress lines and summaries), `clock` (the time budget and
what the workers agree on), `evaluation` (dev loss, perplexity, BLEU, the best model),
`recovery` (rolling back a diverging run) and `faults` (fault injection for the reliability
tests).

Checkpoints (`output_dir/ckpt-<micro-batches>`, counting the micro-batches of all replicas)
hold the model, Adam's slots and step, the accumulators and token counter, the micro-step
counters (the data position) and the run's training time, so a run stopped anywhere,
mid-accumulation included, resumes to the same parameters as a run never stopped.

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

import os
import time

import tensorflow as tf
from absl import logging

from t2t_lite.cluster import distribute
from t2t_lite.data import mixing
from t2t_lite.runs import rundir
from t2t_lite.core import faults as faults_lib
from t2t_lite.adapting import warm_start as warm_start_lib
from t2t_lite.training.checkpoints import Checkpoints
from t2t_lite.training.stops import Agreement, StopRequests
from t2t_lite.training.budget import TRAIN_SECONDS, Clock
from t2t_lite.training.decide import (EARLY_STOP, SIGNAL, TIME_BUDGET, TRAIN_STEPS, Agreed,
                                      Progress, decide)
from t2t_lite.training.options import RunOptions
from t2t_lite.core.errors import RunError, UsageError
from t2t_lite.training.evaluation import ChiefEvaluations, Evaluator
from t2t_lite.training.learner import Learner
from t2t_lite.training.resume import STREAM_SHIFT, Resume, recorded_batching, replan_stream
from t2t_lite.training.milestones import Milestones, training_splits
from t2t_lite.training.recovery import Recovery
from t2t_lite.training.steps import RunSteps
from t2t_lite.data.stream import Batching
from t2t_lite.training.train_log import TrainLog, format_duration


class Trainer:
  """Trains one problem's model in `output_dir`, resuming from it when it holds checkpoints."""

  def __init__(self, hparams, problem, run_steps: RunSteps, options: RunOptions,
               strategy: tf.distribute.Strategy | None = None, is_chief: bool = True,
               worker_name: str = "worker", after_update=None,
               start: rundir.RunStart | None = None, now=time.time):
    """`start`: the data snapshot and run record the run starts from (read here when not
    given). `after_update(tried)`, if given, is called after each update and what followed
    it (log, save, evaluation) with the number of updates tried: a hook for observers such
    as a count of device reads per update; it must not read the device itself. `now()`: the
    time the time budget and timed saves read (budget.Clock)."""
    self.hparams, self.run_steps, self.options = hparams, run_steps, options
    self.problem, self._now = problem, now
    self.strategy = strategy or tf.distribute.get_strategy()
    self.is_chief, self._after_update = is_chief, after_update
    self.start = start or rundir.RunStart.read(problem, options.data_dir, options.output_dir)
    self.vocab = self.start.snapshot.vocab()
    self.faults = faults_lib.from_environment()
    splits = training_splits(hparams, run_steps.sampling_start, options.stopping.train_minutes,
                             options.data_dir, self.start.snapshot.splits)
    self.learner = Learner(hparams, self.vocab.size, run_steps.accumulation, options.seed,
                           self.strategy, self.faults, options.xla_compile)
    self.milestones = Milestones(hparams, run_steps, options, self.learner, splits, self.strategy)
    self.stream = self._open_stream(splits)
    with self.strategy.scope():
      self.train_seconds = tf.Variable(0.0, name=TRAIN_SECONDS, dtype=tf.float64,
                                       trainable=False,
                                       aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)
      self.stream_shift = tf.Variable(0, name=STREAM_SHIFT, dtype=tf.int64, trainable=False,
                                      aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)
    self.checkpoints = self._make_checkpoints()
    self.resume = Resume(self.checkpoints, self.learner, run_steps, self.start.record,
                         tuple(rundir.shape_differences(self.start.record, hparams,
                                                        self.vocab.size)),
                         options.allow_stream_change, options.allow_hparams_change)
    self._multi_worker = self.checkpoints.multi_worker
    if self._multi_worker:
      distribute.check_shared_directory(self.strategy, is_chief, worker_name,
                                        options.output_dir)
    self.stops = StopRequests(run_steps.replicas == 1 and not self._multi_worker,
                              run_steps.replicas, self.faults)
    # whether restore() resumed; the checkpoint a new run started from; the loop's clock
    self._resumed = self.warm_started_from = self._clock = None
    self.warm_start_vocabulary = None  # what a warm start onto another vocabulary mapped
    self.log = TrainLog(self.learner, run_steps)
    self.recovery = Recovery(self.learner, hparams, run_steps.replicas, self.faults)
    self.evaluator = self._make_evaluator() if is_chief else None
    self.evaluations = ChiefEvaluations(self.evaluator, options.evaluation.frequency,
                                        self._from_chief, self.faults)

  @property
  def sampled_from(self) -> tf.Variable:
    return self.milestones.sampled_from

  def _open_stream(self, splits: list[str]):
    """This process's replicas' batches of the one training stream (stream.TrainingStream;
    on data of several corpora a MixedStream, and self.corpora its CorpusMix)."""
    self.replica_ids = distribute.local_replica_ids(self.strategy)
    stream, self.corpora = mixing.open_stream(
        self.start.snapshot, self.hparams, splits,
        Batching.of(self.hparams, self.options.xla_compile), self.options.seed,
        self.run_steps.replicas, self.replica_ids, self.strategy)
    return stream

  def _make_checkpoints(self) -> Checkpoints:
    """Every worker resumes from the chief's checkpoints in output_dir (a shared
    filesystem; the data position is the micro-step counter, the same on all) and takes
    part in every save (reading the accumulators is a collective), which only the chief
    keeps. The accumulators exist only for n > 1; what later versions added may be missing
    from an older checkpoint, and training.resume fills it in."""
    objects = {TRAIN_SECONDS: self.train_seconds, STREAM_SHIFT: self.stream_shift,
               **self.milestones.trackables(),
               **self.learner.trackables(),
               **(self.corpora.trackables() if self.corpora else {})}
    return Checkpoints(objects, self.options.output_dir, self.options.checkpointing,
                       self.strategy, self.faults, is_chief=self.is_chief)

  def _make_evaluator(self) -> Evaluator | None:
    options = self.options
    if not options.evaluation.frequency:
      return None
    snapshot = self.start.snapshot
    return Evaluator(self.learner, self.hparams, self.vocab, snapshot.files("dev"),
                     options.output_dir, options.evaluation, options.stopping,
                     snapshot.settings.get("target_lang", ""))

  def next_batch(self):
    """The next micro-batch of every local replica, as the strategy's per-replica value."""
    micro_step = self.learner.host.micro_step()
    if self.milestones.switches_at(micro_step):
      logging.info("update %d: training reads the sampled segmentations from here on",
                   int(self.learner.update_step.numpy()) + 1)  # (one device read, once)
    update = self.corpora.update(self.learner) if self.corpora else 1
    taken = self.stream.micro_batches(micro_step, self.milestones.switch, update)
    batches = dict(zip(self.replica_ids, taken))
    if len(batches) == 1 and self.strategy.num_replicas_in_sync == 1:
      return {name: tf.constant(value) for name, value in taken[0].items()}
    return self.strategy.experimental_distribute_values_from_function(
        lambda context: {name: tf.constant(value) for name, value in
                         batches[context.replica_id_in_sync_group].items()})

  # --- checkpoints -------------------------------------------------------------------
  def restore(self) -> bool:
    """Restores the newest usable checkpoint (see training.resume); a new run with
    `warm_start_from` starts from that run's weights instead. Called by `train`, or before
    it to check a resume before anything is written. Whether it resumed."""
    if self._resumed is None:
      self._resumed = self._restore()
    return self._resumed

  def _restore(self) -> bool:
    path, options = self.resume.restore(), self.options
    if path is None:
      if options.warm_start_from:
        self.warm_started_from, self.warm_start_vocabulary = warm_start_lib.begin(
            self.learner, self.vocab, self.hparams, options.warm_start_from,
            options.warm_start_vocab, options.warm_start_optimizer,
            options.warm_start_vocab_rows,
            cluster=(self.is_chief, self._from_chief) if self._multi_worker else None)
      self.recovery.started_new(self.checkpoints.checkpoint)
      return False
    if options.warm_start_from:
      logging.warning("%s has checkpoints: resuming this run; --warm_start_from applies to "
                      "a new run only", self.checkpoints.directory)
    recorded = recorded_batching(self.start.record, self.options.xla_compile)
    shift = replan_stream(self.stream, recorded, self.learner, self.run_steps.replicas,
                          int(self.stream_shift.numpy()), path)
    self.stream_shift.assign(shift)
    self.stream.read_from(shift)
    self.recovery.sync()
    return True

  def save(self) -> str:
    if self._clock is not None:
      self.train_seconds.assign(self._clock.spent())
    micro_step = int(self.learner.micro_step.numpy())
    number = micro_step * self.run_steps.replicas  # micro-batches of the stream
    already_saved = self.checkpoints.last_saved == number
    if not already_saved:
      self.learner.record_layout()
      if self.corpora:
        self.corpora.before_save(micro_step)
    path = self.checkpoints.save(number)
    self.recovery.saved()
    if not already_saved:
      logging.info("saved %s (update %d, micro-step %d)", path,
                   int(self.learner.update_step.numpy()), micro_step)
    return path

  # --- stops and what the workers share -------------------------------------------------
  def _from_chief(self, values: list[float]) -> list[float]:
    """The chief's `values`, on every worker (distribute.from_chief). One process: `values`."""
    if not self._multi_worker:
      return values
    return distribute.from_chief(self.strategy, values)

  # --- the loop ----------------------------------------------------------------------
  def train(self) -> dict:
    """Runs updates until --train_steps, the time budget, or a signal; returns a summary."""
    self.restore()
    if self.is_chief:
      self.log.write_summaries(os.path.join(self.options.output_dir, "train"))
    self.log.run_start(self.hparams, self.corpora)
    with self.stops.handling_signals():
      try:
        return self._loop()
      except (RunError, UsageError, OSError):
        raise  # a diverging run keeps its last good checkpoint; a full disk would fail again
      except Exception as err:
        failure = self._saved_failure(err)
        if failure is err:
          raise
        raise failure from err
      finally:
        self.recovery.saved()

  def _saved_failure(self, err: Exception) -> Exception:
    """A failure outside the compiled steps, saved first when the state is consistent: not
    from inside a compiled step (its state may be half written), not with several workers
    (a save is a collective they are not in), and with several replicas only between
    updates (their accumulators are replica-local)."""
    if self._multi_worker or self.learner.in_step or (
        self.corpora and self.corpora.stream.at != self.learner.host.micro_step()):
      return err  # (the last: batches taken for a micro-step that did not run)
    cause = str(err).strip().splitlines()[0][:200] if str(err).strip() else ""
    cause = f"{type(err).__name__}{': ' + cause if cause else ''}"
    if not (self.stops.mid_update or self.learner.host.position() == 0):
      return RunError(f"{cause}; not saved mid-update (the accumulators of the "
                      f"{self.run_steps.replicas} replicas are their own): fix the cause and rerun "
                      "to resume from the last checkpoint")
    return RunError(f"{cause}; the run was saved first ({self.save()}): fix the cause and "
                    "rerun to resume")

  def _loop(self) -> dict:
    """Runs updates and does what `decide` says follows each (see t2t_lite.training.decide). The
    micro-steps read nothing from the device: the host counts the updates it tried and
    reads the device's window of statistics only when `decide` asks for it."""
    clock = self._start_clock()
    if self.corpora:
      self.corpora.resume(self.learner.host.micro_step())
    update = self.log.read()  # a new window
    self.milestones.start(update)
    progress = Progress(tried=update, seen=update, applied=update)
    # A resumed run that early stopping had stopped, or whose budget is spent, stays stopped.
    early = self.evaluations.stopped_early(update)
    spent = clock.spent_up()
    early, spent = (flag > 0 for flag in self._from_chief([float(early), float(spent)]))
    if not early and self.evaluations.owed(update):
      early = self._evaluate(update, clock)
    actions = decide(progress, Agreed(out_of_time=spent, early_stop=early),
                     self.milestones.schedule())
    agreement = Agreement(self.learner, self._multi_worker, clock,
                          lambda: self.stops.signal is not None)
    while actions.stop is None:
      self.recovery.before_update(self.stream, self.milestones)
      completed = self.learner.run_update(self.next_batch, agreement.outgoing,
                                          self.stops.after_micro_step)
      self.log.reduction()
      progress = progress.next(completed)
      agreed = agreement.after_update()
      actions = decide(progress, agreed, self.milestones.schedule())
      if actions.read:
        progress = self._read(progress)
        actions = decide(progress, agreed, self.milestones.schedule())
      actions = self._follow(actions, progress, agreed, clock)
      agreement.before_next_update()
      if self._after_update is not None:
        self._after_update(progress.tried)
    return self._finish(actions.stop, progress, clock)

  def _read(self, progress: Progress) -> Progress:
    """The device's statistics read; a divergence in them rolled back (training.recovery)."""
    applied = self.log.read()
    read = self.log.last_read
    if read["diverged"]:
      return self._roll_back(read)
    self.recovery.float16_fallback(read)
    return Progress(progress.tried, progress.seen, applied=applied)

  def _roll_back(self, read: dict) -> Progress:
    """Back to the newest checkpoint (or the state a new run started from), the span that
    diverged to be skipped; the counts of the checkpoint, nothing of them new."""
    self.recovery.check(read, tf.train.latest_checkpoint(self.checkpoints.directory))
    path = self.resume.restore()
    if path is None:
      if self.recovery.initial is None:
        raise RunError(f"update {read['diverged_update']} diverged and "
                       f"{self.checkpoints.directory} has no checkpoint left to roll back to")
      self.recovery.initial.restore(self.checkpoints.objects)
      self.learner.host.forget()
    self.stream.read_from(int(self.stream_shift.numpy()))
    if self.corpora:
      self.corpora.resume(self.learner.host.micro_step())
    self.recovery.rolled_back(read, path, self.log.writer)
    update = int(self.learner.update_step.numpy())
    self.milestones.start(update)
    self.log.rolled_back()
    self.log.read()  # a new window, from the checkpoint's counters
    return Progress(update, update, update)

  def _start_clock(self) -> Clock:
    """The clock of this process, counting the run's training time on from its record."""
    stopping = self.options.stopping
    clock = self._clock = Clock(stopping.train_minutes, self.options.checkpointing.save_secs,
                                float(self.train_seconds.numpy()), self._now)
    if clock.spent_before and stopping.train_minutes:
      logging.info("time budget: %s of %g minutes trained by this run's earlier processes; "
                   "%s left", format_duration(clock.spent_before), stopping.train_minutes,
                   format_duration(clock.deadline - clock.start))
    return clock

  def _follow(self, actions, progress: Progress, agreed: Agreed, clock: Clock):
    """Logs, saves and evaluates as `actions` say; returns them, or, when the evaluation
    says to stop early, what `decide` answers to that."""
    update = progress.applied
    if update is not None and update > progress.seen:
      self.log.phase(update)
    if actions.log:
      self.log.line(update, self.milestones.schedule().train_steps, clock)
      if self.corpora:
        self.corpora.log(update, self.log.writer)
    if actions.project:
      self.milestones.check_budget(update, clock.now(), clock.deadline, self._chiefs_projection)
    if actions.save:
      pause = clock.now()
      self.save()
      clock.saved(pause)
    if actions.evaluate and self._evaluate(update, clock):
      return decide(Progress(update, update, update), agreed.with_early_stop(),
                    self.milestones.schedule())
    return actions

  def _chiefs_projection(self, projected: float) -> float:
    return self._from_chief([projected if self.is_chief else 0.0])[0]

  def _evaluate(self, update: int, clock: Clock) -> bool:
    """The evaluation of `update` (its time kept off tokens/s; the time budget counts it, as
    wall time); whether to stop early."""
    pause = clock.now()
    early = self.evaluations.evaluate(update)
    clock.paused(pause)
    return early

  def _finish(self, stop: str, progress: Progress, clock: Clock) -> dict:
    learner, stream = self.learner, self.stream
    update = progress.applied if progress.applied is not None else progress.seen
    path = self.save()
    self.log.writer.flush()
    self.evaluations.flush()
    reason = self._stop_reason(stop, update)
    micro_step = learner.host.micro_step()
    logging.info("stopped: %s; update %d, micro-step %d, %s", reason, update, micro_step, path)
    for line in self.recovery.summary_lines():
      logging.info("%s", line)
    logging.info("input: this process read %d examples in %d micro-batches of the training "
                 "stream (its %d of %d replicas)", stream.examples_read, stream.batches_read,
                 len(self.replica_ids), self.run_steps.replicas)
    stream.close()
    return {"updates": update, "micro_steps": micro_step, "stop_reason": reason,
            "checkpoint": path, "train_seconds": round(clock.now() - clock.start, 1),
            "skipped_updates": int(learner.skipped_updates.numpy()),
            "recoveries": self.recovery.history(),
            "examples_read": stream.examples_read, "batches_read": stream.batches_read}

  def _stop_reason(self, stop: str, update: int) -> str:
    if stop == EARLY_STOP:
      return self.evaluations.stop_reason(update)
    if stop == SIGNAL:
      return (f"signal {self.stops.signal}" if self.stops.signal is not None
              else "a stop signal on another worker")
    if stop == TIME_BUDGET:
      return f"time budget of {self.options.stopping.train_minutes:g} minutes reached"
    if stop == TRAIN_STEPS:
      return self.milestones.stop_reason() or stop
    return stop
