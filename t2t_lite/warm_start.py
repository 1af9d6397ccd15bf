"""Warm start: a new run starts from another run's checkpoint.

With the same vocabulary and frozen parts, the model (and with --warm_start_optimizer Adam's
slots) is read straight into the run's (checkpoints.warm_start). Otherwise the source is read
into a model of its own shapes and copied over variable by variable: onto another vocabulary
the rows are mapped by piece (t2t_lite.vocab_map), and Adam's slots follow the variables
they belong to, whichever parts the source froze.
"""

from __future__ import annotations

import os

import tensorflow as tf
from absl import logging

from t2t_lite import rundir
from t2t_lite.checkpoints import warm_start
from t2t_lite.errors import UsageError


def warm_start_mapped(learner, path: str, source_hparams, source_vocab_size: int,
                      mapping=None, with_optimizer: bool = False) -> str:
  """A new run starts from checkpoint `path` of a run with other vocabulary rows (`mapping`,
  a vocab_map.VocabMapping; None: the same vocabulary) or other frozen parts: the source's
  model (and with `with_optimizer` its Adam slots, over the variables it trained) is read
  into a model of its own shapes, then copied variable by variable, the vocabulary's rows
  mapped. The model hparams other than the vocabulary must match. Returns what was reset,
  for the log."""
  from t2t_lite import registry
  source = registry.model(source_hparams.model)(source_hparams, source_vocab_size)
  tf.train.Checkpoint(model=source).read(path).expect_partial() \
      .assert_existing_objects_matched()
  target = learner.model
  vocab_axes = {v.ref(): axis for v, axis in target.vocab_variables()}
  pairs = list(zip(target.trainable_variables, source.trainable_variables))
  for ours, theirs in pairs:
    value = theirs.numpy()
    if ours.ref() in vocab_axes and mapping is not None:
      value = mapping.map_rows(value, ours.numpy(), vocab_axes[ours.ref()])
    ours.assign(value)
  if not with_optimizer:
    return ""
  trained = source.trained_variables()
  m = [tf.Variable(tf.zeros_like(v), trainable=False) for v in trained]
  v = [tf.Variable(tf.zeros_like(v), trainable=False) for v in trained]
  tf.train.Checkpoint(optimizer=tf.train.Checkpoint(m=m, v=v)).read(path).expect_partial() \
      .assert_existing_objects_matched()
  slots = {var.ref(): (mi, vi) for var, mi, vi in zip(trained, m, v)}
  by_ours = {ours.ref(): theirs for ours, theirs in pairs}
  untrained = 0
  for ours, m_ours, v_ours in zip(learner.variables, learner.adam.m, learner.adam.v):
    theirs = by_ours[ours.ref()]
    if theirs.ref() not in slots:
      untrained += 1  # frozen in the source: no moments to carry
      continue
    for slot, source_slot in zip((m_ours, v_ours), slots[theirs.ref()]):
      value = source_slot.numpy()
      if ours.ref() in vocab_axes and mapping is not None:
        value = mapping.map_moments(value, vocab_axes[ours.ref()])
      slot.assign(value)
  reset = []
  if mapping is not None:
    counts = mapping.counts()
    reset.append(f"the rows of {counts['composed'] + counts['new']:,} composed and new pieces")
  if untrained:
    reset.append(f"{untrained} variables the source did not train")
  return "; Adam's moments start at 0 for " + " and ".join(reset) if reset else ""


def start(learner, vocab, hparams, path: str, source_vocab_file: str = "",
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
    warm_start(learner, path, with_optimizer, named)
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
    from t2t_lite import vocab_map
    from t2t_lite.problems.vocab import SubwordVocab
    mapping = vocab_map.plan(SubwordVocab(source_vocab_file), vocab, rows)
    examples = "; ".join(f"{piece} <- {' + '.join(parts)}"
                         for piece, parts in mapping.examples.items())
    logging.info("warm start onto another vocabulary, rows by %s: %s (e.g. %s)", rows,
                 mapping.summary(), examples or "none composed")
    record = {"source_vocab_sha256": (meta.get("data") or {}).get("vocab_sha256"),
              "rows": rows, **mapping.counts()}
  reset = warm_start_mapped(learner, path, source_hparams, meta["vocab_size"], mapping,
                            with_optimizer)
  logging.info("warm start from %s: model weights%s%s; update 0", path,
               " and Adam's slots" if with_optimizer else "", reset)
  return record
