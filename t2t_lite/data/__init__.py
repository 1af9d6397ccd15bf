"""Data: from raw parallel text to the batches of a training run.

It owns the translation problems and datagen (`problems/`, sentencepiece vocabularies and
subword sampling, the shards and the store of training examples read by index, a data
directory's snapshot, several training corpora by weight), the planned training stream
(batches planned from the examples' lengths, each process reading its own, the curriculum of
corpus weights and their mixing) and the tf.data input of evaluation.

It may import `core` only: no model, run directory or training code.
"""
