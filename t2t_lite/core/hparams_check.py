"""Which hparam values the code implements; anything else is refused, never ignored.

Called wherever a set of hparams is about to be used (the CLIs through rundir.resolve, the
model and the learner), without TensorFlow, so a bad value costs no start-up.
"""

from __future__ import annotations

import math
import re

from t2t_lite.core.errors import UsageError

CORPUS_WEIGHTS = "corpus_weights"
CORPUS_NAME = re.compile(r"[a-z0-9][a-z0-9_-]*\Z")  # a corpus's name (datagen --corpus)

# tensor2tensor's layer_preprocess_sequence / layer_postprocess_sequence pairs we build:
# "n" before and "da" after each sublayer is pre-norm (tensor2tensor's default, with a layer
# norm at the end of each stack); "none" before and "dan" after is the original paper's
# post-norm (x = norm(x + dropout(sublayer(x))), no norm at the end of the stacks).
EMA_REFERENCE_TOKENS = 25000  # basic_params' value
NORM_SEQUENCES = {("n", "da"): "pre_norm", ("none", "dan"): "post_norm"}
OPTIMIZERS = ("adam",)
COOLDOWN = 0.3  # learning_rate_cooldown of every set: read by the linear_cooldown factor only
SCHEDULE_FACTORS = ("constant", "linear_warmup", "rsqrt_decay", "rsqrt_hidden_size",
                    "linear_cooldown")


def norm_placement(hparams) -> str:
  """'pre_norm' or 'post_norm', or a usage error naming the supported pairs."""
  pair = (hparams.layer_preprocess_sequence.strip() or "none",
          hparams.layer_postprocess_sequence.strip())
  if pair not in NORM_SEQUENCES:
    supported = " or ".join(f"layer_preprocess_sequence={pre},layer_postprocess_sequence={post}"
                            f" ({kind.replace('_', '-')})"
                            for (pre, post), kind in NORM_SEQUENCES.items())
    raise UsageError(f"layer_preprocess_sequence={hparams.layer_preprocess_sequence!r} with "
                     f"layer_postprocess_sequence={hparams.layer_postprocess_sequence!r} is "
                     f"not implemented; supported: {supported}")
  return NORM_SEQUENCES[pair]


def has_cooldown(hparams) -> bool:
  """Whether the schedule ends with a cooldown whose last update must be fixed."""
  return "linear_cooldown" in (f.strip() for f in hparams.learning_rate_schedule.split("*"))


def has_dropout_ramp(hparams) -> bool:
  """Whether the residual dropout rises during training (see optimize.residual_dropout)."""
  return hparams.dropout_ramp_end > 0


def check_dropout_ramp(hparams) -> None:
  if not has_dropout_ramp(hparams):
    for name in ("dropout_ramp_start", "dropout_ramp_initial"):
      if getattr(hparams, name) != 0:
        raise UsageError(f"{name}={getattr(hparams, name)} is read only by a dropout ramp, "
                         f"which dropout_ramp_end={hparams.dropout_ramp_end} turns off; set "
                         "dropout_ramp_end to the update where the ramp reaches "
                         "layer_prepostprocess_dropout, or drop it")
    return
  if not 0 <= hparams.dropout_ramp_start < hparams.dropout_ramp_end:
    raise UsageError(f"dropout_ramp_start={hparams.dropout_ramp_start}: must be at least 0 and "
                     f"below dropout_ramp_end={hparams.dropout_ramp_end} (updates)")
  _fraction(hparams, "dropout_ramp_initial")


def check_ema(hparams) -> None:
  """The moving average's hparams (t2t_lite.runs.ema)."""
  if not 0.0 <= hparams.ema_decay < 1.0:
    raise UsageError(f"ema_decay={hparams.ema_decay}: must be in [0, 1) (0: no moving "
                     "average; the decay per ema_reference_tokens target tokens)")
  if hparams.ema_reference_tokens <= 0:
    raise UsageError(f"ema_reference_tokens={hparams.ema_reference_tokens}: must be above 0")
  if hparams.ema_decay == 0 and hparams.ema_reference_tokens != EMA_REFERENCE_TOKENS:
    raise UsageError(f"ema_reference_tokens={hparams.ema_reference_tokens} is read only by a "
                     "moving average of the weights, which ema_decay=0 turns off; set "
                     "ema_decay (e.g. 0.999), or drop ema_reference_tokens")


FROZEN_HELP = ("embeddings, encoder, decoder, or layers of a stack as encoder.I or "
               "encoder.I-J (0-based, inclusive; decoder.I-J likewise), separated by ';'")


def frozen_parts(hparams) -> dict:
  """What `frozen_parts` names: {"embeddings": bool, "encoder": layer indices,
  "decoder": layer indices, "encoder_norm": bool, "decoder_norm": bool} (a whole stack
  includes its final norm); a usage error for an unknown part or layer, or for freezing
  everything."""
  layers = {"encoder": hparams.num_encoder_layers, "decoder": hparams.num_decoder_layers}
  parts = {"embeddings": False, "encoder": set(), "decoder": set(), "encoder_norm": False,
           "decoder_norm": False}
  for item in (part.strip() for part in hparams.frozen_parts.split(";")):
    if not item:
      continue
    if item == "embeddings":
      parts["embeddings"] = True
      continue
    stack, _, span = item.partition(".")
    if stack not in layers:
      raise UsageError(f"frozen_parts: unknown part {item!r}; known: {FROZEN_HELP}")
    if not span:
      parts[stack] |= set(range(layers[stack]))
      parts[f"{stack}_norm"] = True
      continue
    first, _, last = span.partition("-")
    if not (first.isdigit() and (not last or last.isdigit())):
      raise UsageError(f"frozen_parts: {item!r} is not {stack}.I or {stack}.I-J (0-based "
                       "layers)")
    first, last = int(first), int(last or first)
    if not first <= last < layers[stack]:
      raise UsageError(f"frozen_parts: {item!r} names layers outside the {layers[stack]} of "
                       f"the {stack} (0-{layers[stack] - 1})")
    parts[stack] |= set(range(first, last + 1))
  if (parts["embeddings"] and parts["encoder_norm"] and parts["decoder_norm"]
      and all(len(parts[s]) == n for s, n in layers.items())):
    raise UsageError(f"frozen_parts={hparams.frozen_parts!r} freezes the whole model; "
                     "nothing would train")
  return parts


def check_schedule(hparams) -> None:
  for factor in hparams.learning_rate_schedule.split("*"):
    if factor.strip() not in SCHEDULE_FACTORS:
      raise UsageError(f"learning_rate_schedule has unknown factor '{factor.strip()}'; "
                       f"known factors: {', '.join(SCHEDULE_FACTORS)} (joined by '*')")


def check_batch_size(batch_size: int, max_length: int) -> None:
  if batch_size < max_length:
    raise UsageError(f"batch_size={batch_size} tokens cannot hold one sequence of "
                     f"max_length={max_length}; raise batch_size or lower max_length "
                     f"(--hparams=max_length={batch_size})")


def _at_least(hparams, minimum, *names) -> None:
  for name in names:
    if getattr(hparams, name) < minimum:
      raise UsageError(f"{name}={getattr(hparams, name)}: must be at least {minimum}")


def _fraction(hparams, *names) -> None:
  for name in names:
    value = getattr(hparams, name)
    if not 0.0 <= value < 1.0:
      raise UsageError(f"{name}={value}: must be in [0, 1)")


def check_recovery(hparams) -> None:
  """The divergence detector's and the recovery's hparams (training.recovery)."""
  _fraction(hparams, "divergence_spike_decay")
  if hparams.divergence_max_recoveries > 64:
    raise UsageError(f"divergence_max_recoveries={hparams.divergence_max_recoveries}: at most "
                     "64 (the rollbacks a checkpoint records)")
  if not 0.0 < hparams.recovery_lr_factor <= 1.0:
    raise UsageError(f"recovery_lr_factor={hparams.recovery_lr_factor}: must be in (0, 1] "
                     "(1: the learning rate is not lowered after a rollback)")


def check(hparams) -> None:
  """A usage error for the first value the code does not implement."""
  if hparams.optimizer.strip().lower() not in OPTIMIZERS:
    raise UsageError(f"optimizer={hparams.optimizer!r} is not implemented; supported: "
                     f"{', '.join(OPTIMIZERS)} (tensor2tensor's Adam, applied once per update)")
  norm_placement(hparams)
  check_schedule(hparams)
  _at_least(hparams, 1, "hidden_size", "filter_size", "num_heads", "num_encoder_layers",
            "num_decoder_layers", "max_length", "min_length_bucket",
            "optimizer_multistep_accumulate_steps", "max_consecutive_nonfinite",
            "float16_fallback_updates")
  _at_least(hparams, 0, "effective_batch_tokens", "learning_rate_warmup_steps",
            "clip_grad_norm", "learning_rate_constant", "subword_sampling_start",
            "subword_sampling_min_updates", "divergence_spike_margin",
            "divergence_max_recoveries", "recovery_lr_updates")
  _fraction(hparams, "layer_prepostprocess_dropout", "attention_dropout", "relu_dropout",
            "label_smoothing", "optimizer_adam_beta1", "optimizer_adam_beta2")
  if hparams.learning_rate_cooldown != COOLDOWN and not has_cooldown(hparams):
    raise UsageError(f"learning_rate_cooldown={hparams.learning_rate_cooldown} is read only by "
                     "the linear_cooldown factor, which learning_rate_schedule="
                     f"{hparams.learning_rate_schedule!r} lacks; append '*linear_cooldown' to "
                     "it, or drop learning_rate_cooldown")
  if not 0.0 < hparams.learning_rate_cooldown <= 1.0:
    raise UsageError(f"learning_rate_cooldown={hparams.learning_rate_cooldown}: must be in "
                     "(0, 1] (the fraction of the run's updates that the linear_cooldown "
                     "factor of learning_rate_schedule spans)")
  check_dropout_ramp(hparams)
  check_ema(hparams)
  check_recovery(hparams)
  frozen_parts(hparams)
  if hparams.corpus_weights.strip():
    parse_corpus_weights(hparams.corpus_weights)
  if hparams.hidden_size % hparams.num_heads:
    raise UsageError(f"hidden_size={hparams.hidden_size} is not a multiple of "
                     f"num_heads={hparams.num_heads}")
  check_batch_size(hparams.batch_size, hparams.max_length)
  if hparams.length_bucket_step <= 1.0:
    raise UsageError(f"length_bucket_step={hparams.length_bucket_step}: must be above 1.0 "
                     "(bucket boundaries grow by this factor)")
  if hparams.norm_epsilon <= 0.0 or hparams.optimizer_adam_epsilon <= 0.0:
    raise UsageError("norm_epsilon and optimizer_adam_epsilon must be positive")


def parse_corpus_weights(text: str) -> list[tuple[int, dict[str, float]]]:
  """The phases of the curriculum `corpus_weights` (data.curriculum): [(after update,
  {name: weight})], checked for form (not for the data's corpora: Curriculum.of does that)."""
  phases = []
  for part in text.split(";"):
    body, at, after = part.strip().partition("@")
    weights = {}
    for entry in body.split("/"):
      name, colon, value = entry.strip().partition(":")
      try:
        weight = float(value)
      except ValueError:
        weight = -1.0
      if (not colon or not CORPUS_NAME.match(name) or not 0 <= weight < math.inf
          or name in weights):
        raise UsageError(f"corpus_weights={text!r}: '{entry.strip()}' is not name:weight (a weight "
                         "of 0 or more, each corpus once a phase); write phases like "
                         "'general:1/water:3;water:1@2000', separated by ';'")
      weights[name] = weight
    if not any(weights.values()):
      raise UsageError(f"corpus_weights={text!r}: the phase '{part.strip()}' gives every corpus "
                       "weight 0; give one a positive weight")
    try:
      start = int(after) if at else 0 if not phases else -1
    except ValueError:
      start = -1
    if start < 0:
      raise UsageError(f"corpus_weights={text!r}: '{part.strip()}' needs '@U', the update after "
                       "which its weights hold (a whole number)")
    phases.append((start, weights))
  if phases[0][0] != 0:
    raise UsageError(f"corpus_weights={text!r}: the first phase must hold from the start ('@0', or "
                     "no '@')")
  for (after, _), (previous, _) in zip(phases[1:], phases):
    if after <= previous:
      raise UsageError(f"corpus_weights={text!r}: the updates must increase ({after} after "
                       f"{previous})")
  return phases
