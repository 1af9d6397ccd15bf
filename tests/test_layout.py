"""The repository's layout: the library's packages form layers whose imports run one way
(and never in a circle), the library never imports the command line, benchmarks live outside
the package, configs/ is not a top-level Python package, the linter passes."""

import ast
import os
import re
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = os.path.join(REPO, "t2t_lite")
# The library's packages, lowest layer first (see t2t_lite/__init__.py and docs/layout.md): a
# package may import the packages of lower layers only; packages of one layer not each other.
LAYERS = (("core",), ("configs",), ("data", "models", "cluster"), ("runs",),
          ("inference", "adapting"), ("training",), ("cli",))


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


def _library_modules(repo=REPO):
  """(dotted module name, path) of every module of the library, configs/ as t2t_lite.configs."""
  for root, prefix in ((os.path.join(repo, "t2t_lite"), "t2t_lite"),
                       (os.path.join(repo, "configs"), "t2t_lite.configs")):
    for path in _modules(root):
      parts = os.path.relpath(path, root)[:-3].split(os.sep)
      name = ".".join([prefix] + [p for p in parts if p != "__init__"])
      yield name, path


def _package(module):
  """The layer package of a dotted module name (None for t2t_lite itself)."""
  parts = module.split(".")
  return parts[1] if len(parts) > 1 else None


def _upward_imports(repo=REPO):
  """'module imports name' for every import of a package of the same or a higher layer."""
  rank = {package: level for level, packages in enumerate(LAYERS) for package in packages}
  found = []
  for module, path in _library_modules(repo):
    mine = _package(module)
    for name in _imported(path, repo):
      theirs = _package(name) if name.startswith("t2t_lite.") else None
      if mine is None or theirs in (None, mine):
        continue
      if theirs not in rank or mine not in rank:
        found.append(f"{module} imports {name}: a package outside LAYERS")
      elif rank[theirs] >= rank[mine]:
        found.append(f"{module} ({mine}) imports {name} ({theirs}), not a lower layer")
  return sorted(set(found))


def test_every_package_is_a_layer_and_imports_only_lower_layers():
  packages = {name for name in os.listdir(PACKAGE)
              if os.path.isfile(os.path.join(PACKAGE, name, "__init__.py"))} | {"configs"}
  assert packages == {package for layer in LAYERS for package in layer}
  assert _upward_imports() == []


def test_the_layer_check_catches_an_upward_import(tmp_path):
  """A planted import of training from data, and of one same-layer package by another."""
  for folder, text in (("t2t_lite/data", "from t2t_lite.training import learner\n"),
                       ("t2t_lite/models", "from t2t_lite.cluster.distribute import x\n"),
                       ("t2t_lite/training", "from t2t_lite.data import stream\n"),
                       ("configs", "")):
    (tmp_path / folder).mkdir(parents=True)
    (tmp_path / folder / "probe.py").write_text(text)
  found = _upward_imports(str(tmp_path))
  assert [line.split(" imports ")[0] for line in found] == ["t2t_lite.data.probe (data)"] * 2 + [
      "t2t_lite.models.probe (models)"] * 2
  assert found[0] == ("t2t_lite.data.probe (data) imports t2t_lite.training (training), not a "
                      "lower layer")


def test_no_two_library_modules_import_each_other_in_a_circle():
  """Module-level and deferred imports alike: a circle would make the layers a knot."""
  modules = dict(_library_modules())
  graph = {module: {name for name in _imported(path) if name in modules and name != module}
           for module, path in modules.items()}
  circles, state = [], {}

  def visit(module, trail):
    state[module] = "open"
    for other in sorted(graph[module]):
      if state.get(other) == "open":
        circles.append(trail[trail.index(other):] + [other])
      elif other not in state:
        visit(other, trail + [other])
    state[module] = "done"

  for module in sorted(graph):
    if module not in state:
      visit(module, [module])
  # A package's face and its own modules are not a circle: a module always loads its
  # package first, so the face may load them (to register them, or by the format asked for).
  faces = {module for module, path in modules.items() if path.endswith("__init__.py")}
  circles = [c for c in circles
             if not any(face in faces and all(m == face or m.startswith(face + ".") for m in c)
                        for face in c)]
  assert circles == []


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
  assert setters == ["t2t_lite/core/runtime.py"]


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


# Objects change their own state; where the library fills in another library's object (a
# CTranslate2 model spec is filled field by field, its documented way; a checkpoint object
# the function itself made), the place is named here.
FOREIGN_STATE = {"t2t_lite/inference/export/ctranslate2_model.py": "CTranslate2 model specs",
                 "t2t_lite/training/best.py": "its own tf.train.Checkpoint's save counter"}


def _foreign_writes(path):
  """Lines of `path` that assign a field or a variable of an object other than self."""
  found = []
  for node in ast.walk(ast.parse(open(path, encoding="utf-8").read(), path)):
    targets = (node.targets if isinstance(node, ast.Assign) else
               [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else [])
    for target in targets:
      for sub in ast.walk(target):
        if (isinstance(sub, ast.Attribute) and isinstance(sub.ctx, ast.Store)
            and not (isinstance(sub.value, ast.Name) and sub.value.id in ("self", "cls"))):
          found.append(f"{node.lineno}: {ast.unparse(sub)} =")
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
        and node.func.attr in ("assign", "assign_add", "assign_sub")
        and isinstance(node.func.value, ast.Attribute)
        and not (isinstance(node.func.value.value, ast.Name)
                 and node.func.value.value.id == "self")):
      found.append(f"{node.lineno}: {ast.unparse(node.func)}()")
  return found


def test_objects_change_only_their_own_state():
  """No module assigns the Learner's variables or another object's fields: it calls their
  methods (Learner.take_layout, TrainLog.write_summaries, Clock.take_window, ...)."""
  offenders = {os.path.relpath(path, REPO): lines for path in _modules(PACKAGE)
               if (lines := _foreign_writes(path))}
  assert sorted(offenders) == sorted(FOREIGN_STATE), offenders


def test_the_state_check_sees_a_foreign_write(tmp_path):
  probe = tmp_path / "probe.py"
  probe.write_text("def f(learner, log):\n  learner.layout.assign([1, 2])\n"
                   "  log.writer = None\n  self.ok = 1\n  self.ok2.assign(3)\n")
  assert _foreign_writes(str(probe)) == ["3: log.writer =", "2: learner.layout.assign()"]
