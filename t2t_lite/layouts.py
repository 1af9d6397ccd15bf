"""Resuming on another layout (replicas x accumulate steps): what may move, and how.

Between updates a run's state is layout-free: the training stream is shared by all replicas
(micro-step m of replica r reads batch m x replicas + r), so a checkpoint may resume on
another layout with the same tokens per update, its micro-step counter rescaled so that the
run continues the same stream. What cannot move is refused with what to do instead.
"""

from __future__ import annotations

from absl import logging

from t2t_lite.errors import UsageError


def describe(replicas: int, steps: int) -> str:
  return (f"{replicas} replica{'s' if replicas > 1 else ''} x {steps} micro-step"
          f"{'s' if steps > 1 else ''} per update")


def check(learner, plan, path: str, allow_change: bool) -> None:
  """Moves the restored checkpoint `path` to `plan`'s layout, or refuses it: mid-update, at
  other tokens per update (unless `allow_change`), or at a micro-batch the new replicas
  cannot continue evenly."""
  old_replicas, old_steps = (int(x) for x in learner.layout.numpy())
  steps = learner.accumulate_steps()
  if (old_replicas, old_steps) == (plan.replicas, steps):
    return
  update = int(learner.update_step.numpy())
  position = learner.position()
  layouts = f"from {describe(old_replicas, old_steps)} to {describe(plan.replicas, steps)}"
  if position:
    raise UsageError(
        f"checkpoint {path} was written mid-update ({position} of {old_steps} micro-steps "
        f"of update {update + 1}) and cannot resume on another layout ({layouts}); resume "
        f"it on its own layout with --train_steps={update + 1} to reach the end of that "
        "update, then move")
  if old_replicas * old_steps != plan.replicas * steps and not allow_change:
    raise UsageError(
        f"resuming {path} on {layouts} changes the tokens per update from "
        f"{old_replicas * old_steps * plan.batch_size} to "
        f"{plan.replicas * steps * plan.batch_size}; "
        f"{hint(learner.schedule, plan.replicas, old_replicas, old_steps, update)}")
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


def hint(schedule, replicas: int, old_replicas: int, old_steps: int, update: int) -> str:
  """How to keep the tokens per update on `replicas` replicas (`schedule`: the run's
  steps.AccumulateSchedule)."""
  if not schedule.explicit:
    wanted = old_replicas * old_steps / replicas
    choice = (f"optimizer_multistep_accumulate_steps={int(wanted)}" if wanted == int(wanted)
              else f"a replica count that divides {old_replicas * old_steps}")
    return (f"use {choice} (or set effective_batch_tokens), or pass --allow_hparams_change "
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
