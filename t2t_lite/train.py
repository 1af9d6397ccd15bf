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
it continues the same stream, and ends where a run never moved would. Checkpoints are written every `save_checkpoints_steps` updates and at exit
(end, time budget, Ctrl-C or SIGTERM). With more than one replica a stop waits for the end
of the update in progress, so that such a checkpoint holds no replica-local accumulators
(they would be restored as their sum spread over the replicas of the new process).
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass

import tensorflow as tf
from absl import logging

from t2t_lite import data as data_lib
from t2t_lite import faults as faults_lib
from t2t_lite import rundir
from t2t_lite.checkpoints import Checkpoints, warm_start
from t2t_lite.errors import RunError, UsageError
from t2t_lite.evaluation import Evaluator
from t2t_lite.learner import NO_FLAGS, Learner
from t2t_lite.steps import BatchPlan


@dataclass
class RunOptions:
  output_dir: str
  data_dir: str
  seed: int = 1
  keep_checkpoint_max: int = 20         # 0 = keep every checkpoint
  save_checkpoints_steps: int = 1000    # updates; 0 = only when the run stops
  save_checkpoints_secs: float = 0.0    # also once this long after the last save; 0 = not
  keep_checkpoint_every_n_hours: float = 0.0  # also keep one checkpoint per this many hours
  local_eval_frequency: int = 1000      # updates; 0 = no evaluation during training
  eval_steps: int = 100                 # dev batches for the dev loss; 0 = the whole dev set
  log_every: int = 100                  # updates; 0 = only the last update
  train_minutes: float = 0.0            # wall-clock budget; 0 = none
  eval_bleu_sentences: int = 500        # dev sentences decoded for BLEU; 0 = no BLEU
  eval_beam_size: int = 1
  early_stopping_steps: int = 0         # updates without improvement; 0 = no early stopping
  early_stopping_metric: str = "dev_loss"
  early_stopping_delta: float = 0.1
  warm_start_from: str = ""             # a run or checkpoint whose weights a new run starts from
  warm_start_optimizer: bool = False    # ... and its Adam slots
  allow_hparams_change: bool = False    # resume on a layout with other tokens per update
  xla_compile: bool = False             # XLA for the forward and backward pass; batches
                                        # padded to their bucket's boundary (a shape each)


def _layout(replicas: int, steps: int) -> str:
  return (f"{replicas} replica{'s' if replicas > 1 else ''} x {steps} micro-step"
          f"{'s' if steps > 1 else ''} per update")


def format_duration(seconds: float) -> str:
  seconds = int(max(seconds, 0))
  hours, rest = divmod(seconds, 3600)
  return f"{hours}h{rest // 60:02d}m" if hours else f"{rest // 60}m{rest % 60:02d}s"


def every(count: int, update: int) -> bool:
  """Whether `update` is one of every `count` updates (count 0: never)."""
  return count > 0 and update % count == 0


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
               worker_name: str = "worker"):
    self.hparams, self.problem, self.plan, self.options = hparams, problem, plan, options
    self.strategy = strategy or tf.distribute.get_strategy()
    self.is_chief = is_chief
    self.vocab = problem.get_vocab(options.data_dir)
    self.faults = faults_lib.from_environment()
    self.learner = Learner(hparams, self.vocab.size, plan.accumulation, options.seed,
                           self.strategy, self.faults, options.xla_compile)
    self._train_files = problem.data_files(options.data_dir, "train")
    self.dev_files = problem.data_files(options.data_dir, "dev")
    self.iterators = self._make_iterators(self._train_files)
    # Every worker takes part in a save (reading the accumulators is a collective). The
    # chief writes output_dir; the others keep their own (their data iterators differ) in
    # output_dir/workers/<task>, and each resumes from its own directory.
    directory = (options.output_dir if is_chief
                 else os.path.join(options.output_dir, "workers", worker_name))
    # The accumulators exist only for n > 1 and the counters of the update in progress are
    # new: between updates a checkpoint without them resumes as well (see _check_layout).
    self.checkpoints = Checkpoints(
        {**self.iterators, **self.learner.trackables()}, directory,
        options.keep_checkpoint_max, self.strategy, self.faults,
        options.keep_checkpoint_every_n_hours, before_restore=self._check_stream,
        optional=("accumulator", "in_update", "layout"))
    self._multi_worker = self.checkpoints.multi_worker
    self._stop_signal = None
    self._restored = False
    self._has_layout = True  # of the checkpoint restored (see _check_stream)
    self.train_writer = tf.summary.create_noop_writer()
    self.evaluator = None
    if is_chief:
      self.train_writer = None  # opened by train(), after the resume was accepted
      if options.local_eval_frequency:
        self.evaluator = Evaluator(
            self.learner, hparams, self.vocab, self.dev_files, options.output_dir,
            options.eval_steps, options.eval_bleu_sentences, options.eval_beam_size,
            problem.manifest(options.data_dir).get("settings", {}).get("target_lang", ""),
            options.early_stopping_steps, options.early_stopping_metric,
            options.early_stopping_delta)

  def _make_iterators(self, files) -> dict:
    """The one training stream, whatever the layout: each micro-step takes the next
    `replicas` micro-batches of it, batch r for replica r. Every process reads the whole
    stream and keeps its own replicas' batches, so 2 replicas in one process, 2 worker
    processes and 1 replica with twice the micro-steps train on the same batches.
    """
    ids = self.strategy.experimental_distribute_values_from_function(
        lambda context: context.replica_id_in_sync_group)
    self.replica_ids = [int(i) for i in self.strategy.experimental_local_results(ids)]
    # "iterator_0" and shard (0, 1): the name and pipeline of the one-replica runs before
    # the stream was shared, whose checkpoints therefore still resume exactly.
    return {"iterator_0": iter(data_lib.train_dataset(
        files, self.hparams, self.options.seed, shard=(0, 1),
        pad_to_bucket_boundary=self.options.xla_compile))}

  def next_batch(self):
    """The next micro-batch of every local replica, as the strategy's per-replica value."""
    stream = self.iterators["iterator_0"]
    taken = [next(stream) for _ in range(self.strategy.num_replicas_in_sync)]
    batches = {r: taken[r] for r in self.replica_ids}
    if len(batches) == 1 and self.strategy.num_replicas_in_sync == 1:
      return batches[self.replica_ids[0]]
    return self.strategy.experimental_distribute_values_from_function(
        lambda context: batches[context.replica_id_in_sync_group])

  # --- checkpoints -------------------------------------------------------------------
  def _check_stream(self, path: str, names: set[str]) -> None:
    """Checkpoints from before the shared stream kept one data iterator per replica."""
    self._has_layout = "layout" in names
    if "layout" not in names and ("iterator_1" in names or self.plan.replicas > 1):
      raise UsageError(
          f"checkpoint {path} was written by a t2t-lite whose replicas each read their own "
          "data shard, which this version cannot continue on more than one replica; resume "
          "it on one replica, or finish it with the version that wrote it")

  def _check_layout(self, path: str) -> None:
    """A checkpoint written on another layout (replicas x accumulate steps): resumable
    between updates, when the tokens per update stay the same; the micro-step counter is
    rescaled so that the run continues the same stream."""
    learner, plan = self.learner, self.plan
    if not self._has_layout:  # written before layouts were recorded: on one replica
      meta = rundir.read_meta(self.options.output_dir) or {}
      recorded = meta.get("hparams", {}).get("optimizer_multistep_accumulate_steps")
      derived = meta.get("hparams", {}).get("effective_batch_tokens")
      if recorded is not None and not derived and recorded != learner.accumulate_steps():
        raise UsageError(
            f"checkpoint {path} predates recorded layouts and was trained with "
            f"optimizer_multistep_accumulate_steps={recorded}; resume it with that value")
      return
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
      wanted = old_replicas * old_steps / plan.replicas
      hint = (f"optimizer_multistep_accumulate_steps={int(wanted)}" if wanted == int(wanted)
              else f"a replica count that divides {old_replicas * old_steps}")
      raise UsageError(
          f"resuming {path} on {layouts} changes the tokens per update from "
          f"{old_replicas * old_steps * plan.batch_size} to "
          f"{plan.replicas * steps * plan.batch_size}; use {hint} (or set "
          "effective_batch_tokens), or pass --allow_hparams_change to accept the change")
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
        source = warm_start(self.learner, self.options.warm_start_from,
                            self.options.warm_start_optimizer)
        logging.info("warm start from %s: model weights%s; update 0", source,
                     " and Adam's slots" if self.options.warm_start_optimizer else "")
      return False
    if self.options.warm_start_from:
      logging.warning("%s has checkpoints: resuming this run; --warm_start_from applies to "
                      "a new run only", self.checkpoints.directory)
    self.learner.forget_host_counters()
    self._check_layout(path)
    logging.info("resumed from %s: update %d, micro-step %d", path,
                 int(self.learner.update_step.numpy()), int(self.learner.micro_step.numpy()))
    return True

  def save(self) -> str:
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

  # --- stops -------------------------------------------------------------------------
  def request_stop(self, signum: int) -> None:
    if self._stop_signal is not None:  # a second Ctrl-C stops at once
      raise KeyboardInterrupt
    self._stop_signal = signum
    logging.warning("received signal %d: finishing this %s and saving", signum,
                    "micro-step" if self.plan.replicas == 1 else
                    f"update ({self.plan.replicas} replicas save only between updates)")

  def _on_signal(self, signum, frame):
    self.request_stop(signum)

  def _stop_now(self) -> str | None:
    """Why to stop before the next micro-step, or None. With several replicas a stop waits
    for the end of the update (replica-local accumulators are not checkpointed)."""
    if self.plan.replicas > 1 and self.learner.position():
      return None
    if self._stop_signal is not None and not self._multi_worker:
      return f"signal {self._stop_signal}"
    return None

  def _agree(self, stop: bool, save: bool) -> tuple[bool, bool]:
    """Whether to stop, and whether to save, after this update. Workers decide together (a
    worker that stopped or saved alone would leave the others waiting in a collective): one
    reduction carries both."""
    if not self._multi_worker:
      return stop, save
    flags = self.strategy.experimental_distribute_values_from_function(
        lambda context: tf.constant([float(stop), float(save)]))
    total = self.strategy.reduce(tf.distribute.ReduceOp.SUM, flags, axis=None).numpy()
    return bool(total[0] > 0), bool(total[1] > 0)

  # --- the loop ----------------------------------------------------------------------
  def train(self) -> dict:
    """Runs updates until --train_steps, the time budget, or a signal; returns a summary."""
    self.restore()
    if self.train_writer is None:
      self.train_writer = tf.summary.create_file_writer(
          os.path.join(self.options.output_dir, "train"))
    for line in self.plan.lines():
      logging.info("%s", line)
    previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    for s in previous:
      signal.signal(s, self._on_signal)
    try:
      return self._loop()
    finally:
      for s, handler in previous.items():
        signal.signal(s, handler)

  def _log_phase(self, update: int) -> None:
    """With an accumulation schedule: says when the next update starts another phase."""
    schedule, plan = self.learner.schedule, self.plan
    if schedule.varies and update < plan.train_steps:
      old, new = schedule.steps_for(update), schedule.steps_for(update + 1)
      if old != new:
        logging.info("accumulate steps %d -> %d from update %d (%d tokens per update)", old,
                     new, update + 1, plan.batch_size * new * plan.replicas)

  def _log_reduction(self) -> None:
    collectives = self.learner.reduction["collective_ops"]
    logging.info("cross-replica sum per update: %d tensors in %s",
                 self.learner.reduction["tensors"],
                 f"{collectives} collective all-reduce op(s)" if collectives
                 else "a reduction to one device")

  def _loop(self) -> dict:
    """The micro-steps read nothing from the device: the host counts the updates it tried
    (`tried`) and reads what happened (the device's window of statistics) only when an
    update is due for a log line, an evaluation, a save or the end. A skipped update found
    there lowers the count, and the due action waits for the update that really reaches it."""
    plan, options, learner = self.plan, self.options, self.learner
    update = int(learner.update_step.numpy())
    micro_step = int(learner.micro_step.numpy())
    learner.position()  # the host mirrors of the counters, read once here
    learner.read_window()  # a new window
    tried = update
    start = window_start = time.time()
    deadline = start + options.train_minutes * 60 if options.train_minutes > 0 else None
    guard = NonFiniteGuard(self.hparams.max_consecutive_nonfinite, options.output_dir)
    window = {"updates": 0, "tokens": 0.0, "loss": 0.0, "padding": 0.0, "slots": 0.0}
    stop_reason = "train_steps reached"
    # A resumed run that early stopping had stopped stays stopped (workers agree on it).
    early_stop = self.evaluator.early_stop(update) if self.evaluator is not None else None
    stopped = self._agree(update < plan.train_steps and early_stop is not None, False)[0]
    if stopped:
      stop_reason = early_stop or "another worker stopped"
    reduction_logged = False
    last_save = time.time()
    flags = NO_FLAGS  # this process's (stop, save), summed over all workers in the next update
    while not stopped:
      if tried >= plan.train_steps:  # the count is reached unless updates were skipped
        update = tried = self._read_window(guard, window)["updates_done"]
        if update >= plan.train_steps:
          break
      reason = self._stop_now()
      if reason:
        stop_reason = reason
        break
      stats = learner.step(self.next_batch(), flags)
      micro_step += 1
      self.faults.after_micro_step(micro_step, self.request_stop)
      if stats is None:  # mid-accumulation
        continue
      tried += 1
      if learner.reduction is not None and not reduction_logged:
        reduction_logged = True
        self._log_reduction()
      now = time.time()
      out_of_time = deadline is not None and now >= deadline
      local_stop = out_of_time or self._stop_signal is not None or early_stop is not None
      step_save = False
      if self._due(tried) or (local_stop and not self._multi_worker):
        previous = update
        read = self._read_window(guard, window)
        update = tried = read["updates_done"]
        if update > previous:  # applied updates since the last look
          self._log_phase(update)
          last = update >= plan.train_steps or out_of_time or local_stop
          if every(options.log_every, update) or last:
            self._log(update, micro_step, read, now - window_start, window, deadline)
            window_start = now
          pause = time.time()
          if self.evaluator is not None and every(options.local_eval_frequency, update):
            self.evaluator.evaluate(update)
            early_stop = self.evaluator.early_stop(update)
            local_stop = local_stop or early_stop is not None
          window_start += time.time() - pause  # tokens/s counts training time only
          step_save = every(options.save_checkpoints_steps, update)
      # The time budget, stop signals and timed saves are checked after every update,
      # applied or not. Several workers decide together: the flags ride in the next update's
      # cross-replica sum, and all act on the sum after that update.
      timed_save = (options.save_checkpoints_secs > 0 and
                    now - last_save >= options.save_checkpoints_secs)
      if self._multi_worker:
        stop, save = learner.read_agreed()
        save = save or step_save
        flags = (float(local_stop and update < plan.train_steps), float(timed_save))
      else:
        stop, save = local_stop and update < plan.train_steps, timed_save or step_save
      if save and not stop:
        self.save()
        last_save = time.time()
        window_start += last_save - now
      if stop:
        if self._multi_worker:  # what this worker missed of the other workers' window
          update = tried = self._read_window(guard, window)["updates_done"]
        stop_reason = (early_stop if early_stop is not None
                       else f"time budget of {options.train_minutes:g} minutes reached"
                       if out_of_time else f"signal {self._stop_signal}"
                       if self._stop_signal is not None else "another worker stopped")
        break
    if tried != update:
      update = self._read_window(guard, window)["updates_done"]
    path = self.save()
    self.train_writer.flush()
    if self.evaluator is not None:
      self.evaluator.flush()
    summary = {"updates": update, "micro_steps": micro_step, "stop_reason": stop_reason,
               "checkpoint": path, "train_seconds": round(time.time() - start, 1),
               "skipped_updates": int(learner.skipped_updates.numpy())}
    logging.info("stopped: %s; update %d, micro-step %d, %s", stop_reason, update, micro_step,
                 path)
    return summary

  def _due(self, tried: int) -> bool:
    """Whether update `tried` is due for a log line, an evaluation, a save or the end."""
    options = self.options
    return (tried >= self.plan.train_steps or every(options.log_every, tried) or
            every(options.save_checkpoints_steps, tried) or
            (self.evaluator is not None and every(options.local_eval_frequency, tried)))

  def _read_window(self, guard: NonFiniteGuard, window: dict) -> dict:
    """Reads the device's window of statistics: adds it to `window` (the updates since the
    last log line), reports skipped updates, and stops a diverging run."""
    read = self.learner.read_window()
    for name in window:
      window[name] += read[name]
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
    guard.check(read["consecutive"], update)
    return read

  def _log(self, update, micro_step, read, elapsed, window, deadline) -> None:
    """One progress line and the train summaries of the updates since the previous one
    (`window`, then emptied); `read`: the device's last window (learning rate, norm)."""
    plan = self.plan
    window_updates, window_tokens = max(window["updates"], 1), window["tokens"]
    rate = window_updates / max(elapsed, 1e-9)
    remaining = (plan.train_steps - update) / max(rate, 1e-9)
    if deadline is not None:
      remaining = min(remaining, deadline - time.time())
    tokens_per_second = window_tokens / max(elapsed, 1e-9)
    loss = window["loss"] / window_updates
    padding = window["padding"] / max(window["slots"], 1)
    for name in window:
      window[name] = 0
    stats = {"learning_rate": read["learning_rate"], "grad_norm": read["grad_norm"]}
    logging.info("update %d/%d (micro-step %d): loss %.4f, lr %.3g, %.0f tokens/s, "
                 "%.0f tokens/update, %.1f%% padding, ETA %s", update, plan.train_steps,
                 micro_step, loss, stats["learning_rate"], tokens_per_second,
                 window_tokens / window_updates, 100 * padding, format_duration(remaining))
    with self.train_writer.as_default(step=update):  # a no-op writer off the chief
      tf.summary.scalar("loss", loss)
      tf.summary.scalar("learning_rate", stats["learning_rate"])
      tf.summary.scalar("grad_norm", stats["grad_norm"])
      tf.summary.scalar("tokens_per_second", tokens_per_second)
      tf.summary.scalar("tokens_per_update", window_tokens / window_updates)
      tf.summary.scalar("padding_fraction", padding)
