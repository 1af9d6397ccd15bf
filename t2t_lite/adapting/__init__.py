"""Adapting a trained model: a new run's warm start from another run (resolving the
source, its vocabulary, the weights copied, onto another vocabulary by piece).

It may import `core`, `configs`, `data`, `models` and `runs`; the training loop calls it
when a new run starts. Frozen parts are an hparam (`frozen_parts`, core.hparams_check)
that the model and the learner read.
"""
