"""Registered hparams sets, one file per model family. Importing this package (installed as
`t2t_lite.configs`) registers them."""

from . import transformer  # noqa: F401
