"""The step arithmetic, in one place.

- micro-step: one forward/backward pass over one batch of `batch_size` tokens per replica;
- update: one Adam step, after `accumulate_steps` micro-steps (on every replica);
- the learning-rate schedule, Adam's step count and `--train_steps` all count updates;
- tokens per update = batch_size x accumulate_steps x replicas;
- micro-steps to run = train_steps x accumulate_steps.
"""

from __future__ import annotations

from dataclasses import dataclass

from t2t_lite.errors import UsageError


@dataclass(frozen=True)
class BatchPlan:
  batch_size: int          # tokens per replica and micro-step (rows x longest, with padding)
  accumulate_steps: int    # micro-steps per update
  replicas: int
  train_steps: int         # updates
  derived_from: str = ""   # how accumulate_steps was chosen, when not set directly

  @property
  def tokens_per_update(self) -> int:
    return self.batch_size * self.accumulate_steps * self.replicas

  @property
  def micro_steps(self) -> int:
    return self.train_steps * self.accumulate_steps

  def lines(self) -> list[str]:
    out = [
        f"batch_size per replica and micro-step: {self.batch_size} tokens",
        f"accumulate steps (micro-steps per update): {self.accumulate_steps}",
        f"replicas: {self.replicas}",
        f"tokens per update: {self.tokens_per_update} "
        f"(= {self.batch_size} x {self.accumulate_steps} x {self.replicas})",
        f"updates (--train_steps): {self.train_steps}",
        f"micro-steps: {self.micro_steps} (= {self.train_steps} x {self.accumulate_steps})",
    ]
    if self.derived_from:
      out.insert(2, f"  ({self.derived_from})")
    return out


def plan(hparams, replicas: int, train_steps: int) -> BatchPlan:
  """Resolves accumulate steps (possibly from effective_batch_tokens) and checks the figures."""
  if train_steps < 1:
    raise UsageError(f"--train_steps={train_steps}: must be at least 1 (it counts updates)")
  if hparams.batch_size < 1:
    raise UsageError(f"batch_size={hparams.batch_size}: must be at least 1 token")
  steps = hparams.optimizer_multistep_accumulate_steps
  derived = ""
  if hparams.effective_batch_tokens:
    per_micro_step = hparams.batch_size * replicas
    steps, remainder = divmod(hparams.effective_batch_tokens, per_micro_step)
    if remainder or steps < 1:
      lower = max(1, steps) * per_micro_step
      raise UsageError(
          f"effective_batch_tokens={hparams.effective_batch_tokens} is not a multiple of "
          f"batch_size x replicas = {hparams.batch_size} x {replicas} = {per_micro_step}; "
          f"use {lower} or {lower + per_micro_step}, or change batch_size")
    derived = (f"derived from effective_batch_tokens={hparams.effective_batch_tokens} / "
               f"({hparams.batch_size} x {replicas} replicas)")
  if steps < 1:
    raise UsageError(f"optimizer_multistep_accumulate_steps={steps}: must be at least 1")
  return BatchPlan(hparams.batch_size, steps, replicas, train_steps, derived)
