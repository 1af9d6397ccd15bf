"""What every command-line program shares: quiet TensorFlow import, flags, exit codes.

Exit codes: 0 done; 2 usage error (bad flag, unknown name, bad data layout); 1 a run that
failed (non-finite updates, no readable checkpoint). Known errors print one line on stderr;
`--debug` adds the Python traceback.
"""

from __future__ import annotations

import contextlib
import os
import sys
import traceback

from absl import app, flags, logging

from t2t_lite.errors import RunError, UsageError

# TensorFlow uses its oneDNN kernels by default only on some x86 CPUs; on an AVX2-only AMD EPYC
# they were off, and turning them on trained transformer_multi30k_cpu 5-11% faster (same
# memory). Set before TensorFlow is imported; a user's own TF_ENABLE_ONEDNN_OPTS wins.
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")

flags.DEFINE_bool("debug", False, "Print Python tracebacks for usage and run errors.")
FLAGS = flags.FLAGS


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


def _fail(program: str, err: Exception) -> None:
  if FLAGS.is_parsed() and FLAGS.debug:
    traceback.print_exc()
  print(f"{program}: error: {err}", file=sys.stderr)
  sys.exit(getattr(err, "exit_code", 1))


def run(main, program: str) -> None:
  """Runs `main()` under absl with one-line errors and the project's exit codes.

  `main` imports TensorFlow (through import_tensorflow) only once its flags are checked, so
  a usage error costs no TensorFlow start-up.
  """

  # --help lists the key flags of the main module, which for an installed script is the
  # script, not the module that defines the program's flags: name them key flags of both.
  for module in (main.__module__, __name__):
    for flag in FLAGS.get_key_flags_for_module(module):
      FLAGS.register_key_flag_for_module(sys.argv[0], flag)

  def parse(argv):
    try:
      rest = FLAGS(argv)
    except flags.Error as err:
      print(f"{program}: error: {err} (see {program} --help)", file=sys.stderr)
      sys.exit(2)
    if len(rest) > 1:
      print(f"{program}: error: unexpected arguments {rest[1:]}; flags take the form "
            "--name=value", file=sys.stderr)
      sys.exit(2)
    return rest

  def wrapped(argv):
    if FLAGS["verbosity"].using_default_value:
      logging.set_verbosity(logging.INFO)
    try:
      main()
    except (UsageError, RunError) as err:
      _fail(program, err)
    except OSError as err:
      _fail(program, RunError(f"{err}"))
    except KeyboardInterrupt:
      print(f"{program}: interrupted", file=sys.stderr)
      sys.exit(130)

  app.run(wrapped, flags_parser=parse)


def define_count(name: str, default: int, help_text: str, minimum: int = 0,
                 maximum: int | None = None) -> None:
  """An integer flag checked when the flags are parsed (a usage error, exit 2, before any
  work): at least `minimum` (and at most `maximum`). The help text says what 0 means where
  0 is allowed."""
  module = sys._getframe(1).f_globals["__name__"]  # listed under its program in --helpfull
  flags.DEFINE_integer(name, default, help_text, module_name=module)
  bound = f"must be at least {minimum}" + (f" and at most {maximum}" if maximum else "")
  flags.register_validator(
      name, lambda value: value is None or (value >= minimum and (maximum is None
                                                                 or value <= maximum)),
      message=bound)


def require(flag_value, name: str, example: str) -> None:
  if not flag_value:
    raise UsageError(f"--{name} is required, e.g. --{name}={example}")


def check_writable_dir(path: str, flag: str) -> None:
  """A usage error unless `path` is, or can be created as, a writable directory."""
  probe = os.path.abspath(path)
  while not os.path.exists(probe):
    probe = os.path.dirname(probe)
  if not os.path.isdir(probe) or not os.access(probe, os.W_OK | os.X_OK):
    raise UsageError(f"--{flag}={path} is not writable ({probe} is not a writable directory); "
                     "choose a directory you can write to")
