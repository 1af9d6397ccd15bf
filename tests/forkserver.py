"""The tests' command-line programs, started by forking a process that has TensorFlow and the
library imported already.

Importing TensorFlow takes 4-6 s of CPU on the slow machines this suite must fit, and the
suite starts a couple of hundred programs. The server (run as a script) imports them once;
each program is then a fork of it, a real process of its own with the given arguments,
environment, working directory and standard streams, that imports its command-line module,
runs it and exits as the program would (its exit status, a signal included, is the
process's). TensorFlow's runtime is started by no one before the fork (the server runs no
TensorFlow operation), so every program starts its own, its devices split as its flags say.

`ForkedProcess` is the client: the subset of subprocess.Popen the tests use (pipes or files
for the standard streams, poll, wait, communicate, signals). The streams travel to the
server as file descriptors over its Unix socket. A program whose point is how it starts
(before TensorFlow loads, say) is run by exec instead (conftest.cli(..., fresh=True)).
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time

PROGRAMS = {  # installed program -> its module (pyproject.toml's [project.scripts])
    "t2t-lite-trainer": "t2t_lite.cli.trainer",
    "t2t-lite-datagen": "t2t_lite.cli.datagen",
    "t2t-lite-decoder": "t2t_lite.cli.decoder",
    "t2t-lite-bleu": "t2t_lite.cli.bleu",
    "t2t-lite-avg-checkpoints": "t2t_lite.cli.avg_checkpoints",
    "t2t-lite-exporter": "t2t_lite.cli.exporter",
    "t2t-lite-translate-all": "t2t_lite.cli.translate_all",
}
# What the server imports before it forks: TensorFlow and the library's heavy modules (not
# the command-line modules, whose absl flags would clash: each program imports its own).
PRELOAD = ("t2t_lite.training.loop", "t2t_lite.inference.translator",
           "t2t_lite.inference.export.saved_model", "t2t_lite.inference.decode",
           "t2t_lite.data.problems", "t2t_lite.configs", "t2t_lite.models.transformer",
           "tensorflow_text", "tensorflow_datasets", "ctranslate2")
# A test's own script (run as `python SCRIPT ARGS`, as by runpy) may be forked too.
SCRIPT = "python-script"


# --- the server -----------------------------------------------------------------------------
class _ChildExit(Exception):
  def __init__(self, code):
    super().__init__(code)
    self.code = code


def _receive(connection):
  """One request: (its JSON, the standard streams' descriptors)."""
  data, fds, _, _ = socket.recv_fds(connection, 1 << 16, 3)
  while not data.endswith(b"\n"):
    more = connection.recv(1 << 16)
    if not more:
      break
    data += more
  return json.loads(data), fds


def _run_program(request, fds, closing):
  """In the forked child: the program, as its executable would run it."""
  for sock in closing:
    sock.close()
  for target, fd in enumerate(fds):
    os.dup2(fd, target)
    os.close(fd)
  os.chdir(request["cwd"])
  os.environ.clear()
  os.environ.update(request["env"])
  for number in (signal.SIGINT, signal.SIGTERM, signal.SIGCHLD, signal.SIGPIPE):
    signal.signal(number, signal.default_int_handler if number == signal.SIGINT
                  else signal.SIG_DFL if number != signal.SIGPIPE else signal.SIG_IGN)
  sys.argv = [request["executable"], *request["args"]]
  try:
    if request["program"] == SCRIPT:
      import runpy
      sys.path.insert(0, os.path.dirname(os.path.abspath(request["executable"])))
      runpy.run_path(request["executable"], run_name="__main__")
    else:
      module = __import__(PROGRAMS[request["program"]], fromlist=["run"])
      module.run()
    code = 0
  except SystemExit as exit_:
    code = exit_.code
  except KeyboardInterrupt:  # as Python does: killed by the signal
    sys.stderr.flush()
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGINT)
    code = 130
  except BaseException:  # noqa: BLE001  (printed as Python prints an uncaught one)
    import traceback
    traceback.print_exc()
    code = 1
  raise _ChildExit(code)


def _report(connection, pid):
  """Sends the child's exit status when it ends: its code, or minus the signal."""
  _, status = os.waitpid(pid, 0)
  code = os.waitstatus_to_exitcode(status)
  try:
    connection.sendall(json.dumps({"returncode": code}).encode() + b"\n")
  except OSError:
    pass  # the client has gone
  connection.close()


def serve(path: str) -> None:
  """Imports, then forks a child for every request on the Unix socket `path`."""
  sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
  from t2t_lite.core.runtime import import_tensorflow
  import_tensorflow()
  for name in PRELOAD:
    __import__(name)
  from tensorflow.python.eager import context
  if context.context()._initialized:  # noqa: SLF001  (a fork would share a started runtime)
    raise RuntimeError("the fork server started TensorFlow's runtime before forking")
  listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
  listener.bind(path)
  listener.listen(64)
  print("ready", flush=True)
  while True:
    connection, _ = listener.accept()
    request, fds = _receive(connection)
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
      _run_program(request, fds, [listener, connection])
    for fd in fds:
      os.close(fd)
    connection.sendall(json.dumps({"pid": pid}).encode() + b"\n")
    threading.Thread(target=_report, args=(connection, pid), daemon=True).start()


# --- the client -----------------------------------------------------------------------------
class Server:
  """The server process of this test process (started on first use)."""

  def __init__(self):
    import tempfile
    self.folder = tempfile.mkdtemp(prefix="t2t-lite-forkserver-")
    self.path = os.path.join(self.folder, "socket")
    self.process = subprocess.Popen([sys.executable, os.path.abspath(__file__), self.path],
                                    stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                    stdin=subprocess.DEVNULL, text=True)
    line = self.process.stdout.readline()
    if line.strip() != "ready":
      raise RuntimeError(f"the fork server did not start ({self.process.poll()})")

  def close(self) -> None:
    self.process.kill()
    self.process.wait()
    import shutil
    shutil.rmtree(self.folder, ignore_errors=True)


_SERVER = None


def server() -> Server:
  global _SERVER
  if _SERVER is None:
    _SERVER = Server()
    import atexit
    atexit.register(_SERVER.close)
  return _SERVER


def _stream(spec, mode: str, text: bool):
  """(the descriptor the child gets, our end as a file object or None, fds to close)."""
  if spec == subprocess.PIPE:
    read, write = os.pipe()
    ours, theirs = (write, read) if mode == "w" else (read, write)
    return theirs, os.fdopen(ours, mode, encoding="utf-8" if text else None,
                             **({} if text else {"buffering": 0})), [theirs]
  if spec is None or spec == subprocess.DEVNULL:
    fd = os.open(os.devnull, os.O_RDWR)
    return fd, None, [fd]
  fd = spec if isinstance(spec, int) else spec.fileno()
  return fd, None, []


class ForkedProcess:
  """A program forked by the server, with subprocess.Popen's interface (the part used)."""

  def __init__(self, args, env=None, stdin=None, stdout=None, stderr=None, text=True,
               cwd=None):
    self.args = list(args)
    program, command = os.path.basename(self.args[0]), self.args
    if self.args[0] == sys.executable and len(self.args) > 1:  # python SCRIPT ARGS
      program, command = SCRIPT, self.args[1:]
    elif program not in PROGRAMS:
      raise ValueError(f"{program} is not one of t2t-lite's programs")
    streams = [_stream(stdin, "w", text), _stream(stdout, "r", text),
               _stream(stderr, "r", text)]
    self.stdin, self.stdout, self.stderr = (ours for _, ours, _ in streams)
    request = {"program": program, "executable": command[0], "args": command[1:],
               "env": dict(os.environ if env is None else env),
               "cwd": os.path.abspath(cwd or os.getcwd())}
    self._socket = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    self._socket.connect(server().path)
    socket.send_fds(self._socket, [json.dumps(request).encode() + b"\n"],
                    [theirs for theirs, _, _ in streams])
    for _, _, closing in streams:
      for fd in closing:
        os.close(fd)
    self._buffer = b""
    self.pid = self._message()["pid"]
    self.returncode = None

  def _message(self, timeout=None) -> dict | None:
    """The server's next line (None at the timeout)."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while b"\n" not in self._buffer:
      wait = None if deadline is None else max(deadline - time.monotonic(), 0.0)
      if not select.select([self._socket], [], [], wait)[0]:
        return None
      data = self._socket.recv(4096)
      if not data:
        raise RuntimeError("the fork server went away")
      self._buffer += data
    line, self._buffer = self._buffer.split(b"\n", 1)
    return json.loads(line)

  def poll(self):
    if self.returncode is None:
      message = self._message(timeout=0)
      if message is not None:
        self._finished(message)
    return self.returncode

  def wait(self, timeout=None):
    if self.returncode is None:
      message = self._message(timeout)
      if message is None:
        raise subprocess.TimeoutExpired(self.args, timeout)
      self._finished(message)
    return self.returncode

  def _finished(self, message) -> None:
    self.returncode = message["returncode"]
    self._socket.close()

  def communicate(self, input=None, timeout=None):  # noqa: A002  (Popen's name)
    """Popen.communicate: writes `input`, reads stdout and stderr to their ends, waits."""
    results = {}

    def read(name, stream):
      results[name] = stream.read()

    threads = [threading.Thread(target=read, args=(name, stream), daemon=True)
               for name, stream in (("stdout", self.stdout), ("stderr", self.stderr))
               if stream is not None]
    for thread in threads:
      thread.start()
    if self.stdin is not None:
      if input:
        self.stdin.write(input)
      self.stdin.close()
    deadline = None if timeout is None else time.monotonic() + timeout
    for thread in threads:
      thread.join(None if deadline is None else max(deadline - time.monotonic(), 0.0))
      if thread.is_alive():
        raise subprocess.TimeoutExpired(self.args, timeout)
    self.wait(None if deadline is None else max(deadline - time.monotonic(), 0.0))
    for stream in (self.stdout, self.stderr):
      if stream is not None:
        stream.close()
    return results.get("stdout"), results.get("stderr")

  def send_signal(self, number) -> None:
    if self.poll() is None:
      os.kill(self.pid, number)

  def terminate(self) -> None:
    self.send_signal(signal.SIGTERM)

  def kill(self) -> None:
    self.send_signal(signal.SIGKILL)


def run(args, env=None, timeout=None, stdin=None, cwd=None):
  """subprocess.run(args, capture_output=True, text=True) through the server: a program of
  t2t-lite's, or [sys.executable, SCRIPT, ...]."""
  process = ForkedProcess(args, env=env, stdin=subprocess.PIPE if stdin is not None else None,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=cwd)
  try:
    out, err = process.communicate(stdin, timeout=timeout)
  except subprocess.TimeoutExpired:
    process.kill()
    process.wait()
    raise
  return subprocess.CompletedProcess(args, process.returncode, out, err)


def _exit(code) -> None:
  """Ends the child as an interpreter's exit would, but for tearing down the modules the
  server imported (a second of CPU with TensorFlow's, which no program's output depends on):
  the exit functions run, the standard streams are flushed, then the process ends."""
  import atexit
  if code is None:
    status = 0
  elif isinstance(code, int):
    status = code
  else:
    print(code, file=sys.stderr)
    status = 1
  atexit._run_exitfuncs()  # noqa: SLF001
  for stream in (sys.stdout, sys.stderr):
    try:
      stream.flush()
    except (OSError, ValueError):
      pass  # a closed pipe, as at any exit
  os._exit(status & 0xFF)


if __name__ == "__main__":
  try:
    serve(sys.argv[1])
  except _ChildExit as done:
    _exit(done.code)
