"""Files and directories that appear whole or not at all: written under a temporary name,
synced, then renamed; and the check that an output does not overlap an input.

Temporary names carry their writer's tag, `<host>-<pid>`: on a shared filesystem a writer
on another node is never taken for a stopped one (its pid means nothing here), so only
temporaries of this host's processes that are gone are ever removed (`stale`). Names of
earlier versions carry the pid alone and are judged as this host's; those that carry the
host without the hash `_host` now adds to a name with punctuation are left, as another
host's.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import functools
import hashlib
import os
import re
import shutil
import socket
import tempfile

# A writer's tag in a name: the host (letters, digits and _: see _host) and the pid, or the
# pid alone.
TAG = r"(?:[A-Za-z0-9_]+-)?\d+"


@functools.cache
def _host() -> str:
  """This host's part of a writer's tag: its name where that is letters and digits alone (at
  most 63), else the name with every other character as `_` (cut to 63), `_` and 12 hex
  digits of the name's sha256, so that hosts whose names differ in punctuation alone
  (`node-1`, `node.1`, `node_1`) get different tags."""
  name = socket.gethostname()
  if re.fullmatch(r"[A-Za-z0-9]{1,63}", name):
    return name
  digest = hashlib.sha256(name.encode("utf-8", "surrogateescape")).hexdigest()[:12]
  return f"{re.sub(r'[^A-Za-z0-9]', '_', name)[:63] or 'host'}_{digest}"


def writer_tag() -> str:
  """This process's tag for temporary names: `<host>-<pid>`."""
  return f"{_host()}-{os.getpid()}"


def stale(tag: str) -> bool:
  """Whether the writer of `tag` (see TAG) is a process of this host that is gone."""
  host, _, pid = tag.rpartition("-")
  if (host and host != _host()) or not pid.isdigit() or int(pid) == os.getpid():
    return False
  try:
    os.kill(int(pid), 0)
  except ProcessLookupError:
    return True
  except PermissionError:
    pass
  return False


def _sync(path: str) -> None:
  """Flushes what was written to `path` (a file or a folder) to the disk."""
  descriptor = os.open(path, os.O_RDONLY)
  try:
    os.fsync(descriptor)
  finally:
    os.close(descriptor)


@contextlib.contextmanager
def atomic_path(path: str):
  """Yields a temporary path beside `path`; if the block succeeds, syncs the file, renames it
  to `path` and syncs the folder, so that after a crash `path` holds the old bytes or all of
  the new ones."""
  tmp = f"{path}.tmp-{writer_tag()}"
  try:
    yield tmp
    _sync(tmp)
    os.replace(tmp, path)
    try:  # (some filesystems cannot sync a folder, or open one to sync it: the file is in)
      _sync(os.path.dirname(os.path.abspath(path)))
    except OSError as err:
      if err.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EBADF, errno.EACCES,
                           errno.EPERM, errno.EISDIR):
        raise
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


def remove_stale_temporaries(parent: str, prefix: str) -> None:
  """Temporary directories `prefix<tag>.*` in `parent` of this host's writers that are gone
  (killed: see stale)."""
  for name in os.listdir(parent):
    if not name.startswith(prefix) or name.endswith(".old"):
      continue  # a moved-aside previous directory is never removed unasked
    if stale(name[len(prefix):].split(".", 1)[0]):
      shutil.rmtree(os.path.join(parent, name), ignore_errors=True)


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
  remove_stale_temporaries(parent, prefix)
  tmp = tempfile.mkdtemp(prefix=f"{prefix}{writer_tag()}.", dir=parent)
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
