"""Files and directories that appear whole or not at all: written under a temporary name,
then renamed; and the check that an output does not overlap an input."""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import shutil
import tempfile


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


def overlap(output: str, source: str) -> str | None:
  """How `output` overlaps `source` (real paths): "is", "is inside" or "contains"; None when
  neither lies in the other."""
  out, src = (os.path.realpath(os.path.abspath(p)) for p in (output, source))
  if out == src:
    return "is"
  if out.startswith(src.rstrip(os.sep) + os.sep):
    return "is inside"
  if src.startswith(out.rstrip(os.sep) + os.sep):
    return "contains"
  return None


def _swap(new: str, old: str) -> bool:
  """Atomically exchanges two directories (Linux renameat2); False where unsupported."""
  try:
    libc = ctypes.CDLL(None, use_errno=True)
    rename_exchange, at_fdcwd = 2, -100
    if libc.renameat2(at_fdcwd, os.fsencode(new), at_fdcwd, os.fsencode(old),
                      rename_exchange) == 0:
      return True
    if ctypes.get_errno() in (errno.EINVAL, errno.ENOSYS, errno.EXDEV, errno.ENOTSUP):
      return False
    raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()), old)
  except AttributeError:  # no renameat2 in this C library
    return False


def _remove_stale_temporaries(parent: str, prefix: str) -> None:
  """Temporary directories of killed writers to the same place (their process is gone)."""
  for name in os.listdir(parent):
    if not name.startswith(prefix) or name.endswith(".old"):
      continue  # a moved-aside previous directory is never removed unasked
    pid = name[len(prefix):].split(".", 1)[0]
    if not pid.isdigit() or int(pid) == os.getpid():
      continue
    try:
      os.kill(int(pid), 0)
    except ProcessLookupError:
      shutil.rmtree(os.path.join(parent, name), ignore_errors=True)
    except PermissionError:
      pass


@contextlib.contextmanager
def atomic_directory(path: str, before_rename=None):
  """Yields an empty temporary directory beside `path`; renames it to `path` if the block
  succeeds (after calling `before_rename`, if given).

  An existing `path` (the caller decided it may be replaced) is swapped out atomically where
  the system allows it; otherwise it is moved aside and removed only after the new one is in
  place. Temporaries left by killed writers to the same path are removed.
  """
  path = os.path.abspath(path)
  parent, name = os.path.split(path)
  os.makedirs(parent, exist_ok=True)
  prefix = f".{name}.tmp-"
  _remove_stale_temporaries(parent, prefix)
  tmp = tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}.", dir=parent)
  umask = os.umask(0)
  os.umask(umask)
  os.chmod(tmp, 0o777 & ~umask)  # mkdtemp's 0700 would make the result private
  try:
    yield tmp
    if before_rename is not None:
      before_rename()
    if not os.path.exists(path):
      os.rename(tmp, path)
    elif not _swap(tmp, path):
      aside = f"{tmp}.old"
      os.rename(path, aside)
      os.rename(tmp, path)
      tmp = aside
  finally:
    if os.path.exists(tmp):
      shutil.rmtree(tmp)
