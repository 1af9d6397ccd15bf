"""t2t-lite: a Transformer NMT trainer on TensorFlow 2 with exact multistep Adam.

The library is a house of layers; a package imports only the packages of the layers below
its own (tests/test_layout.py checks it), so a package can be read knowing only what lies
under it:

    cli/                    the command-line programs: parse flags, call the library
    training/               the loop, the learner, the run's plan and budget, checkpoints
                            and resuming, evaluation and choosing a model
    inference/  adapting/   search, translation, metrics, export | warm start onto a run
    runs/                   a run directory as its readers see it: record, checkpoints, EMA
    data/  models/  cluster/
                            problems and datagen, the planned training stream | the
                            Transformer | strategies, Slurm, one worker's failure
    configs                 the registered hparams sets (the repository's configs/ folder)
    core/                   errors, files, faults, TensorFlow's process settings, hparams,
                            their checks, the registry

docs/layout.md says where each concern lives and where a change goes.
"""

__version__ = "0.1.0"
