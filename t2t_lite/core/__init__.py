"""The core every layer stands on: usage and run errors, files written whole, fault
injection, TensorFlow's process settings, hparams (parsing, the values the code implements),
the registry of hparams sets, problems and models, and the older formats of the files a run
and a datagen write (run records, manifests, the best model's record).

It imports no other package of t2t_lite, and TensorFlow only where a function needs it, so a
program can refuse a bad flag or hparam before TensorFlow starts.
"""
