"""t2t-lite-trainer: trains a registered hparams set on a problem, or prints the run_steps."""

from __future__ import annotations

import os

from absl import flags

from t2t_lite.cli import common
from t2t_lite.core.errors import RunError, UsageError

flags.DEFINE_string("problem", "translate_ende_multi30k", "Registered problem.")
flags.DEFINE_string("model", None, "Registered model (default: the hparams' model, "
                    "transformer).")
flags.DEFINE_string("hparams_set", None, "Registered hparams set (default: the one recorded in "
                    "--output_dir when resuming, else transformer_multi30k_cpu).")
flags.DEFINE_string("hparams", "", "Overrides, e.g. 'batch_size=2048,clip_grad_norm=1.0'.")
flags.DEFINE_string("data_dir", None, "Directory written by t2t-lite-datagen.")
flags.DEFINE_string("output_dir", None, "Checkpoints, summaries and hparams.json.")
common.define_count("train_steps", 250000, "Updates (optimizer steps) to train; the trainer "
                    "runs train_steps x accumulate_steps micro-steps.", minimum=1)
flags.DEFINE_float("train_minutes", 0.0, "Stop after this much training wall time of the "
                   "run, counted over all its processes (0: no limit; a resumed run keeps the "
                   "budget it recorded unless given).", lower_bound=0.0)
common.define_count("eval_steps", 100, "Dev batches for the dev loss (0: the whole dev set).")
common.define_count("local_eval_frequency", 1000, "Evaluate every this many updates (0: never).")
common.define_count("eval_bleu_sentences", 500, "Dev sentences decoded at each evaluation for "
                    "the decoded metrics (BLEU, chrF, chrF++, TER; 0: none decoded).")
common.define_count("eval_beam_size", 1, "Beam size of the evaluation's decode (1: greedy).",
                    minimum=1)
flags.DEFINE_string("eval_metrics", "", "The dev figures of each evaluation, comma-separated: "
                    "dev_loss, dev_perplexity, dev_bleu, dev_chrf, dev_chrfpp (chrF++), dev_ter "
                    "(default: dev_loss,dev_perplexity,dev_bleu,dev_chrf,dev_ter; without the "
                    "decoded ones when --eval_bleu_sentences=0).")
flags.DEFINE_enum("eval_weights", "auto", ["auto", "ema", "raw"], "The weights evaluated (and "
                  "kept in output_dir/best): auto, the moving average where the run keeps one "
                  "(ema_decay > 0), else the raw weights; ema; raw.")
common.define_count("keep_best_checkpoints", 1, "Keep the K best evaluated checkpoints by "
                    "--eval_early_stopping_metric in output_dir/best (with best.json, their "
                    "figures), outside --keep_checkpoint_max's rotation; 0: none (best.json "
                    "still records the best value).")
common.define_count("save_checkpoints_steps", 1000, "Save a checkpoint every this many updates "
                    "(0: only when the run stops: end, time budget, Ctrl-C, SIGTERM); every "
                    "evaluation also saves its update first.")
flags.DEFINE_float("save_checkpoints_secs", 0.0, "Also save a checkpoint once this many "
                   "seconds have passed since the last save (0: by --save_checkpoints_steps "
                   "only).", lower_bound=0.0)
common.define_count("keep_checkpoint_max", 20, "Checkpoints kept (0: all).")
flags.DEFINE_float("keep_checkpoint_every_n_hours", 0.0, "Of the checkpoints that "
                   "--keep_checkpoint_max rotates away, keep one from every this many hours of "
                   "training (0: none), e.g. for averaging or recovery later.", lower_bound=0.0)
common.define_count("eval_early_stopping_steps", 0, "Stop when the "
                    "--eval_early_stopping_metric has not improved by more than "
                    "--eval_early_stopping_metric_delta for this many updates (0: never).")
flags.DEFINE_string("eval_early_stopping_metric", "", "The dev figure that ranks the "
                    "evaluations, for early stopping and the best checkpoints: one of "
                    "--eval_metrics (dev_loss, dev_perplexity, dev_ter: lower is better; "
                    "dev_bleu, dev_chrf, dev_chrfpp: higher; default: dev_loss with early "
                    "stopping, as tensor2tensor's loss; without it dev_bleu if measured, else "
                    "dev_loss).")
flags.DEFINE_float("eval_early_stopping_metric_delta", 0.1, "The least change of the metric "
                   "that counts as an improvement for early stopping.", lower_bound=0.0)
common.define_count("log_every", 100, "Log and write summaries every this many updates (0: "
                    "only for the last update).")
common.define_count("random_seed", 1, "Seed of initialization, data order and dropout.",
                    maximum=2 ** 31 - 1)
flags.DEFINE_enum("strategy", "auto", ["auto", "one_device", "mirrored", "multi_worker"],
                  "tf.distribute strategy; auto = mirrored over all GPUs when there are several.")
common.define_count("cpu_replicas", 1, "Split the CPU into this many logical devices "
                    "(with --strategy=mirrored: try data parallelism on a CPU).", minimum=1)
common.define_count("slurm_port_base", 8888, "Under Slurm (--strategy=multi_worker): tasks "
                    "of a node listen on this port and the next ones.", minimum=1,
                    maximum=65535)
flags.DEFINE_string("warm_start_from", None, "Fine-tuning: a new run starts from the model "
                    "weights of this run directory (its newest checkpoint) or checkpoint "
                    "prefix; Adam, counters and accumulators start afresh (update 0). "
                    "Ignored, with a warning, when --output_dir has checkpoints to resume.")
flags.DEFINE_bool("warm_start_optimizer", False, "With --warm_start_from: also carry Adam's "
                  "slots (moments), not its step.")
flags.DEFINE_enum("warm_start_vocab_rows", "pieces", ["pieces", "carried", "fresh"],
                  "With --warm_start_from onto another vocabulary: where the embedding and "
                  "softmax rows start. pieces: a piece's own row, else the mean of the rows of "
                  "its text's pieces in the source vocabulary; carried: a piece's own row, else "
                  "fresh; fresh: every row fresh (only the rest of the model is carried).")
flags.DEFINE_bool("registry_help", False, "List the registered hparams sets, problems, models.")
flags.DEFINE_bool("dry_run", False, "Resolve everything, print it, and exit without training.")
flags.DEFINE_bool("allow_hparams_change", False, "Resume an --output_dir with a different "
                  "hparams set or changed values.")
flags.DEFINE_bool("allow_stream_change", False, "Resume a run on another training stream "
                  "than it was reading: a checkpoint of an earlier t2t-lite (its data position "
                  "a tf.data iterator), or a run whose --xla_compile changed (which plans the "
                  "batches in buckets); training continues at its update on the new stream.")
flags.DEFINE_bool("deterministic", False, "Deterministic TensorFlow ops (slower).")
flags.DEFINE_bool("xla_compile", False, "Compile each micro-step's forward and backward pass "
                  "with XLA, once per batch shape; training batches are padded to their "
                  "length bucket's boundary, so there is one shape per bucket. For GPUs: on "
                  "CPUs it trains slower.")
FLAGS = flags.FLAGS


def _format_bytes(count: int) -> str:
  return f"{count / 2 ** 20:.1f} MiB"


def main() -> None:
  from t2t_lite.core import registry

  if FLAGS.registry_help:
    print(registry.help_string())
    return
  cluster = FLAGS.strategy == "multi_worker" and not FLAGS.dry_run
  try:
    resolved = _resolve()
  except Exception as err:
    reported = _join_and_report(err) if cluster else None  # the others would wait for it
    if reported is None:
      raise
    raise (UsageError if isinstance(err, UsageError) else RunError)(reported) from err
  if not cluster:
    _train(*resolved)
    return
  from t2t_lite.cluster import distribute
  with distribute.shared_failures():
    _train(*resolved)


def _join_and_report(err: Exception) -> str | None:
  """A worker that fails before joining its cluster joins it to say why, so that the others
  stop at once instead of waiting for it. The message reported, or None if it could not
  join."""
  try:
    common.import_tensorflow(before_devices=_resolve_cluster)
    from t2t_lite.cluster import distribute
    _, _, task = distribute.make_strategy("multi_worker", 1, FLAGS.slurm_port_base)
    return distribute.report_failure(task, err)
  except Exception:  # noqa: BLE001  (no cluster to tell: the error itself is what matters)
    return None


def _resolve():
  """Everything that needs no TensorFlow: flags, names, the run's record."""
  from t2t_lite.core import registry
  from t2t_lite.runs import rundir

  if not FLAGS.dry_run:
    common.require(FLAGS.output_dir, "output_dir", "runs/multi30k")
    common.check_writable_dir(FLAGS.output_dir, "output_dir")
  if FLAGS.model:
    registry.models.canonical(FLAGS.model)
  _check_early_stopping()
  _evaluation()  # the metrics' usage errors, before TensorFlow starts
  _check_read_flags()
  if FLAGS.keep_checkpoint_every_n_hours and not FLAGS.keep_checkpoint_max:
    raise UsageError("--keep_checkpoint_every_n_hours keeps checkpoints that "
                     "--keep_checkpoint_max rotates away, and --keep_checkpoint_max=0 keeps "
                     "them all; set --keep_checkpoint_max > 0, or drop it")
  if FLAGS.warm_start_optimizer and not FLAGS.warm_start_from:
    raise UsageError("--warm_start_optimizer is read only with --warm_start_from; set that "
                     "too, or drop it")
  if FLAGS["warm_start_vocab_rows"].present and not FLAGS.warm_start_from:
    raise UsageError("--warm_start_vocab_rows is read only with --warm_start_from onto "
                     "another vocabulary; set that too, or drop it")
  if FLAGS.warm_start_from and FLAGS.output_dir and os.path.realpath(
      FLAGS.warm_start_from).startswith(os.path.realpath(FLAGS.output_dir) + os.sep):
    raise UsageError(f"--warm_start_from={FLAGS.warm_start_from} lies inside --output_dir; "
                     "warm start reads another run")
  model_override = f"model={FLAGS.model}" if FLAGS.model else ""
  hparams, previous, hparams_set = rundir.resolve(
      FLAGS.hparams_set, ",".join(filter(None, [model_override, FLAGS.hparams])),
      FLAGS.output_dir, FLAGS.allow_hparams_change)
  from t2t_lite.training import steps
  steps.check(hparams, FLAGS.train_steps)
  problem = registry.problem(_from_run(previous, "problem", "problem"))
  if FLAGS.model and hparams.model != FLAGS.model:
    raise UsageError(f"--model={FLAGS.model} and --hparams model={hparams.model} disagree; "
                     "give the model once")
  registry.models.canonical(hparams.model)
  data_dir = FLAGS.data_dir or (previous or {}).get("data_dir")
  if not FLAGS.dry_run:
    common.require(data_dir, "data_dir", "data/multi30k_ende")
  seed = _from_run(previous, "random_seed", "random_seed")
  _check_stream_flags(previous)
  _check_bucket_hparams(hparams)
  snapshot = None
  if not FLAGS.dry_run:  # the data this run (and a run it starts from) was trained on
    snapshot = problem.snapshot(data_dir)  # everything of the data comes from this read
    snapshot.check()
    rundir.check_data(previous, snapshot, FLAGS.output_dir)
    rundir.check_training_data(previous, snapshot, FLAGS.output_dir, hparams.corpus_weights,
                               FLAGS.allow_hparams_change)
  return problem, hparams, rundir.RunStart(snapshot, previous), hparams_set, data_dir, seed


def _source_vocab_file(start) -> str:
  """The --warm_start_from run's vocabulary where it is another than this run's ("" when it
  is the same); --warm_start_vocab_rows is refused where there is nothing to map."""
  from t2t_lite.adapting import warm_start
  found = (warm_start.source_vocabulary(FLAGS.warm_start_from, start.snapshot)
           if FLAGS.warm_start_from and start.snapshot else "")
  if FLAGS.warm_start_from and start.snapshot and not found and FLAGS[
      "warm_start_vocab_rows"].present:
    raise UsageError(f"--warm_start_vocab_rows: --warm_start_from={FLAGS.warm_start_from} was "
                     "trained with this run's vocabulary (or records none), so no rows are "
                     "mapped; drop it")
  return found


def _train(problem, hparams, start, hparams_set, data_dir, seed) -> None:
  from t2t_lite.training import steps

  tf = common.import_tensorflow(before_devices=_resolve_cluster)
  from t2t_lite.cluster import distribute
  if FLAGS.dry_run:
    replicas = distribute.planned_replicas(FLAGS.strategy, FLAGS.cpu_replicas)
  else:
    strategy, is_chief, task = distribute.make_strategy(FLAGS.strategy, FLAGS.cpu_replicas,
                                                        FLAGS.slurm_port_base)
    replicas = strategy.num_replicas_in_sync
    if FLAGS.strategy == "multi_worker":
      distribute.agree(strategy, _settings(start.snapshot, hparams, seed))
  run_steps = steps.run_steps(hparams, replicas, FLAGS.train_steps)
  vocab_size = start.snapshot.vocab().size if start.snapshot else problem.vocab_size_in(data_dir)
  summary = _summary(problem, hparams, hparams_set, run_steps, vocab_size)
  if FLAGS.dry_run:
    print("\n".join(summary))
    print("hparams:")
    for name, value in sorted(hparams.values().items()):
      print(f"  {name} = {value}")
    return

  if FLAGS.deterministic:
    tf.config.experimental.enable_op_determinism()
  tf.keras.utils.set_random_seed(seed)
  from t2t_lite.training import loop
  os.makedirs(FLAGS.output_dir, exist_ok=True)
  trainer = loop.Trainer(hparams, problem, run_steps, _run_options(data_dir, seed, start),
                          strategy, is_chief, task, start=start)
  trainer.restore()  # a resume it refuses (another layout, say) writes nothing
  if is_chief:
    _record(trainer, start, hparams_set, data_dir, vocab_size, seed)
  print("\n".join(summary), flush=True)
  result = trainer.train()
  print(f"trained {result['updates']} updates ({result['micro_steps']} micro-steps) in "
        f"{result['train_seconds']:.0f}s: {result['stop_reason']}; checkpoint "
        f"{result['checkpoint']}", flush=True)
  if FLAGS.strategy == "multi_worker":
    distribute.leave_cluster(is_chief)


def _summary(problem, hparams, hparams_set: str, run_steps, vocab_size: int) -> list[str]:
  """What the run will do, printed before it trains (and alone with --dry_run)."""
  from t2t_lite.runs import rundir
  params = rundir.parameter_count(hparams, vocab_size)
  trained = rundir.parameter_count(hparams, vocab_size, trained_only=True)
  accumulators = trained * 4 if run_steps.accumulation.needs_accumulators else 0
  summary = [f"hparams set: {hparams_set}"
             + (f" with --hparams={FLAGS.hparams}" if FLAGS.hparams else ""),
             f"problem: {problem.name} (vocabulary {vocab_size})", *run_steps.lines(),
             f"parameters: {params:,} ({_format_bytes(params * 4)} float32)"
             + (f"; {trained:,} train (frozen_parts={hparams.frozen_parts})"
                if trained != params else ""),
             f"Adam slots: {_format_bytes(trained * 8)}; accumulators: "
             f"{_format_bytes(accumulators)}"
             + (" (none with accumulate steps 1)" if not accumulators else "")]
  if hparams.ema_decay > 0:
    summary.append(f"moving average of the weights: {_format_bytes(trained * 4)} (decay "
                   f"{hparams.ema_decay:g} per {hparams.ema_reference_tokens:g} target tokens)")
  if FLAGS.xla_compile:
    summary.append("XLA: forward and backward pass compiled once per batch shape (training "
                   "batches padded to their length bucket's boundary)")
  return summary


def _run_options(data_dir: str, seed: int, start):
  """The flags of the run, as the library's option groups."""
  from t2t_lite.training.options import Checkpointing, RunOptions, Stopping
  return RunOptions(
      output_dir=FLAGS.output_dir, data_dir=data_dir, seed=seed,
      checkpointing=Checkpointing(
          save_steps=FLAGS.save_checkpoints_steps, save_secs=FLAGS.save_checkpoints_secs,
          keep_max=FLAGS.keep_checkpoint_max,
          keep_every_n_hours=FLAGS.keep_checkpoint_every_n_hours),
      evaluation=_evaluation(),
      stopping=Stopping(
          train_minutes=_train_minutes(start.record),
          early_stopping_steps=FLAGS.eval_early_stopping_steps,
          early_stopping_metric=FLAGS.eval_early_stopping_metric,
          early_stopping_delta=FLAGS.eval_early_stopping_metric_delta),
      log_every=FLAGS.log_every, warm_start_from=FLAGS.warm_start_from or "",
      warm_start_optimizer=FLAGS.warm_start_optimizer,
      warm_start_vocab=_source_vocab_file(start),
      warm_start_vocab_rows=FLAGS.warm_start_vocab_rows,
      allow_hparams_change=FLAGS.allow_hparams_change,
      allow_stream_change=FLAGS.allow_stream_change, xla_compile=FLAGS.xla_compile)


def _evaluation():
  from t2t_lite.training.options import Evaluation
  from t2t_lite.inference.metrics import parse_metrics
  from t2t_lite.inference.metrics import judged_by
  sentences = FLAGS.eval_bleu_sentences if FLAGS.local_eval_frequency else 0
  metrics = parse_metrics(FLAGS.eval_metrics, sentences)
  if FLAGS.local_eval_frequency:
    judged_by(FLAGS.eval_early_stopping_metric, metrics, FLAGS.eval_early_stopping_steps > 0)
  return Evaluation(
      frequency=FLAGS.local_eval_frequency, steps=FLAGS.eval_steps,
      bleu_sentences=FLAGS.eval_bleu_sentences, beam_size=FLAGS.eval_beam_size,
      metrics=metrics,
      keep_best=FLAGS.keep_best_checkpoints, weights=FLAGS.eval_weights)


def _record(trainer, start, hparams_set: str, data_dir: str, vocab_size: int, seed: int):
  """The run's record (hparams.json), written by the chief once the resume is accepted."""
  from t2t_lite.runs import rundir
  previous = start.record
  meta = {"hparams_set": hparams_set, "problem": trainer.problem.name,
          "train_minutes": _train_minutes(previous), "xla_compile": FLAGS.xla_compile,
          "data_dir": os.path.abspath(data_dir), "vocab_size": vocab_size,
          "data": rundir.data_record(start.snapshot), "random_seed": seed,
          "hparams": trainer.hparams.values()}
  warm_started_from = trainer.warm_started_from or (previous or {}).get("warm_started_from")
  if warm_started_from:
    meta["warm_started_from"] = os.path.abspath(warm_started_from)
  mapped = trainer.warm_start_vocabulary or (previous or {}).get("warm_start_vocabulary")
  if mapped:
    meta["warm_start_vocabulary"] = mapped
  rundir.write_meta(FLAGS.output_dir, meta)


def _settings(snapshot, hparams, seed: int) -> dict[str, str]:
  """What every worker of a cluster must share (distribute.agree): the trainer's flags (the
  paths excepted: the data is compared by its manifest, and a node may mount it elsewhere;
  and --hparams, whose resolved values are compared, in any order given), the hparams and
  seed, the data's manifest and the program."""
  import t2t_lite
  from t2t_lite.data.text import file_sha256
  names = {flag.name for module in (__name__, common.__name__)
           for flag in FLAGS.flags_by_module_dict().get(module, [])}
  # (--warm_start_from: a path, resolved by the chief for all)
  names -= {"data_dir", "output_dir", "debug", "hparams", "warm_start_from"}
  settings = {f"--{name}": FLAGS[name].value for name in names}
  settings.update({f"hparams.{name}": value for name, value in hparams.values().items()})
  package = os.path.dirname(t2t_lite.__file__)
  sources = sorted(os.path.join(folder, name) for folder, _, files in os.walk(package)
                   for name in files if name.endswith(".py"))
  settings.update({"random seed": seed, "the data (its manifest)": snapshot.digest,
                   "the program": t2t_lite.__version__ + " " + ",".join(
                       file_sha256(path)[:12] for path in sources)})
  return settings


def _train_minutes(recorded: dict | None) -> float:
  from t2t_lite.runs import rundir
  return rundir.train_minutes(recorded, FLAGS.train_minutes if FLAGS["train_minutes"].present
                              else None)


def _check_stream_flags(recorded: dict | None) -> None:
  """--xla_compile plans the training batches in buckets (one shape each), without it they
  are cut by tokens: a run resumed with the other setting would read other batches.
  --allow_stream_change is read only on resuming."""
  if recorded is None and FLAGS.allow_stream_change:
    raise UsageError("--allow_stream_change is read only when resuming a run (it lets one "
                     "resume on other training batches); this --output_dir holds no run: "
                     "drop it")
  before = (recorded or {}).get("xla_compile")
  if before is None or before == FLAGS.xla_compile or FLAGS.allow_stream_change:
    return
  raise UsageError(f"{FLAGS.output_dir} was trained {'with' if before else 'without'} "
                   "--xla_compile, which plans its training batches "
                   f"{'in length buckets' if before else 'by tokens'}; resume it "
                   f"{'with' if before else 'without'} the flag, or pass "
                   "--allow_stream_change to go on with the other plan's batches")


BUCKET_HPARAMS = ("min_length_bucket", "length_bucket_step")


def _check_bucket_hparams(hparams) -> None:
  """tensor2tensor's length buckets shape the training batches only with --xla_compile
  (without it they are cut by tokens, t2t_lite.data.stream): their hparams given without
  it are refused, not ignored."""
  if FLAGS.xla_compile or not FLAGS.hparams:
    return
  given = [name for name in hparams.copy().parse(FLAGS.hparams) if name in BUCKET_HPARAMS]
  if given:
    raise UsageError(f"--hparams {given[0]}: the training batches are planned in length "
                     "buckets only with --xla_compile; without it they are cut by tokens "
                     "(batch_size tokens, padding counted) and the buckets shape only the "
                     f"dev batches; pass --xla_compile, or drop {given[0]}")


def _from_run(recorded: dict | None, flag: str, key: str):
  """A flag that a resumed run takes from its record unless given; given, it must agree."""
  value = (recorded or {}).get(key)
  if value is None:
    return FLAGS[flag].value
  if FLAGS[flag].present and FLAGS[flag].value != value:
    raise UsageError(f"{FLAGS.output_dir} was trained with --{flag}={value}, not "
                     f"{FLAGS[flag].value}; drop --{flag} to resume it, or use another "
                     "--output_dir")
  return value


def _check_read_flags() -> None:
  """Flags that mean something only beside another are refused without it."""
  if FLAGS["cpu_replicas"].present and FLAGS.strategy != "mirrored":
    raise UsageError("--cpu_replicas is read only with --strategy=mirrored; set that too, "
                     "or drop it")
  if not FLAGS.local_eval_frequency:
    for name in ("eval_steps", "eval_bleu_sentences", "eval_beam_size", "eval_metrics",
                 "eval_weights", "keep_best_checkpoints", "eval_early_stopping_metric"):
      if FLAGS[name].present:
        raise UsageError(f"--{name} is read only with evaluations (--local_eval_frequency "
                         "> 0); set that, or drop it")


def _check_early_stopping() -> None:
  """Early stopping needs the evaluations it watches; its settings mean nothing without it."""
  if not FLAGS.eval_early_stopping_steps:
    if FLAGS["eval_early_stopping_metric_delta"].present:
      raise UsageError("--eval_early_stopping_metric_delta is read only with "
                       "--eval_early_stopping_steps > 0; set that too, or drop it")
    return
  if not FLAGS.local_eval_frequency:
    raise UsageError("--eval_early_stopping_steps needs evaluations: set "
                     "--local_eval_frequency > 0")


def _resolve_cluster() -> None:
  """A Slurm task's GPUs must be chosen before TensorFlow lists the devices."""
  if FLAGS.strategy == "multi_worker" and not FLAGS.dry_run:
    from t2t_lite.cluster import distribute
    distribute.cluster_resolver(FLAGS.slurm_port_base)


def run() -> None:
  common.run(main, "t2t-lite-trainer")


if __name__ == "__main__":
  run()
