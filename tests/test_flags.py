"""Every numeric flag of every command-line program: 0, a negative number and a non-number.

Each is either refused when the flags are parsed (exit 2, one line naming the flag and what
it accepts) or accepted with a meaning; never a traceback. The programs and their flags are
read from pyproject.toml and from each program's --helpfull, so a new flag is covered too.
"""

import os
import re
import tomllib
from concurrent.futures import ThreadPoolExecutor

import pytest

from conftest import REPO, cli


def _programs() -> list[str]:
  with open(os.path.join(REPO, "pyproject.toml"), "rb") as f:
    return sorted(tomllib.load(f)["project"]["scripts"])


def _own_section(program: str) -> str:
  """The flags of the program's own module, as its --helpfull lists them."""
  text = cli(program, "--helpfull").stdout  # absl exits 1 after printing the help
  module = "t2t_lite.cli." + program.removeprefix("t2t-lite-").replace("-", "_") + ":"
  assert module in text, f"{program} --helpfull has no section {module}"
  section = text.split(module, 1)[1]
  return re.split(r"\n\S", section, maxsplit=1)[0]  # up to the next module's section


def _numeric_flags(program: str) -> dict[str, str]:
  """{flag: 'integer' or 'number'} of the program's own module, from --helpfull."""
  found = {}
  for block in re.split(r"\n  --", "\n" + _own_section(program)):
    name = block.split(":", 1)[0].strip().removeprefix("--")
    if "(an integer)" in block:
      found[name] = "integer"
    elif re.search(r"\(a (non-negative )?number\)", block):
      found[name] = "number"
  return found


@pytest.mark.parametrize("program", _programs())
def test_help_lists_the_programs_own_flags(program):
  own = set(re.findall(r"^  --(?:\[no\])?(\w+)", _own_section(program), flags=re.M))
  assert len(own) >= 3, own
  shown = set(re.findall(r"^  --(?:\[no\])?(\w+)", cli(program, "--help").stdout, flags=re.M))
  assert own | {"debug"} <= shown, sorted(own - shown)


def _cases():
  for program in _programs():
    for name, kind in _numeric_flags(program).items():
      for value in ("0", "-1", "many"):
        yield program, name, kind, value


CASES = list(_cases())


def test_every_program_has_its_numeric_flags_covered():
  flags_of = {(p, n) for p, n, _, _ in CASES}
  assert ("t2t-lite-trainer", "log_every") in flags_of
  assert ("t2t-lite-trainer", "save_checkpoints_steps") in flags_of
  assert ("t2t-lite-trainer", "train_minutes") in flags_of
  assert ("t2t-lite-avg-checkpoints", "num_last_checkpoints") in flags_of
  assert ("t2t-lite-datagen", "vocab_size") in flags_of
  assert len(flags_of) >= 14, sorted(flags_of)


def _run(case):
  program, name, _, value = case
  return case, cli(program, f"--{name}={value}", timeout=60)


@pytest.fixture(scope="module")
def results():
  with ThreadPoolExecutor(max_workers=2) as pool:
    return dict(pool.map(_run, CASES))


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}--{c[1]}={c[3]}")
def test_numeric_flag_values(results, case):
  program, name, kind, value = case
  result = results[case]
  err = result.stderr
  assert "Traceback" not in err, err
  assert result.returncode == 2, (result.returncode, err)
  lines = [line for line in err.splitlines() if line.strip()]
  assert len(lines) == 1 and lines[0].startswith(f"{program}: error:"), err
  names_flag = f"--{name}={value}" in lines[0]
  if value == "many":
    assert names_flag and ("invalid literal" in err or "could not convert" in err), err
  elif value == "-1":
    assert names_flag and ("must be at least" in err or "non-negative" in err), err
  elif names_flag:  # 0 refused: then it says what the flag accepts
    assert "must be at least 1" in err, err
  else:  # 0 accepted (it has a meaning): the run stops at a later check instead
    assert "is required" in err, err
