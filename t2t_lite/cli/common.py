"""What every command-line program shares: flags, exit codes, TensorFlow through `runtime`.

Exit codes: 0 done; 2 usage error (bad flag, unknown name, bad data layout); 1 a run that
failed (non-finite updates, no readable checkpoint). Known errors print one line on stderr;
`--debug` adds the Python traceback.
"""

from __future__ import annotations

import os
import sys
import traceback

from absl import app, flags, logging

from t2t_lite.core.errors import RunError, UsageError
from t2t_lite.core.runtime import import_tensorflow  # noqa: F401  (the programs' one way in

flags.DEFINE_bool("debug", False, "Print Python tracebacks for usage and run errors.")
FLAGS = flags.FLAGS


def _fail(program: str, err: Exception) -> None:
  if FLAGS.is_parsed() and FLAGS.debug:
    traceback.print_exc()
  print(f"{program}: error: {err}", file=sys.stderr)
  code = getattr(err, "exit_code", 1)
  distribute = sys.modules.get("t2t_lite.cluster.distribute")  # loaded only by a training process
  if distribute is not None:
    distribute.exit_now(code)
  sys.exit(code)


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
      sys.stdout.flush()  # (a closed pipe shows here, not at the interpreter's exit)
    except (UsageError, RunError) as err:
      _fail(program, err)
    except BrokenPipeError:  # what reads the output stopped (`| head`): end quietly
      os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
      sys.exit(141)  # (128 + SIGPIPE, as a program killed by it)
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
  module = sys._getframe(1).f_globals["__name__"]  # noqa: SLF001 (--helpfull lists it there)
  flags.DEFINE_integer(name, default, help_text, module_name=module)
  bound = f"must be at least {minimum}" + (f" and at most {maximum}" if maximum else "")
  flags.register_validator(
      name, lambda value: value is None or (value >= minimum and (maximum is None
                                                                 or value <= maximum)),
      message=bound)


def define_weights(reads: str) -> None:
  """--weights: which weights of a checkpoint the program `reads` (see t2t_lite.runs.ema)."""
  module = sys._getframe(1).f_globals["__name__"]  # noqa: SLF001 (--helpfull lists it there)
  flags.DEFINE_enum("weights", "auto", ["auto", "ema", "raw"], f"The weights {reads}: auto, "
                    "the moving average where the checkpoint holds one (trained with "
                    "ema_decay > 0), else the raw weights; ema (refused where there is none); "
                    "raw.", module_name=module)


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
