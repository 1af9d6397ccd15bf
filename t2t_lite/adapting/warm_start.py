"""Warm start, in one place: a new run starts from another run's checkpoint.

- **The source**: --warm_start_from names a run directory (its newest checkpoint) or a
  checkpoint prefix, resolved once (on a cluster by the chief, so that every worker reads the
  same checkpoint while the source run may still be saving).
- **Its vocabulary**: the one the source run recorded; where it is another than this run's,
  its rows are mapped by piece (adapting.vocab_map: carried, composed from the source's
  pieces of their text, or new).
- **The copy**: with the same vocabulary and frozen parts, the model (and with
  --warm_start_optimizer Adam's slots) is read straight into the run's. Otherwise the source
  is read into a model of its own shapes and copied over variable by variable, the rows
  mapped, and Adam's slots follow the variables they belong to, whichever parts the source
  froze. Counters, accumulators and Adam's step start at 0.
"""

from __future__ import annotations

import os

import tensorflow as tf
from absl import logging

from t2t_lite.runs import rundir
from t2t_lite.runs.checkpoints import (PerVariable, StandIn, checkpoint_number, mismatches,
                                       newest_first)
from t2t_lite.core.errors import UsageError


def begin(learner, vocab, hparams, named: str, source_vocab_file: str = "",
          with_optimizer: bool = False, rows: str = "pieces", cluster=None):
  """Starts a new run's `learner` (of `hparams`, on `vocab`) from --warm_start_from=`named`:
  the checkpoint it names, resolved once (`cluster`: (is_chief, from_chief) on a cluster,
  see cluster_source_checkpoint), then copied (see `copy`; `source_vocab_file`: the source's
  vocabulary where it is another, see source_vocabulary). Returns (the checkpoint, the
  record of a vocabulary mapping or None)."""
  path = (cluster_source_checkpoint(named, *cluster) if cluster is not None
          else source_checkpoint(named))
  return path, copy(learner, vocab, hparams, path, source_vocab_file, with_optimizer, named,
                    rows)


def source_vocabulary(source: str, snapshot) -> str:
  """The model file of the vocabulary the --warm_start_from run was trained with, if it is
  another than `snapshot`'s (its rows are then mapped by piece, adapting.vocab_map); "" when
  it is the same, or the source recorded none."""
  from t2t_lite.core import registry
  meta = rundir.read_meta(source if os.path.isdir(source) else os.path.dirname(source) or ".")
  recorded = rundir.data_record_of(meta)
  if not recorded or recorded.get("vocab_sha256") == snapshot.vocab_sha256():
    return ""
  where = f"{recorded.get('problem')} in {meta.get('data_dir')}"
  try:
    theirs = registry.problem(recorded["problem"]).snapshot(meta["data_dir"], vocab_only=True)
    found = theirs.vocab_sha256()
  except UsageError as err:
    raise UsageError(f"--warm_start_from={source} was trained with another vocabulary; mapping "
                     f"its rows onto this one needs that vocabulary ({where}), which is not "
                     f"readable: {err}") from None
  if found != recorded["vocab_sha256"]:
    raise UsageError(f"--warm_start_from={source} was trained with the vocabulary of sha256 "
                     f"{recorded['vocab_sha256'][:12]}; {where} now holds another "
                     f"({found[:12]}), so its rows cannot be mapped; restore that data")
  return theirs.vocab().model_file


def copy_mapped(learner, path: str, source_hparams, source_vocab_size: int,
                mapping=None, with_optimizer: bool = False) -> str:
  """A new run starts from checkpoint `path` of a run with other vocabulary rows (`mapping`,
  a vocab_map.VocabMapping; None: the same vocabulary) or other frozen parts: the source's
  model (and with `with_optimizer` its Adam slots, over the variables it trained) is read
  into a model of its own shapes, then copied variable by variable, paired by name, the
  vocabulary's rows mapped; other variables are refused in one line. Returns what was reset,
  for the log."""
  from t2t_lite.core import registry
  source = registry.model(source_hparams.model)(source_hparams, source_vocab_size)
  tf.train.Checkpoint(model=source).read(path).expect_partial() \
      .assert_existing_objects_matched()
  target = learner.model
  theirs, ours = _by_name(source), _by_name(target)
  vocab_axes = _vocab_axes(target, ours)
  _check_same_variables(theirs, ours, path, vocab_axes)
  for name, variable in ours.items():
    value = theirs[name].numpy()
    if name in vocab_axes and mapping is not None:
      value = mapping.map_rows(value, variable.numpy(), vocab_axes[name])
    variable.assign(value)
  if not with_optimizer:
    return ""
  trained = source.trained_names(source_hparams.frozen_parts)
  per_variable = PerVariable(path, trained, trained, theirs)
  slots = {name: tf.Variable(tf.zeros_like(theirs[name]), trainable=False) for name in trained}
  second = {name: tf.Variable(tf.zeros_like(theirs[name]), trainable=False) for name in trained}
  tf.train.Checkpoint(optimizer=StandIn({**per_variable.fields("m_of", "m", slots),
                                         **per_variable.fields("v_of", "v", second)})) \
      .read(path).expect_partial().assert_existing_objects_matched()
  untrained = 0
  for name in learner.names:
    if name not in per_variable.carried:
      untrained += 1  # frozen in the source: no moments to carry
      continue
    for slot, source_slot in ((learner.adam.m_of[name], slots[name]),
                              (learner.adam.v_of[name], second[name])):
      value = source_slot.numpy()
      if name in vocab_axes and mapping is not None:
        value = mapping.map_moments(value, vocab_axes[name])
      slot.assign(value)
  reset = []
  if mapping is not None:
    counts = mapping.counts()
    reset.append(f"the rows of {counts['composed'] + counts['new']:,} composed and new pieces")
  if untrained:
    reset.append(f"{untrained} variables the source did not train")
  return "; Adam's moments start at 0 for " + " and ".join(reset) if reset else ""


def _by_name(model) -> dict:
  """{name: variable} of `model`'s trainable variables (Transformer.variable_names)."""
  names = model.variable_names()
  return {names[v.ref()]: v for v in model.trainable_variables}


def _vocab_axes(model, by_name: dict) -> dict:
  """{name: the axis with a row per vocabulary piece} of `model`'s vocabulary variables."""
  axes = {v.ref(): axis for v, axis in model.vocab_variables()}
  return {name: axes[v.ref()] for name, v in by_name.items() if v.ref() in axes}


def _check_same_variables(theirs: dict, ours: dict, path: str, vocab_axes: dict) -> None:
  """A usage error, in one line, unless the source's variables (`theirs`, by name) are this
  model's, of the same shapes but along the vocabulary axis."""
  missing, extra = sorted(set(ours) - set(theirs)), sorted(set(theirs) - set(ours))
  shapes = [f"{name} {theirs[name].shape.as_list()} != ours {ours[name].shape.as_list()}"
            for name in ours if name in theirs and not _same_but(
                theirs[name].shape.as_list(), ours[name].shape.as_list(), vocab_axes.get(name))]
  if not (missing or extra or shapes):
    return
  shown = lambda names: ", ".join(names[:3]) + (f" and {len(names) - 3} more"  # noqa: E731
                                                if len(names) > 3 else "")
  what = "; ".join(part for part in (
      missing and f"the source lacks {shown(missing)}",
      extra and f"this model lacks {shown(extra)}",
      shapes and f"other shapes: {shown(shapes)}") if part)
  raise UsageError(f"--warm_start_from={path}: its variables are not this model's ({what}); "
                   "warm start needs the same model (the same norm placement, layers and "
                   "sizes; the vocabulary may differ)")


def _same_but(a: list, b: list, axis: int | None) -> bool:
  """Whether shapes `a` and `b` agree except along `axis` (None: everywhere)."""
  return len(a) == len(b) and all(x == y for i, (x, y) in enumerate(zip(a, b)) if i != axis)


def copy(learner, vocab, hparams, path: str, source_vocab_file: str = "",
          with_optimizer: bool = False, named: str = "", rows: str = "pieces") -> dict | None:
  """Starts `learner` (of `hparams`, on `vocab`) from checkpoint `path` (`named`: what the
  user gave); `source_vocab_file`: the source's vocabulary when it differs from `vocab`,
  whose rows are mapped by the rule `rows` (vocab_map.ROW_RULES). Returns the record of a
  vocabulary mapping (for the run's record), else None."""
  folder = os.path.dirname(path) or "."
  recorded = rundir.read_meta(folder) is not None  # (a bare checkpoint prefix may have none)
  source_hparams, meta = rundir.model_from_run(folder) if recorded else (None, None)
  frozen_differ = (with_optimizer and recorded
                   and source_hparams.frozen_parts != hparams.frozen_parts)
  if not source_vocab_file and not frozen_differ:
    read_same_shapes(learner, path, with_optimizer, named)
    logging.info("warm start from %s: model weights%s; update 0", path,
                 " and Adam's slots" if with_optimizer else "")
    return None
  differ = [f"{name}={getattr(hparams, name)} (the source: {getattr(source_hparams, name)})"
            for name in rundir.SHAPE_HPARAMS
            if getattr(hparams, name) != getattr(source_hparams, name)]
  if differ:
    raise UsageError(f"--warm_start_from={named or path}: the model differs from the "
                     f"source's in {', '.join(differ)}; warm start needs the same model "
                     "shapes (the vocabulary may differ)")
  mapping = record = None
  if source_vocab_file:
    from t2t_lite.adapting import vocab_map
    from t2t_lite.data.vocab import SubwordVocab
    mapping = vocab_map.mapping(SubwordVocab(source_vocab_file), vocab, rows)
    examples = "; ".join(f"{piece} <- {' + '.join(parts)}"
                         for piece, parts in mapping.examples.items())
    logging.info("warm start onto another vocabulary, rows by %s: %s (e.g. %s)", rows,
                 mapping.summary(), examples or "none composed")
    record = {"source_vocab_sha256": (meta.get("data") or {}).get("vocab_sha256"),
              "rows": rows, **mapping.counts()}
  reset = copy_mapped(learner, path, source_hparams, meta["vocab_size"], mapping,
                            with_optimizer)
  logging.info("warm start from %s: model weights%s%s; update 0", path,
               " and Adam's slots" if with_optimizer else "", reset)
  return record


def source_checkpoint(source: str) -> str:
  """A checkpoint prefix: `source` itself, or the newest checkpoint of a run directory."""
  if os.path.isdir(source):
    path = next(iter(newest_first(source)), None)
    if path is not None and not os.path.basename(path).rsplit("-", 1)[-1].isdigit():
      raise UsageError(f"--warm_start_from={source}: its newest checkpoint {path} is not "
                       "named PREFIX-N; give the checkpoint prefix itself")
    if path is None:
      raise UsageError(f"--warm_start_from={source} holds no checkpoint; give a run "
                       "directory with checkpoints or a checkpoint prefix (RUN/ckpt-N)")
    return path
  if not tf.io.gfile.exists(source + ".index"):
    raise UsageError(f"--warm_start_from={source} is neither a run directory nor a "
                     f"checkpoint prefix (no {source}.index)")
  return source


def cluster_source_checkpoint(source: str, is_chief: bool, from_chief) -> str:
  """The checkpoint that --warm_start_from=`source` names on a cluster, resolved once, by
  the chief (`from_chief(values)`: its values on every worker): a run's newest checkpoint
  may change while the workers start, and all must read the same."""
  number = 0.0
  if is_chief:
    path = source_checkpoint(source)
    if os.path.isdir(source):
      if not os.path.basename(path).startswith("ckpt-"):
        raise UsageError(f"--warm_start_from={source}: its newest checkpoint {path} is not "
                         "a t2t-lite ckpt-N; on a cluster give the checkpoint prefix itself")
      number = float(checkpoint_number(path))
  number = int(from_chief([number])[0])
  return os.path.join(source, f"ckpt-{number}") if os.path.isdir(source) else source


def read_same_shapes(learner, path: str, with_optimizer: bool = False, source: str = "") -> None:
  """A new run starts from the model weights of the checkpoint `path` (see
  source_checkpoint; `source`: what the user named) and, with `with_optimizer`, from Adam's
  slots; counters, accumulators and Adam's step stay at 0. A usage error names what does not
  match."""
  source = source or path
  if not tf.io.gfile.exists(path + ".index"):
    raise UsageError(f"--warm_start_from={source}: checkpoint {path} is not readable here "
                     f"(no {path}.index); every worker must see the same files")
  objects = {"model": learner.model}
  if with_optimizer:
    # The slots only: the stand-in has the optimizer's attribute names, not its counter.
    model = _by_name(learner.model)
    slots = PerVariable(path, learner.names, learner.names, model)
    objects["optimizer"] = StandIn({**slots.fields("m_of", "m", learner.adam.m_of),
                                    **slots.fields("v_of", "v", learner.adam.v_of)})
  mismatched = mismatches(objects, path)
  if mismatched:
    shown = "; ".join(mismatched[:4]) + (f"; and {len(mismatched) - 4} more"
                                         if len(mismatched) > 4 else "")
    raise UsageError(f"--warm_start_from={source}: {len(mismatched)} variable(s) do not match "
                     f"this model: {shown}; warm start needs the same model shapes and "
                     "vocabulary")
  tf.train.Checkpoint(**objects).read(path).assert_existing_objects_matched()
