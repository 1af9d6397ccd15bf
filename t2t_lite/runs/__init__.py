"""A run directory as every reader finds it: the run's record (`hparams.json`: the hparams,
the data, the seed, the time budget) and what a run starts from, its checkpoints newest
first with the update each records, and the moving average of the weights (written by the
learner, chosen by every reader: evaluation, decoding, averaging, export).

It may import `core` and `configs`; training writes a run, and inference, adapting and the
programs read one through this package.
"""
