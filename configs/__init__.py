"""Registered hparams sets, one file per model family. Importing this package registers them."""

from configs import transformer  # noqa: F401
