"""The step arithmetic, in one place.

- micro-step: one forward/backward pass over one batch of `batch_size` tokens per replica;
- update: one Adam step, after `accumulate_steps` micro-steps (on every replica);
- the learning-rate schedule, Adam's step count and `--train_steps` all count updates;
- tokens per update = batch_size x accumulate_steps x replicas;
- micro-steps to run = train_steps x accumulate_steps.

With `optimizer_multistep_accumulate_schedule` ("1@0;2@1000;8@4000") accumulate_steps varies
by update: n=1 for updates 1-1000, n=2 for updates 1001-4000, n=8 from update 4001. Every
micro-batch of an update uses the n of that update's phase.
"""

from __future__ import annotations

from dataclasses import dataclass

from t2t_lite.core.errors import UsageError


@dataclass(frozen=True)
class AccumulateSchedule:
  """Micro-steps per update, by phase: `phases` = ((n, after_update), ...), the first after
  update 0. `explicit`: set by the schedule hparam (accumulators then exist even while n=1)."""
  phases: tuple[tuple[int, int], ...]
  explicit: bool = False

  @classmethod
  def constant(cls, steps: int) -> "AccumulateSchedule":
    return cls(((steps, 0),))

  @classmethod
  def parse(cls, text: str) -> "AccumulateSchedule":
    name = "optimizer_multistep_accumulate_schedule"
    phases = []
    for part in text.split(";"):
      n, _, u = part.strip().partition("@")
      try:
        phases.append((int(n), int(u)))
      except ValueError:
        raise UsageError(f"{name}={text!r}: '{part.strip()}' is not n@update; write pairs "
                         "like '1@0;2@1000;8@4000' (n micro-steps per update after that "
                         "update), separated by ';'") from None
    if phases[0][1] != 0:
      raise UsageError(f"{name}={text!r}: the first phase must start at update 0 "
                       f"(e.g. '{phases[0][0]}@0;...')")
    for (n, u), (_, previous) in zip(phases, [(0, -1)] + phases[:-1]):
      if n < 1:
        raise UsageError(f"{name}={text!r}: n={n} must be at least 1")
      if u <= previous:
        raise UsageError(f"{name}={text!r}: the updates must increase ({u} after {previous})")
    return cls(tuple(phases), explicit=True)

  @property
  def varies(self) -> bool:
    return len(self.phases) > 1

  @property
  def needs_accumulators(self) -> bool:
    return self.explicit or max(n for n, _ in self.phases) > 1

  def steps_for(self, update: int) -> int:
    """n of update `update` (1-based)."""
    steps = self.phases[0][0]
    for n, after in self.phases:
      if update > after:
        steps = n
    return steps

  def spans(self, train_steps: int) -> list[tuple[int, int, int]]:
    """(n, first update, last update) of each phase reached within train_steps."""
    out = []
    for index, (n, after) in enumerate(self.phases):
      if after >= train_steps:
        break
      last = self.phases[index + 1][1] if index + 1 < len(self.phases) else train_steps
      out.append((n, after + 1, min(last, train_steps)))
    return out

  def micro_steps(self, train_steps: int) -> int:
    return sum(n * (last - first + 1) for n, first, last in self.spans(train_steps))

  def last_update_within(self, micro_steps: int, train_steps: int) -> int:
    """The inverse of micro_steps: the last update u <= train_steps whose updates 1..u take
    at most `micro_steps` micro-steps (0 if update 1 takes more)."""
    update = 0
    for n, first, last in self.spans(train_steps):
      fits = min(max(micro_steps, 0) // n, last - first + 1)
      update = first - 1 + fits
      if update < last:
        break
      micro_steps -= n * fits
    return update

  def __str__(self) -> str:
    return ";".join(f"{n}@{u}" for n, u in self.phases)


@dataclass(frozen=True)
class RunSteps:
  """A run's batch sizes and step counts: tokens per micro-batch, micro-steps per update,
  replicas and updates (and when it reads sampled segmentations); `lines()` says them."""
  batch_size: int          # tokens per replica and micro-step (rows x longest, with padding)
  accumulate_steps: int    # micro-steps per update
  replicas: int
  train_steps: int         # updates
  derived_from: str = ""   # how accumulate_steps was chosen, when not set directly
  schedule: AccumulateSchedule | None = None  # when accumulate_steps varies by update
  # Of data with sampled segmentations: the updates up to this one read the one best
  # (hparams.subword_sampling_start; 0: the sampled ones from the start).
  sampling_start: int = 0
  # ... and only in a run at least this long (hparams.subword_sampling_min_updates; 0: any).
  sampling_min_updates: int = 0

  @property
  def accumulation(self) -> AccumulateSchedule:
    return self.schedule or AccumulateSchedule.constant(self.accumulate_steps)

  @property
  def tokens_per_update(self) -> int:
    """Of the first update (see `lines` for each phase of a schedule)."""
    return self.batch_size * self.accumulate_steps * self.replicas

  @property
  def micro_steps(self) -> int:
    return self.accumulation.micro_steps(self.train_steps)

  def lines(self) -> list[str]:
    out = self._batch_lines()
    if self.sampling_start or self.sampling_min_updates:
      said = (f"the one best in updates 1-{self.sampling_start}, sampled ones after"
              if self.sampling_start else "sampled ones from the start")
      if self.sampling_min_updates:
        said += f" if the run is at least {self.sampling_min_updates} updates long"
      out.append(f"training segmentations: {said}")
    return out

  def _batch_lines(self) -> list[str]:
    if self.schedule is not None:
      out = [f"batch_size per replica and micro-step: {self.batch_size} tokens",
             f"replicas: {self.replicas}",
             f"accumulate schedule: {self.schedule}"]
      for n, first, last in self.schedule.spans(self.train_steps):
        out.append(f"  updates {first}-{last}: {n} micro-steps per update, "
                   f"{self.batch_size * n * self.replicas} tokens per update, "
                   f"{n * (last - first + 1)} micro-steps")
      out += [f"updates (--train_steps): {self.train_steps}",
              f"micro-steps: {self.micro_steps}"]
      return out
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


def check(hparams, train_steps: int) -> AccumulateSchedule | None:
  """What run_steps() checks that does not depend on the replica count (so a command can refuse
  it before starting TensorFlow); the accumulation schedule, if there is one."""
  if train_steps < 1:
    raise UsageError(f"--train_steps={train_steps}: must be at least 1 (it counts updates)")
  if hparams.batch_size < 1:
    raise UsageError(f"batch_size={hparams.batch_size}: must be at least 1 token")
  if not hparams.optimizer_multistep_accumulate_schedule.strip():
    return None
  schedule = AccumulateSchedule.parse(hparams.optimizer_multistep_accumulate_schedule)
  for other, value, default in (
      ("optimizer_multistep_accumulate_steps", hparams.optimizer_multistep_accumulate_steps, 1),
      ("effective_batch_tokens", hparams.effective_batch_tokens, 0)):
    if value != default:
      raise UsageError(f"optimizer_multistep_accumulate_schedule replaces {other}={value}; "
                       f"set {other}={default}, or drop the schedule")
  return schedule


def run_steps(hparams, replicas: int, train_steps: int) -> RunSteps:
  """Resolves accumulate steps (possibly from effective_batch_tokens) and checks the figures."""
  schedule = check(hparams, train_steps)
  if schedule is not None:
    return RunSteps(hparams.batch_size, schedule.steps_for(1), replicas, train_steps,
                     schedule=schedule, sampling_start=hparams.subword_sampling_start,
                     sampling_min_updates=hparams.subword_sampling_min_updates)
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
  return RunSteps(hparams.batch_size, steps, replicas, train_steps, derived,
                   sampling_start=hparams.subword_sampling_start,
                   sampling_min_updates=hparams.subword_sampling_min_updates)
