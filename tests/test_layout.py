"""The repository's layout: the library never imports the command line, benchmarks live
outside the package, configs/ is not a top-level Python package, the linter passes."""

import ast
import os
import re
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = os.path.join(REPO, "t2t_lite")


def _modules(root):
  for folder, _, names in os.walk(root):
    for name in sorted(names):
      if name.endswith(".py"):
        yield os.path.join(folder, name)


def _imported(path, root=REPO):
  """The absolute names a module imports (relative imports resolved against the package)."""
  module = os.path.relpath(path, root)[:-3].replace(os.sep, ".")
  package = module.rsplit(".", 1)[0] if not module.endswith("__init__") else module[:-9]
  names = []
  for node in ast.walk(ast.parse(open(path, encoding="utf-8").read(), path)):
    if isinstance(node, ast.Import):
      names.extend(alias.name for alias in node.names)
    elif isinstance(node, ast.ImportFrom):
      base = node.module or ""
      if node.level:
        parts = package.split(".")
        base = ".".join(parts[:len(parts) - node.level + 1] + ([base] if base else []))
      names.extend([base] + [f"{base}.{alias.name}" for alias in node.names])
  return names


def test_the_library_never_imports_the_command_line():
  cli = os.path.join(PACKAGE, "cli")
  offenders = [f"{os.path.relpath(path, REPO)} imports {name}"
               for path in _modules(PACKAGE) if not path.startswith(cli + os.sep)
               for name in _imported(path)
               if name == "t2t_lite.cli" or name.startswith("t2t_lite.cli.")]
  assert offenders == []


def test_the_import_walk_sees_an_import_of_the_command_line(tmp_path):
  """The walk above would catch one: absolute, relative and plain forms."""
  module = tmp_path / "t2t_lite" / "models" / "probe.py"
  module.parent.mkdir(parents=True)
  module.write_text("from ..cli import common\nimport t2t_lite.cli.decoder\n"
                    "from t2t_lite.cli.trainer import run\n")
  names = _imported(str(module), str(tmp_path))
  assert {"t2t_lite.cli.common", "t2t_lite.cli.decoder", "t2t_lite.cli.trainer"} <= set(names)


def test_only_the_runtime_module_sets_tensorflows_process_environment():
  setters = [os.path.relpath(path, REPO) for path in _modules(PACKAGE)
             if re.search(r"os\.environ(\.setdefault|\.update|\[[^]]+\]\s*=)|putenv",
                          open(path, encoding="utf-8").read())]
  assert setters == ["t2t_lite/runtime.py"]


def test_no_library_module_mentions_a_benchmark():
  mentions = [f"{os.path.relpath(path, REPO)}:{number}"
              for path in _modules(PACKAGE)
              for number, line in enumerate(open(path, encoding="utf-8"), 1)
              if re.search(r"bench", line, re.I)]
  assert mentions == []


def test_configs_is_installed_inside_the_package_not_as_a_top_level_package():
  code = ("import importlib.util, sys; import t2t_lite.configs as c; "
          "print(importlib.util.find_spec('configs') is None, c.__name__)")
  out = subprocess.run([sys.executable, "-c", code], cwd="/", capture_output=True, text=True,
                       check=True).stdout.split()
  assert out == ["True", "t2t_lite.configs"]


def test_the_linter_passes():
  result = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "."],
                          cwd=REPO, capture_output=True, text=True)
  assert result.returncode == 0, result.stdout + result.stderr
