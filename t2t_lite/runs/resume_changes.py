"""What a change does on resume, for every hparam and every trainer flag: one table.

A resumed run takes its recorded hparams; `--hparams` that change one, or another
`--hparams_set`, are refused unless `--allow_hparams_change`. With it, each change is one of:
- **free**: it takes effect at the next update (a flag: for this invocation), nothing of the
  run's state depends on it;
- **re-planned**: state laid out for the old value is moved to the new one by a stated
  rule, and one log line says what moved;
- **refused**: the run cannot go on exactly or meaningfully; one line says why and what to
  do instead, with or without `--allow_hparams_change`.
`rundir.resolve` refuses the refused hparams from this table; the other rows name where the
change is made. docs/resuming.md holds the table as `render()` writes it, and a test keeps
both complete.
"""

from __future__ import annotations

from dataclasses import dataclass

FREE, REPLANNED, REFUSED = "free", "re-planned", "refused"
NEW_RUN = ("start a new --output_dir, with --warm_start_from this run to keep its weights "
           "where the shapes allow")


@dataclass(frozen=True)
class Change:
  kind: str   # FREE, REPLANNED or REFUSED
  what: str   # what happens; for a refused change why, then what to do instead


def _free(what: str) -> Change:
  return Change(FREE, what)


def _replanned(what: str) -> Change:
  return Change(REPLANNED, what)


def _refused(why: str, instead: str = NEW_RUN) -> Change:
  return Change(REFUSED, f"{why}; {instead}")


_SHAPE = "the checkpoint's variables have other shapes"
_SCHEDULE = _free("the learning rate is a function of the update: the next update takes the "
                  "new schedule's rate")
_DROPOUT = _free("the next update drops at the new rate (masks are drawn per micro-step)")
_RAMP = _free("the dropout rate is a function of the update: the next update takes the new "
              "ramp's rate")
_ADAM = _free("Adam's moments are kept; the next update applies the new constant (its bias "
              "correction counts all updates so far)")
_LAYOUT = _replanned("moves the run to the new accumulate steps between updates, the "
                     "micro-step counter rescaled to the same batch of the stream (one log "
                     "line); other tokens per update need --allow_hparams_change "
                     "(docs/batching.md)")
_STREAM = _replanned("the training stream is planned anew: the run goes on in the same epoch "
                     "at the same fraction of its batches (one log line says where); refused "
                     "mid-update and on a stream of several corpora or sampled "
                     "segmentations")

HPARAMS: dict[str, Change] = {
    "model": _refused("another model's variables are not this one's"),
    "hidden_size": _refused(_SHAPE),
    "filter_size": _refused(_SHAPE),
    "num_heads": _refused("the attention weights were trained split into the recorded number "
                          "of heads"),
    "num_encoder_layers": _refused(_SHAPE),
    "num_decoder_layers": _refused(_SHAPE),
    "shared_embedding_and_softmax_weights": _refused(_SHAPE),
    "layer_preprocess_sequence": _refused("the norms sit elsewhere in another placement"),
    "layer_postprocess_sequence": _refused("the norms sit elsewhere in another placement"),
    "norm_epsilon": _free("the next update normalizes with the new epsilon"),
    "mixed_precision": _free("the next micro-step computes in the new precision (weights and "
                             "optimizer state are float32 either way); float16's loss scale, "
                             "turned on, starts as in a new run"),
    "optimizer": _refused("another optimizer's state is not Adam's"),
    "optimizer_adam_beta1": _ADAM,
    "optimizer_adam_beta2": _ADAM,
    "optimizer_adam_epsilon": _ADAM,
    "learning_rate_schedule": _SCHEDULE,
    "learning_rate_constant": _SCHEDULE,
    "learning_rate_warmup_steps": _SCHEDULE,
    "learning_rate_cooldown": _free(
        "the cooldown's length is read at each update; its last update, once fixed, is kept "
        "in the checkpoint"),
    "clip_grad_norm": _free("the next update clips at the new norm"),
    "label_smoothing": _free("the next micro-step's loss smooths by the new amount"),
    "layer_prepostprocess_dropout": _DROPOUT,
    "attention_dropout": _DROPOUT,
    "relu_dropout": _DROPOUT,
    "dropout_ramp_initial": _RAMP,
    "dropout_ramp_start": _RAMP,
    "dropout_ramp_end": _RAMP,
    "ema_decay": _free("the next update averages with the new decay; turned on, the average "
                       "starts at the next update's weights; turned off, it is dropped"),
    "ema_reference_tokens": _free("the next update's decay counts tokens by the new reference"),
    "max_consecutive_nonfinite": _free("the next non-finite update is judged by the new limit"),
    "divergence_spike_margin": _free("the next update is judged by the new margin, against "
                                     "the running mean the checkpoint holds"),
    "divergence_spike_decay": _free("the running mean the checkpoint holds decays by the new "
                                    "rate from the next update"),
    "divergence_max_recoveries": _free("the rollbacks the checkpoint records count against "
                                       "the new limit"),
    "recovery_lr_factor": _free("updates still at a lowered learning rate use the new "
                                "factor"),
    "recovery_lr_updates": _free("the next rollback lowers the rate for the new number of "
                                 "updates; one in progress keeps its end"),
    "float16_fallback_updates": _free("the updates at the minimum scale the checkpoint counts "
                                      "are judged by the new limit"),
    "frozen_parts": _replanned(
        "Adam's moments and the moving average follow their variables by name: carried for "
        "those that train before and after, fresh for the newly trained, dropped for the "
        "newly frozen (one log line gives the three counts); refused mid-update"),
    "optimizer_multistep_accumulate_steps": _LAYOUT,
    "optimizer_multistep_accumulate_schedule": _LAYOUT,
    "effective_batch_tokens": _LAYOUT,
    "batch_size": _STREAM,
    "max_length": _STREAM,
    "min_length_bucket": _replanned("with --xla_compile, as batch_size; without it refused "
                                    "(the training batches are then cut by tokens)"),
    "length_bucket_step": _replanned("with --xla_compile, as batch_size; without it refused "
                                     "(the training batches are then cut by tokens)"),
    "corpus_weights": _replanned("the run goes on from the batches read so far, each corpus "
                                 "weighted anew from the next update (docs/training.md)"),
    "subword_sampling_start": _free("read until the switch to the sampled segmentations; "
                                    "once switched, the recorded switch holds"),
    "subword_sampling_min_updates": _free("read until the switch to the sampled "
                                          "segmentations; once switched, it holds"),
}

_EVAL = _free("the next evaluation reads it")
_SAVES = _free("the next save follows it")
_INVOCATION = _free("this invocation's")
_WARM = _free("read by a new run only: a resumed run resumes and says so in a warning")

FLAGS: dict[str, Change] = {
    "output_dir": _free("names the run; a moved run directory resumes where it is"),
    "data_dir": _free("another copy of the run's data; data with another vocabulary or "
                      "training split is refused, naming both"),
    "problem": _refused("recorded: the run's data and languages", "drop it, or give the "
                        "recorded problem"),
    "random_seed": _refused("recorded: the stream's order and the dropout masks follow it",
                            "drop it, or give the recorded seed"),
    "hparams_set": _free("with --allow_hparams_change the new set's values are taken, each "
                         "change as the hparams table says (without it, another set is "
                         "refused)"),
    "model": _refused("as the hparam model", "drop it"),
    "hparams": _free("each hparam as the hparams table says"),
    "allow_hparams_change": _INVOCATION,
    "allow_stream_change": _free("lets this invocation resume on another training stream "
                                 "(--xla_compile changed, or a tf.data iterator of an "
                                 "earlier version); refused on a new run"),
    "xla_compile": _replanned("plans the training batches in buckets (on) or by tokens (off); "
                              "with --allow_stream_change re-planned as batch_size is, "
                              "otherwise refused"),
    "strategy": _replanned("another replica count moves the run between updates "
                           "(docs/batching.md)"),
    "cpu_replicas": _replanned("as --strategy"),
    "slurm_port_base": _INVOCATION,
    "train_steps": _free("the run stops at the new update count (a fixed cooldown's end "
                         "holds)"),
    "train_minutes": _free("the budget counts the run's training time so far; not given, "
                           "the recorded budget holds"),
    "save_checkpoints_steps": _SAVES,
    "save_checkpoints_secs": _SAVES,
    "keep_checkpoint_max": _SAVES,
    "keep_checkpoint_every_n_hours": _SAVES,
    "log_every": _free("the next log line follows it"),
    "local_eval_frequency": _EVAL,
    "eval_steps": _EVAL,
    "eval_bleu_sentences": _EVAL,
    "eval_beam_size": _EVAL,
    "eval_metrics": _EVAL,
    "eval_early_stopping_steps": _EVAL,
    "eval_early_stopping_metric_delta": _EVAL,
    "keep_best_checkpoints": _free("the next evaluation keeps the new number of best "
                                   "checkpoints"),
    "eval_early_stopping_metric": _refused("the kept best checkpoints are ranked by the "
                                           "recorded metric", "resume with it, or move "
                                           "OUTPUT_DIR/best away"),
    "eval_weights": _refused("the kept best checkpoints rank the recorded weights' "
                             "evaluations", "resume with them, or move OUTPUT_DIR/best away"),
    "warm_start_from": _WARM,
    "warm_start_optimizer": _WARM,
    "warm_start_vocab_rows": _WARM,
    "deterministic": _INVOCATION,
    "dry_run": _INVOCATION,
    "registry_help": _INVOCATION,
    "debug": _INVOCATION,
}


def refusal(name: str, recorded, given) -> str | None:
  """The one-line reason a resume refuses hparam `name` changed from `recorded` to `given`
  (even with --allow_hparams_change), or None."""
  change = HPARAMS[name]
  if change.kind != REFUSED:
    return None
  return f"{name}={given!r} (recorded {recorded!r}): {change.what}"


def render() -> str:
  """The two tables, in Markdown."""
  lines = []
  for title, table, prefix in (("hparams", HPARAMS, ""), ("trainer flags", FLAGS, "--")):
    lines += [f"| {title} | on resume | what happens |", "|---|---|---|"]
    lines += [f"| `{prefix}{name}` | {change.kind} | {change.what} |"
              for name, change in sorted(table.items())]
    lines.append("")
  return "\n".join(lines)
