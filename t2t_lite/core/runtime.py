"""TensorFlow's process settings, in one place: import TensorFlow through `import_tensorflow`.

Importing this module sets the environment TensorFlow reads when it loads (a user's own
values win); `import_tensorflow` then loads it without its start-up noise.
"""

from __future__ import annotations

import contextlib
import os
import sys

# TensorFlow uses its oneDNN kernels by default only on some x86 CPUs; on an AVX2-only AMD EPYC
# they were off, and turning them on trained transformer_multi30k_cpu 5-11% faster (same
# memory). Set before TensorFlow is imported; a user's own TF_ENABLE_ONEDNN_OPTS wins.
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")


@contextlib.contextmanager
def _quiet_stderr():
  sys.stderr.flush()
  saved = os.dup(2)
  devnull = os.open(os.devnull, os.O_WRONLY)
  try:
    os.dup2(devnull, 2)
    yield
  finally:
    os.dup2(saved, 2)
    os.close(saved)
    os.close(devnull)


def import_tensorflow(before_devices=None):
  """Imports TensorFlow without its start-up noise on stderr; later errors still show.

  TensorFlow writes oneDNN and CUDA-probe lines from C++ before absl logging starts; no
  setting removes all of them, so stderr is pointed at /dev/null for the import and the
  first device query only. `before_devices()` runs between the two, with stderr intact:
  the last moment to choose visible GPUs (CUDA_VISIBLE_DEVICES) for this process.
  """
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
  with _quiet_stderr():
    import tensorflow as tf
  if before_devices is not None:
    before_devices()
  with _quiet_stderr():
    tf.config.list_physical_devices()
  return tf
