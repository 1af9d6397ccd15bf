"""Files that appear whole or not at all: written under a temporary name, then renamed."""

from __future__ import annotations

import contextlib
import os


@contextlib.contextmanager
def atomic_path(path: str):
  """Yields a temporary path beside `path`; renames it to `path` if the block succeeds."""
  tmp = f"{path}.tmp-{os.getpid()}"
  try:
    yield tmp
    os.replace(tmp, path)
  finally:
    if os.path.exists(tmp):
      os.remove(tmp)


def write_atomic(path: str, data: bytes | str) -> None:
  with atomic_path(path) as tmp:
    with open(tmp, "wb") as f:
      f.write(data.encode("utf-8") if isinstance(data, str) else data)
