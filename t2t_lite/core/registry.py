"""Registries of hparams sets, problems and models, looked up by name.

A new hparams set is one decorated function in `configs/`:

    @registry.register_hparams
    def transformer_mine():
      hparams = transformer_base()
      hparams.batch_size = 2048
      return hparams

Unknown names raise a UsageError listing the closest registered names.
"""

from __future__ import annotations

import importlib
from typing import Callable, Iterable

from t2t_lite.core.errors import UsageError
from t2t_lite.core.hparams import closest


class RegistryError(UsageError):
  pass


class Registry:
  """Name -> object, with aliases and close-match suggestions."""

  def __init__(self, kind: str, flag: str):
    self.kind = kind
    self.flag = flag
    self._items: dict[str, object] = {}
    self._aliases: dict[str, str] = {}

  def register(self, obj=None, *, name: str | None = None, aliases: Iterable[str] = ()):
    """Decorator: `@register` or `@register(name=..., aliases=(...))`."""

    def decorate(target):
      key = name or getattr(target, "name", None) or target.__name__
      for k in (key, *aliases):
        if k in self._items or k in self._aliases:
          raise ValueError(f"{self.kind} '{k}' is registered twice")
      self._items[key] = target
      for alias in aliases:
        self._aliases[alias] = key
      return target

    return decorate(obj) if obj is not None else decorate

  def names(self) -> list[str]:
    _load_builtins()
    return sorted(self._items)

  def aliases(self) -> dict[str, str]:
    _load_builtins()
    return dict(self._aliases)

  def canonical(self, name: str) -> str:
    _load_builtins()
    name = self._aliases.get(name, name)
    if name not in self._items:
      known = list(self._items) + list(self._aliases)
      hint = closest(name, known)
      suggestion = f"; did you mean {' or '.join(hint)}?" if hint else ""
      raise RegistryError(f"unknown {self.kind} '{name}'{suggestion} "
                          f"(t2t-lite-trainer --registry_help lists them all)")
    return name

  def get(self, name: str):
    return self._items[self.canonical(name)]


hparams_sets = Registry("hparams set", "--hparams_set")
problems = Registry("problem", "--problem")
models = Registry("model", "--model")

register_hparams = hparams_sets.register
register_problem = problems.register
register_model = models.register

_BUILTIN_MODULES = ("t2t_lite.configs", "t2t_lite.data.problems", "t2t_lite.models")
_loaded = False


def _load_builtins() -> None:
  global _loaded
  if not _loaded:
    _loaded = True
    for module in _BUILTIN_MODULES:
      importlib.import_module(module)


def hparams(name: str):
  """A fresh HParams of the registered set `name`."""
  return hparams_sets.get(name)()


def problem(name: str):
  """An instance of the registered problem `name`."""
  return problems.get(name)()


def model(name: str) -> Callable:
  return models.get(name)


def help_string() -> str:
  _load_builtins()
  lines = []
  for reg in (hparams_sets, problems, models):
    lines.append(f"{reg.kind}s ({reg.flag}):")
    by_target = {v: k for k, v in reg._aliases.items()}  # noqa: SLF001 (this module's own)
    for name in reg.names():
      alias = by_target.get(name)
      lines.append(f"  {name}" + (f"  (alias: {alias})" if alias else ""))
  return "\n".join(lines)
