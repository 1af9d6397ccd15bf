"""The training loop: data, micro-steps and updates, checkpoints, summaries, evaluation.

Checkpoints (`output_dir/ckpt-<micro_step>`) hold the model, Adam's slots and step, the
accumulators and token counter, the micro-step counter and the training data iterators, so a
run stopped anywhere, mid-accumulation included, resumes to the same parameters as a run
never stopped. Checkpoints are written every `save_checkpoints_steps` updates and at exit
(end, time budget, Ctrl-C or SIGTERM).
"""

from __future__ import annotations

import json
import os
import signal
import time
from dataclasses import dataclass

import tensorflow as tf
from absl import logging

from t2t_lite import data as data_lib
from t2t_lite.errors import RunError, UsageError
from t2t_lite.files import write_atomic
from t2t_lite.learner import Learner
from t2t_lite.steps import BatchPlan

# Fault injection for the reliability tests: "micro:K" (SIGKILL after micro-step K of this
# process) or "save:K" (SIGKILL inside this process's K-th checkpoint save).
_FAULT = os.environ.get("T2T_LITE_FAULT", "")


@dataclass
class RunOptions:
  output_dir: str
  data_dir: str
  seed: int = 1
  keep_checkpoint_max: int = 20
  save_checkpoints_steps: int = 1000    # updates
  local_eval_frequency: int = 1000      # updates; 0 = no evaluation during training
  eval_steps: int = 100                 # dev batches for the dev loss; 0 = the whole dev set
  log_every: int = 100                  # updates
  train_minutes: float = 0.0            # wall-clock budget; 0 = none
  eval_bleu_sentences: int = 500        # dev sentences decoded for BLEU; 0 = no BLEU
  eval_beam_size: int = 1
  nan_micro_steps: tuple = ()           # fault injection (tests)
  stop_after_micro_steps: int = 0       # stop (and save) after this micro-step (tests)


def format_duration(seconds: float) -> str:
  seconds = int(max(seconds, 0))
  hours, rest = divmod(seconds, 3600)
  return f"{hours}h{rest // 60:02d}m" if hours else f"{rest // 60}m{rest % 60:02d}s"


class Trainer:
  """Trains one problem's model in `output_dir`, resuming from it when it holds checkpoints."""

  def __init__(self, hparams, problem, plan: BatchPlan, options: RunOptions,
               strategy: tf.distribute.Strategy | None = None, is_chief: bool = True,
               worker_name: str = "worker"):
    self.hparams, self.problem, self.plan, self.options = hparams, problem, plan, options
    self.strategy = strategy or tf.distribute.get_strategy()
    self.is_chief = is_chief
    self.vocab = problem.get_vocab(options.data_dir)
    self.learner = Learner(hparams, self.vocab.size, plan.accumulate_steps, options.seed,
                           self.strategy, options.nan_micro_steps)
    self._train_files = problem.data_files(options.data_dir, "train")
    self.dev_files = problem.data_files(options.data_dir, "dev")
    self.iterators = self._make_iterators(self._train_files)
    self.checkpoint = tf.train.Checkpoint(**self.iterators, **self.learner.trackables())
    # Every worker takes part in a save (reading the accumulators is a collective). The
    # chief writes output_dir; the others keep their own (their data iterators differ) in
    # output_dir/workers/<task>, and each resumes from its own directory.
    directory = (options.output_dir if is_chief
                 else os.path.join(options.output_dir, "workers", worker_name))
    self.manager = tf.train.CheckpointManager(self.checkpoint, directory,
                                              max_to_keep=options.keep_checkpoint_max)
    self._multi_worker = isinstance(self.strategy, tf.distribute.MultiWorkerMirroredStrategy)
    self._last_saved = None
    self.best_bleu = self._read_best()
    self._stop_signal = None
    self._saves = 0
    self._bleu_inputs = None
    self._slots = self._padding = 0  # token slots and padding of this worker's batches
    self.train_writer = self.eval_writer = tf.summary.create_noop_writer()
    if is_chief:
      self.train_writer = tf.summary.create_file_writer(os.path.join(options.output_dir, "train"))
      if options.local_eval_frequency:
        self.eval_writer = tf.summary.create_file_writer(os.path.join(options.output_dir, "eval"))

  def _make_iterators(self, files) -> dict:
    """One training-data iterator per local replica, named by its global replica id.

    Replica r reads shard r of the examples with seed + r, whatever the process layout, so
    2 replicas in one process and 2 worker processes see the same batches.
    """
    ids = self.strategy.experimental_distribute_values_from_function(
        lambda context: context.replica_id_in_sync_group)
    self.replica_ids = [int(i) for i in self.strategy.experimental_local_results(ids)]
    replicas = self.strategy.num_replicas_in_sync
    return {f"iterator_{r}": iter(data_lib.train_dataset(
        files, self.hparams, self.options.seed + r, shard=(r, replicas)))
            for r in self.replica_ids}

  def next_batch(self):
    """The next micro-batch of every local replica, as the strategy's per-replica value."""
    batches = {r: next(self.iterators[f"iterator_{r}"]) for r in self.replica_ids}
    for batch in batches.values():  # host-side arrays: counting costs no device sync
      padding, slots = data_lib.padding_and_slots(batch)
      self._padding += padding
      self._slots += slots
    if len(batches) == 1 and self.strategy.num_replicas_in_sync == 1:
      return batches[self.replica_ids[0]]
    return self.strategy.experimental_distribute_values_from_function(
        lambda context: batches[context.replica_id_in_sync_group])

  # --- checkpoints -------------------------------------------------------------------
  def restore(self) -> bool:
    """Restores the newest readable checkpoint; falls back to older ones if it is damaged."""
    state = tf.train.get_checkpoint_state(self.manager.directory)
    candidates = list(reversed(state.all_model_checkpoint_paths)) if state else []
    for index, path in enumerate(candidates):
      try:
        self.checkpoint.restore(path).assert_existing_objects_matched()
      except AssertionError as err:  # readable, but written by another setup
        raise UsageError(
            f"checkpoint {path} does not match this run (replicas, accumulate steps or "
            f"precision differ: {str(err).splitlines()[0][:160]}); resume with the settings "
            "it was written with, or use a new --output_dir") from None
      except Exception as err:  # a damaged file surfaces as many error types  # noqa: BLE001
        reason = str(err).strip().splitlines()[0][:200]
        fallback = candidates[index + 1] if index + 1 < len(candidates) else None
        logging.warning("checkpoint %s is unreadable (%s); %s", path, reason,
                        f"falling back to {fallback}" if fallback else "no older one left")
        continue
      self.learner.forget_host_counters()
      self._last_saved = int(self.learner.micro_step.numpy())
      logging.info("resumed from %s: update %d, micro-step %d", path,
                   int(self.learner.update_step.numpy()), int(self.learner.micro_step.numpy()))
      return True
    if candidates:
      raise RunError(f"no readable checkpoint in {self.options.output_dir}: all of "
                     f"{len(candidates)} are damaged; move them away to start afresh")
    return False

  def save(self) -> str:
    micro_step = int(self.learner.micro_step.numpy())
    if micro_step == self._last_saved:
      return self.manager.latest_checkpoint
    if _FAULT == f"save:{self._saves + 1}":
      # Fault injection (tests): die after the files are written, before the checkpoint
      # state names them, the worst moment of a save.
      self.checkpoint.write(os.path.join(self.manager.directory, f"ckpt-{micro_step}"))
      os.kill(os.getpid(), signal.SIGKILL)
    self._saves += 1
    path = self.manager.save(checkpoint_number=micro_step)
    self._last_saved = micro_step
    logging.info("saved %s (update %d, micro-step %d)", path,
                 int(self.learner.update_step.numpy()), micro_step)
    return path

  # --- evaluation --------------------------------------------------------------------
  def dev_loss(self) -> float:
    dataset = data_lib.eval_dataset(self.dev_files, self.hparams)
    if self.options.eval_steps > 0:
      dataset = dataset.take(self.options.eval_steps)
    loss = tokens = 0.0
    for batch in dataset:
      batch_loss, batch_tokens = self.learner.eval_fn(batch)
      loss += float(batch_loss)
      tokens += float(batch_tokens)
    return loss / max(tokens, 1.0)

  def _read_best(self) -> float:
    path = os.path.join(self.options.output_dir, "best", "bleu.json")
    if os.path.isfile(path):
      with open(path) as f:
        return float(json.load(f)["bleu"])
    return -1.0

  def dev_bleu(self) -> float:
    from t2t_lite import decode, metrics
    if self._bleu_inputs is None:  # read once; the compiled search is reused too
      pairs = list(data_lib.text_examples(self.dev_files)
                   .take(self.options.eval_bleu_sentences).as_numpy_iterator())
      self._bleu_inputs = ([list(ids) for ids, _ in pairs],
                           [ref.decode("utf-8") for _, ref in pairs],
                           decode.Decoder(self.learner.model, self.hparams.max_length))
    sources, references, decoder = self._bleu_inputs
    hyps = decoder.translate_ids(sources, beam_size=self.options.eval_beam_size, alpha=0.6,
                                 batch_size=64)
    return metrics.bleu([self.vocab.decode(h) for h in hyps], references).score

  def evaluate(self, update: int) -> dict:
    if not self.is_chief:
      return {}
    start = time.time()
    results = {"dev_loss": self.dev_loss()}
    if self.options.eval_bleu_sentences > 0:
      results["dev_bleu"] = self.dev_bleu()
    with self.eval_writer.as_default(step=update):
      for name, value in results.items():
        tf.summary.scalar(name, value)
    if results.get("dev_bleu", -1.0) > self.best_bleu:
      self.best_bleu = results["dev_bleu"]
      self._save_best(update)
    logging.info("eval at update %d: %s (%.1fs)", update,
                 ", ".join(f"{k} {v:.4f}" for k, v in results.items()), time.time() - start)
    return results

  def _save_best(self, update: int) -> None:
    best_dir = os.path.join(self.options.output_dir, "best")
    os.makedirs(best_dir, exist_ok=True)
    manager = tf.train.CheckpointManager(tf.train.Checkpoint(model=self.learner.model),
                                         best_dir, max_to_keep=1)
    path = manager.save(checkpoint_number=update)
    write_atomic(os.path.join(best_dir, "bleu.json"),
                 json.dumps({"bleu": self.best_bleu, "update": update, "checkpoint": path}))

  # --- the loop ----------------------------------------------------------------------
  def _on_signal(self, signum, frame):
    if self._stop_signal is not None:  # a second Ctrl-C stops at once
      raise KeyboardInterrupt
    self._stop_signal = signum
    logging.warning("received signal %d: finishing this micro-step and saving", signum)

  def _agreed_stop(self, out_of_time: bool) -> bool:
    """Whether to stop after this update. Workers decide together (a worker that stopped
    alone would leave the others waiting in the next collective)."""
    local = out_of_time or self._stop_signal is not None
    if not self._multi_worker:
      return local
    flags = self.strategy.experimental_distribute_values_from_function(
        lambda context: tf.constant(1.0 if local else 0.0))
    return float(self.strategy.reduce(tf.distribute.ReduceOp.SUM, flags, axis=None)) > 0

  def train(self) -> dict:
    """Runs updates until --train_steps, the time budget, or a signal; returns a summary."""
    self.restore()
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

  def _loop(self) -> dict:
    plan, options, learner = self.plan, self.options, self.learner
    update = int(learner.update_step.numpy())
    micro_step = int(learner.micro_step.numpy())
    start = window_start = time.time()
    deadline = start + options.train_minutes * 60 if options.train_minutes > 0 else None
    window_tokens = window_updates = consecutive_nonfinite = 0
    window_loss = 0.0
    stop_reason = "train_steps reached"
    reduction_logged = False
    while update < plan.train_steps:
      if self._stop_signal is not None and not self._multi_worker:
        stop_reason = f"signal {self._stop_signal}"
        break
      if options.stop_after_micro_steps and micro_step >= options.stop_after_micro_steps:
        stop_reason = "stop_after_micro_steps"
        break
      stats = learner.step(self.next_batch())
      micro_step += 1
      if _FAULT == f"micro:{micro_step}":  # fault injection (tests): die mid-accumulation
        os.kill(os.getpid(), signal.SIGKILL)
      if stats is None:
        continue
      if learner.reduction is not None and not reduction_logged:
        reduction_logged = True
        collectives = learner.reduction["collective_ops"]
        logging.info("cross-replica sum per update: %d tensors in %s", learner.reduction["tensors"],
                     f"{collectives} collective all-reduce op(s)" if collectives
                     else "a reduction to one device")
      if not bool(stats["finite"]) and bool(stats["overflow"]):
        logging.info("float16 overflow at update %d: update skipped, loss scale lowered to %g",
                     update + 1, float(learner.loss_scale.numpy()))
        continue
      if not bool(stats["finite"]):
        consecutive_nonfinite += 1
        logging.warning("non-finite loss or gradient at update %d (micro-step %d): update "
                        "skipped, accumulators reset (%d in a row, %d skipped in all)",
                        update + 1, micro_step, consecutive_nonfinite,
                        int(learner.skipped_updates.numpy()))
        if consecutive_nonfinite >= self.hparams.max_consecutive_nonfinite:
          raise RunError(
              f"{consecutive_nonfinite} updates in a row had a non-finite loss or gradient "
              f"(max_consecutive_nonfinite={self.hparams.max_consecutive_nonfinite}); stopped "
              f"at update {update}. The last good checkpoint is kept in {options.output_dir}; "
              "lower learning_rate_constant or set clip_grad_norm, then resume")
        continue
      consecutive_nonfinite = 0
      update += 1
      window_updates += 1
      window_tokens += float(stats["tokens"])
      window_loss += float(stats["loss"])
      now = time.time()
      last = update >= plan.train_steps or (deadline is not None and now >= deadline)
      if update % options.log_every == 0 or last:
        elapsed = now - window_start
        rate = window_updates / max(elapsed, 1e-9)
        remaining = (plan.train_steps - update) / max(rate, 1e-9)
        if deadline is not None:
          remaining = min(remaining, deadline - now)
        tokens_per_second = window_tokens / max(elapsed, 1e-9)
        loss = window_loss / window_updates
        padding = self._padding / max(self._slots, 1)
        self._padding = self._slots = 0
        logging.info("update %d/%d (micro-step %d): loss %.4f, lr %.3g, %.0f tokens/s, "
                     "%.0f tokens/update, %.1f%% padding, ETA %s", update, plan.train_steps,
                     micro_step, loss, float(stats["learning_rate"]), tokens_per_second,
                     window_tokens / window_updates, 100 * padding, format_duration(remaining))
        with self.train_writer.as_default(step=update):  # a no-op writer off the chief
          tf.summary.scalar("loss", loss)
          tf.summary.scalar("learning_rate", stats["learning_rate"])
          tf.summary.scalar("grad_norm", stats["grad_norm"])
          tf.summary.scalar("tokens_per_second", tokens_per_second)
          tf.summary.scalar("tokens_per_update", window_tokens / window_updates)
          tf.summary.scalar("padding_fraction", padding)
        window_start, window_tokens, window_updates, window_loss = now, 0, 0, 0.0
      pause = time.time()
      if update % options.save_checkpoints_steps == 0:
        self.save()
      if options.local_eval_frequency and update % options.local_eval_frequency == 0:
        self.evaluate(update)
      window_start += time.time() - pause  # tokens/s counts training time only
      out_of_time = deadline is not None and time.time() >= deadline
      if update < plan.train_steps and self._agreed_stop(out_of_time):
        stop_reason = (f"time budget of {options.train_minutes:g} minutes reached"
                       if out_of_time else f"signal {self._stop_signal}"
                       if self._stop_signal is not None else "another worker stopped")
        break
    path = self.save()
    self.train_writer.flush()
    self.eval_writer.flush()
    summary = {"updates": update, "micro_steps": micro_step, "stop_reason": stop_reason,
               "checkpoint": path, "train_seconds": round(time.time() - start, 1),
               "skipped_updates": int(learner.skipped_updates.numpy())}
    logging.info("stopped: %s; update %d, micro-step %d, %s", stop_reason, update, micro_step,
                 path)
    return summary
