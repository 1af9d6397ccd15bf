"""The run directory's record of what it trains: `output_dir/hparams.json`.

Precedence, as tensor2tensor's: the registered set, then the values recorded in
`output_dir/hparams.json` (on resume), then `--hparams`. Resuming with another set or with
overrides that change a recorded value is refused unless the user says so.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

from t2t_lite.core import hparams_check, older_formats, registry
from t2t_lite.core.errors import UsageError
from t2t_lite.core.files import write_atomic
from t2t_lite.core.hparams import HParams

META_FILE = "hparams.json"
# Resuming may change these as long as the tokens per update stay the same (another replica
# count, say): the trainer checks that against the checkpoint (training.resume.move_layout).
LAYOUT_HPARAMS = ("optimizer_multistep_accumulate_steps",)
DEFAULT_SET = "transformer_multi30k_cpu"


def read_meta(output_dir: str) -> dict | None:
  path = os.path.join(output_dir, META_FILE)
  if not os.path.isfile(path):
    return None
  try:
    with open(path) as f:
      return older_formats.run_record(json.load(f))
  except ValueError as err:
    raise UsageError(f"{path} is not valid JSON ({err}); restore it or use a new "
                     "--output_dir") from None


def write_meta(output_dir: str, meta: dict) -> None:
  write_atomic(os.path.join(output_dir, META_FILE), json.dumps(meta, indent=2, sort_keys=True))


def resolve(hparams_set: str | None, overrides: str, output_dir: str | None,
            allow_change: bool = False) -> tuple[HParams, dict | None, str]:
  """(hparams, the previous run's record or None, the canonical set name).

  Without `hparams_set`, a resumed run keeps its recorded set and a new run takes
  DEFAULT_SET.
  """
  previous = read_meta(output_dir) if output_dir else None
  old_set = (previous or {}).get("hparams_set")
  name = registry.hparams_sets.canonical(hparams_set or old_set or DEFAULT_SET)
  hparams = registry.hparams(name)
  if previous is not None:
    if old_set != name and not allow_change:
      raise UsageError(f"{output_dir} was trained with --hparams_set={old_set}, not "
                       f"{hparams_set}; use another --output_dir, or pass "
                       "--allow_hparams_change to continue with the new set")
    if old_set == name:
      hparams.override_from_dict(previous.get("hparams", {}))
  recorded = hparams.values()
  applied = hparams.parse(overrides)
  if previous is not None and not allow_change:
    changed = {k: (recorded[k], v) for k, v in applied.items()
               if recorded[k] != v and k not in LAYOUT_HPARAMS}
    if changed:
      detail = ", ".join(f"{k}={new!r} (recorded {old!r})" for k, (old, new) in changed.items())
      raise UsageError(f"{output_dir} was trained with other values: {detail}; use another "
                       "--output_dir, or pass --allow_hparams_change to accept the change")
  if previous is not None:
    _refuse_changes(previous.get("hparams", {}), hparams.values(), output_dir)
  hparams_check.check(hparams)
  return hparams, previous, name


def _refuse_changes(recorded: dict, values: dict, output_dir: str) -> None:
  """A usage error for the first change that a resume refuses even when changes are allowed
  (runs.resume_changes)."""
  from t2t_lite.runs import resume_changes
  for name, value in values.items():
    if name in recorded and recorded[name] != value:
      why = resume_changes.refusal(name, recorded[name], value)
      if why:
        raise UsageError(f"resuming {output_dir} with {why}")


def model_from_run(output_dir: str):
  """(hparams, meta) recorded in a run directory, for decoding and averaging."""
  meta = read_meta(output_dir)
  if meta is None:
    raise UsageError(f"{output_dir} holds no {META_FILE}; pass the training --output_dir "
                     "(or give --hparams_set and --problem)")
  # A record from before an hparam existed lacks it: the basic value, which every set kept
  # then (those whose sets changed it are filled in by older_formats.run_record).
  from t2t_lite.configs.transformer import basic_params
  return HParams(**{**basic_params().values(), **meta["hparams"]}), meta


def parameter_count(hparams, vocab_size: int, trained_only: bool = False) -> int:
  """Trainable parameters of the Transformer (checked against the built model in tests);
  `trained_only`: without the parts frozen_parts names."""
  h, f = hparams.hidden_size, hparams.filter_size
  pre_norm = hparams_check.norm_placement(hparams) == "pre_norm"
  ffn = h * f + f + f * h + h
  encoder = 4 * h * h + ffn + 2 * 2 * h
  decoder = 8 * h * h + ffn + 3 * 2 * h
  embeddings = vocab_size * h * (1 if hparams.shared_embedding_and_softmax_weights else 3)
  frozen = (hparams_check.frozen_parts(hparams) if trained_only else
            {"embeddings": False, "encoder": set(), "decoder": set(), "encoder_norm": False,
             "decoder_norm": False})
  return ((0 if frozen["embeddings"] else embeddings)
          + (hparams.num_encoder_layers - len(frozen["encoder"])) * encoder
          + (hparams.num_decoder_layers - len(frozen["decoder"])) * decoder
          + sum(2 * h for stack in ("encoder", "decoder")
                if pre_norm and not frozen[f"{stack}_norm"]))


# The hparams that set the shapes of the model's variables.
SHAPE_HPARAMS = ("hidden_size", "filter_size", "num_heads", "num_encoder_layers",
                 "num_decoder_layers", "shared_embedding_and_softmax_weights")


def shape_differences(meta: dict | None, hparams, vocab_size: int) -> list[str]:
  """The settings that give this model other variable shapes than the run recorded in
  `meta`, as "name=ours (recorded theirs)"; empty when nothing was recorded or all agree."""
  if not meta:
    return []
  recorded = meta.get("hparams", {})
  found = [f"{name}={getattr(hparams, name)} (recorded {recorded[name]})"
           for name in SHAPE_HPARAMS
           if name in recorded and recorded[name] != getattr(hparams, name)]
  if meta.get("vocab_size") not in (None, vocab_size):
    found.append(f"vocabulary size {vocab_size} (recorded {meta['vocab_size']})")
  return found


# --- the data a run trained on ---------------------------------------------------------------
@dataclass(frozen=True)
class RunStart:
  """What a training run starts from, each read once: its data (a problems.snapshot
  DataSnapshot) and its record (None for a new run)."""
  snapshot: object
  record: dict | None

  @classmethod
  def read(cls, problem, data_dir: str, output_dir: str) -> "RunStart":
    return cls(problem.snapshot(data_dir), read_meta(output_dir))


def data_record(snapshot) -> dict:
  """What a run trains on: the problem, its languages, the vocabulary file's sha256 and the
  training split's subword sampling (`snapshot`: a problems.snapshot.DataSnapshot)."""
  settings = snapshot.settings
  record = {"problem": snapshot.problem.name, "source_lang": settings.get("source_lang", ""),
            "target_lang": settings.get("target_lang", ""),
            "vocab_sha256": snapshot.vocab_sha256(),
            "subword_sampling": settings.get("subword_sampling")}
  if snapshot.corpora:  # (their weights in training: the hparam corpus_weights, else these)
    record["corpora"] = [{"name": c["name"], "weight": c["weight"],
                          **({"back_translated": True} if c.get("back_translated") else {})}
                         for c in snapshot.corpora]
  return record


def check_training_data(meta: dict | None, snapshot, what: str, corpus_weights: str = "",
                        allow_change: bool = False) -> None:
  """Refuses to continue a run on training records other than its own: with the same
  vocabulary, other subword sampling makes other records, and the resumed stream would not
  be the one the run was reading. (Runs recorded before sampling trained on one
  segmentation.)"""
  recorded = (meta or {}).get("data")
  if not recorded:
    return
  names = [c["name"] for c in recorded.get("corpora") or []]
  now_names = [c["name"] for c in snapshot.corpora]
  if names != now_names:
    said = lambda found: f"the corpora {', '.join(found)}" if found else "one corpus"  # noqa
    raise UsageError(
        f"{what} was trained on {said(names)}, but {snapshot.data_dir} holds "
        f"{said(now_names)}; resume it on the data it was trained on, or start a new run "
        "(--warm_start_from may start it from this one)")
  weights = lambda corpora: "/".join(f"{c['name']}:{c['weight']:g}" for c in corpora)  # noqa
  if (names and weights(recorded["corpora"]) != weights(snapshot.corpora)
      and not corpus_weights.strip() and not allow_change):
    raise UsageError(
        f"{what} was trained with the corpus weights datagen recorded then, "
        f"{weights(recorded['corpora'])}, but {snapshot.data_dir} now records "
        f"{weights(snapshot.corpora)}; pass --hparams=corpus_weights="
        f"{weights(recorded['corpora'])} --allow_hparams_change to go on with the run's, or "
        "--allow_hparams_change alone to take the new ones")
  before = recorded.get("subword_sampling")
  now = snapshot.settings["subword_sampling"]
  if before != now:
    raise UsageError(
        f"{what} was trained on {_segmentations(before)} of each training pair, but "
        f"{snapshot.data_dir} holds {_segmentations(now)}; resume it on the data it was "
        "trained on (t2t-lite-datagen with its --subword_sampling_copies/"
        "--subword_sampling_alpha), or start a new run")


def _segmentations(sampling: dict | None) -> str:
  if not sampling:
    return "one segmentation"
  return f"{sampling['copies']} sampled segmentations at alpha {sampling['alpha']:g}"


def data_record_of(meta: dict | None) -> dict:
  """The data record of a run's meta ({} for runs from before it was recorded)."""
  return (meta or {}).get("data") or {}


def check_data(meta: dict | None, snapshot, what: str, same_problem: bool = True) -> None:
  """Refuses to pair a run with data other than its own (`snapshot`): another problem
  (unless not `same_problem`: fine-tuning moves to other data), or another vocabulary (of
  the same size or not). `what` names the run in the message. Runs recorded before the data
  record have nothing to compare."""
  recorded = (meta or {}).get("data")
  if not recorded:
    return
  name = snapshot.problem.name
  if same_problem and recorded["problem"] != name:
    raise UsageError(f"{what} was trained on problem {recorded['problem']}, not "
                     f"{name}; pass --problem={recorded['problem']} (or none)")
  current = snapshot.vocab_sha256()
  if current != recorded["vocab_sha256"]:
    raise UsageError(
        f"{what} was trained with another vocabulary (sha256 {recorded['vocab_sha256'][:12]}, "
        f"from {meta.get('data_dir', '?')}) than the one in {snapshot.data_dir} (sha256 "
        f"{current[:12]}); give the --data_dir it was trained on, or "
        "prepare that data again")


def train_minutes(meta: dict | None, given: float | None) -> float:
  """The run's time budget: `given` (--train_minutes), or, not given, what the run recorded
  (a budget counts the run's training time, so a resumed run goes on with it rather than
  with none, with which its cooldown's end would be fixed at --train_steps); 0: none."""
  if given is not None:
    return given
  return (meta or {}).get("train_minutes") or 0.0
