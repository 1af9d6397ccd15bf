"""Typed hyperparameters: parse "a=1,b=2.5", JSON round trip, clear errors.

Each hparam's type is fixed by its default value (int, float, bool or str). Overrides are
converted by that type, so `batch_size=2.5` is an error rather than a silent truncation.
"""

from __future__ import annotations

import difflib
import json
from typing import Any

from t2t_lite.core.errors import UsageError

# Hparams that earlier versions read, and why none does now (run records that hold them are
# read without them: formats.run_record).
RETIRED = {
    "shuffle_buffer_size": "training batches are planned from a global shuffle of every "
                           "epoch (t2t_lite.data.stream), which needs no buffer",
}

_TYPES = (bool, int, float, str)
_TRUE = {"true", "1", "yes", "on"}
_FALSE = {"false", "0", "no", "off"}


class HParamsError(UsageError):
  pass


def _type_name(kind: type) -> str:
  return kind.__name__


def closest(name: str, candidates, n: int = 3) -> list[str]:
  """Close spellings of `name` among `candidates`, best first."""
  return difflib.get_close_matches(name, list(candidates), n=n, cutoff=0.6)


def _convert(name: str, kind: type, value: Any) -> Any:
  """Converts `value` (a string or a Python value) to `kind`, or raises HParamsError."""
  bad = HParamsError(f"hparam '{name}' is {_type_name(kind)}; cannot set it to {value!r}")
  if isinstance(value, str):
    text = value.strip()
    if kind is bool:
      if text.lower() in _TRUE:
        return True
      if text.lower() in _FALSE:
        return False
      raise bad
    if kind is int:
      try:
        return int(text)
      except ValueError:
        try:
          as_float = float(text)
        except ValueError:
          raise bad from None
        if as_float.is_integer():  # "1e3" is a fine int
          return int(as_float)
        raise bad from None
    if kind is float:
      try:
        return float(text)
      except ValueError:
        raise bad from None
    return value
  if kind is bool:
    if isinstance(value, bool):
      return value
    raise bad
  if kind is int:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
      raise bad
    if float(value).is_integer():
      return int(value)
    raise bad
  if kind is float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
      raise bad
    return float(value)
  if not isinstance(value, str):
    raise bad
  return value


class HParams:
  """A flat set of typed hyperparameters with attribute access."""

  def __init__(self, **values: Any):
    object.__setattr__(self, "_types", {})
    for name, value in values.items():
      self.add_hparam(name, value)

  def add_hparam(self, name: str, value: Any) -> None:
    if name in self._types:
      raise ValueError(f"hparam '{name}' already exists")
    kind = type(value)
    if kind not in _TYPES:
      raise TypeError(f"hparam '{name}' must be int, float, bool or str, not {kind.__name__}")
    self._types[name] = kind
    object.__setattr__(self, name, value)

  def __setattr__(self, name: str, value: Any) -> None:
    self.set_hparam(name, value)

  def _check_known(self, name: str) -> None:
    if name in RETIRED and name not in self._types:
      raise HParamsError(f"hparam '{name}' is no longer read: {RETIRED[name]}; drop it")
    if name not in self._types:
      hint = closest(name, self._types)
      suggestion = f"; did you mean {' or '.join(hint)}?" if hint else ""
      raise HParamsError(f"unknown hparam '{name}'{suggestion}")

  def set_hparam(self, name: str, value: Any) -> None:
    self._check_known(name)
    object.__setattr__(self, name, _convert(name, self._types[name], value))

  def kind(self, name: str) -> type:
    self._check_known(name)
    return self._types[name]

  def parse(self, spec: str) -> dict[str, Any]:
    """Applies "a=1,b=2" overrides; returns the parsed {name: value} it applied."""
    applied: dict[str, Any] = {}
    for entry in (spec or "").split(","):
      if not entry.strip():
        continue
      if "=" not in entry:
        if "@" in entry:  # "1@0,2@1000": the schedule's pairs went to the comma split
          raise HParamsError(f"malformed --hparams entry {entry.strip()!r}: separate the n@update "
                             "pairs of optimizer_multistep_accumulate_schedule with ';', e.g. "
                             "optimizer_multistep_accumulate_schedule=1@0;2@1000")
        raise HParamsError(f"malformed --hparams entry {entry.strip()!r}: expected name=value, "
                           "e.g. --hparams='batch_size=2048,learning_rate_constant=1.0'")
      name, value = entry.split("=", 1)
      name = name.strip()
      if not name:
        raise HParamsError(f"malformed --hparams entry {entry.strip()!r}: the name is empty")
      self.set_hparam(name, value)
      applied[name] = getattr(self, name)
    return applied

  def values(self) -> dict[str, Any]:
    return {name: getattr(self, name) for name in self._types}

  def copy(self) -> "HParams":
    return HParams(**self.values())

  def to_json(self, indent: int | None = 2) -> str:
    return json.dumps(self.values(), indent=indent, sort_keys=True)

  @classmethod
  def from_json(cls, text: str) -> "HParams":
    return cls(**json.loads(text))

  def override_from_dict(self, values: dict[str, Any]) -> None:
    for name, value in values.items():
      self.set_hparam(name, value)

  def __eq__(self, other: object) -> bool:
    return isinstance(other, HParams) and self.values() == other.values()

  def __repr__(self) -> str:
    return "HParams(" + ", ".join(f"{k}={v!r}" for k, v in sorted(self.values().items())) + ")"
