"""A trained model restored from a run directory (or a checkpoint), for decoding and export."""

from __future__ import annotations

from absl import logging

from t2t_lite.errors import UsageError


def load_model(output_dir, checkpoint_path, hparams_set, overrides, problem_name, data_dir):
  """(model, vocab, hparams) restored from a run directory or checkpoint."""
  from t2t_lite import registry, rundir
  from t2t_lite.cli import common
  # The run's recorded values, under its set or another one; --hparams may change them.
  hparams, meta, _ = rundir.resolve(hparams_set, overrides, output_dir, allow_change=True)
  if not hparams_set and meta is None:
    raise UsageError("give --output_dir of a training run (with its hparams.json) or "
                     "--hparams_set")
  problem = registry.problem(problem_name or (meta or {}).get("problem") or "")
  data_dir = data_dir or (meta or {}).get("data_dir")
  common.require(data_dir, "data_dir", "data/multi30k_ende")
  rundir.check_data(meta, problem, data_dir, output_dir or checkpoint_path)
  vocab = problem.get_vocab(data_dir)
  tf = common.import_tensorflow()
  path = checkpoint_path or (tf.train.latest_checkpoint(output_dir) if output_dir else None)
  if not path:
    raise UsageError(f"no checkpoint found in {output_dir}; pass --checkpoint_path")
  model = registry.model(hparams.model)(hparams, vocab.size)
  try:
    tf.train.Checkpoint(model=model).restore(path).expect_partial().assert_existing_objects_matched()
  except (tf.errors.OpError, ValueError, AssertionError) as err:
    raise UsageError(f"cannot restore {path}: {str(err).splitlines()[0][:200]}") from None
  logging.info("restored %s", path)
  return model, vocab, hparams
