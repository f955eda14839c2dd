"""Python commands run in a fork of an interpreter that has already imported what they all
import (tests/prewarmed_server.py), instead of a fresh interpreter each.

    result = prewarmed(("torch", "transformers")).run(
        [sys.executable, "probe.py", "arg"], capture_output=True, text=True,
        env={**os.environ, "PYTHONPATH": tree}, timeout=600)

`run` takes subprocess.run's arguments (the subset the tests use) and returns its
CompletedProcess. Why: a vLLM probe's own work is often a second or two, its imports of
torch, transformers and vLLM's other dependencies about 8 CPU-seconds on the 2-core CI
machine, paid again by every probe.

A command goes to the fork only where it runs as it would alone; otherwise it runs in a fresh
interpreter through subprocess.run, with the reason counted in `fresh`:
- argv is this venv's interpreter, then a script or `-c CODE` (no interpreter options);
- its environment equals the one the server started with (this process's, without
  PYTHONPATH) but in keys no preloaded module reads (`FREE_KEYS`, `FREE_PREFIXES`): the
  preloaded modules read theirs at import, once, in the server;
- no folder on its path (the script's, `-c`'s working directory, PYTHONPATH's) holds a module
  or package named as one the server loaded, which a fresh interpreter would import instead,
  or a `sitecustomize` or `usercustomize`, which a fresh interpreter would run at its start.
"""

from __future__ import annotations

import atexit
import collections
import json
import locale
import os
import selectors
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path

SERVER = Path(__file__).with_name("prewarmed_server.py")
# keys that only the commands' own code reads (the repository's and vLLM's switches, which
# the server never imports) or nobody reads at import: a command may set them as it likes
FREE_KEYS = frozenset({"PYTHONPATH", "PYTHONDONTWRITEBYTECODE", "PYTEST_CURRENT_TEST"})
FREE_PREFIXES = ("GLM53_", "VLLM_")
# what site.py imports at an interpreter's start from wherever the path finds it: the
# server started long before, so a command whose path offers one needs a fresh interpreter
STARTUP_HOOKS = frozenset({"sitecustomize", "usercustomize"})
READY_TIMEOUT_S = 300
_SUFFIXES = (".py", ".pyc", ".pyw", ".so", ".pth")


class PrewarmedError(RuntimeError):
    """The server did not start, or went away under a command."""


def module_names(folder: str) -> set[str]:
    """The top-level module and package names a folder on sys.path offers."""
    try:
        entries = os.listdir(folder or ".")
    except OSError:
        return set()
    names = set()
    for entry in entries:
        stem, dot, _ = entry.partition(".")
        if not dot or entry.endswith(_SUFFIXES):
            names.add(stem)
    return names


class Prewarmed:
    """One server that preloaded PRELOAD, for this process's commands."""

    def __init__(self, preload: Sequence[str], python: str = sys.executable):
        self.preload, self.python = tuple(preload), python
        self.env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
        self.forked = 0
        self.fresh: collections.Counter[str] = collections.Counter()
        self._folder = tempfile.TemporaryDirectory(prefix="prewarmed-")
        self.socket_path = os.path.join(self._folder.name, "server")
        self.server = subprocess.Popen(
            [python, str(SERVER), self.socket_path, *self.preload], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=self.env, cwd="/")
        self.loaded = self._wait_ready()
        atexit.register(self.close)

    def _wait_ready(self) -> frozenset[str]:
        selector = selectors.DefaultSelector()
        selector.register(self.server.stdout, selectors.EVENT_READ)
        if not selector.select(READY_TIMEOUT_S):
            self.close()
            raise PrewarmedError(f"{SERVER.name}: not ready within {READY_TIMEOUT_S} s")
        line = self.server.stdout.readline()
        if not line:
            error = self.server.stderr.read().decode(errors="replace")[-2000:]
            self.close()
            raise PrewarmedError(f"{SERVER.name} {' '.join(self.preload)}: exited: {error}")
        return frozenset(json.loads(line)["ready"])

    def close(self) -> None:
        if self.server.poll() is None:
            self.server.stdin.close()  # EOF: the server kills its live children and exits
            try:
                self.server.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.server.kill()
                self.server.wait()
        for stream in (self.server.stdout, self.server.stderr):
            stream.close()
        self._folder.cleanup()

    # -- which commands may come here ------------------------------------------------------
    def why_fresh(self, args: Sequence[str], env: dict[str, str], cwd: str) -> str | None:
        """None where the command runs in a fork as it would alone; else the reason not."""
        if len(args) < 2 or args[0] != self.python:
            return "not this interpreter"
        if args[1].startswith("-") and not (args[1] == "-c" and len(args) > 2):
            return f"interpreter option {args[1]}"
        if args[1] != "-c" and not os.path.isfile(os.path.join(cwd, args[1])):
            return "not a script file"  # a folder or zip with __main__, or missing
        for key in sorted(set(env) | set(self.env)):
            if env.get(key) != self.env.get(key) and not (
                    key in FREE_KEYS or key.startswith(FREE_PREFIXES)):
                return f"environment {key}"
        for folder in self.command_path(args, env, cwd):
            shadowed = module_names(folder) & (self.loaded | STARTUP_HOOKS)
            if shadowed:
                return f"{folder} holds {min(shadowed)}"
        return None

    @staticmethod
    def command_path(args: Sequence[str], env: dict[str, str], cwd: str) -> list[str]:
        """The folders a fresh interpreter adds to the venv's: the script's (the working
        directory for -c), then PYTHONPATH's as site.py leaves them (absolute, an empty
        entry the working directory, without repeats)."""
        first = cwd if args[1] == "-c" else os.path.dirname(
            os.path.realpath(os.path.join(cwd, args[1])))
        python_path = env.get("PYTHONPATH", "")
        entries = python_path.split(os.pathsep) if python_path else []
        return [first, *dict.fromkeys(os.path.normpath(os.path.join(cwd, e)) for e in entries)]

    # -- running ---------------------------------------------------------------------------
    def run(self, args: Sequence[str], *, input: bytes | str | None = None,  # noqa: A002
            capture_output: bool = False, stdin=None, stdout=None, stderr=None,
            text: bool = False, env: dict[str, str] | None = None, cwd: str | Path | None = None,
            timeout: float | None = None, check: bool = False) -> subprocess.CompletedProcess:
        args = [str(arg) for arg in args]
        env = dict(os.environ if env is None else env)
        cwd = os.path.abspath(cwd if cwd is not None else os.getcwd())
        options = dict(input=input, capture_output=capture_output, stdin=stdin, stdout=stdout,
                       stderr=stderr, text=text, env=env, cwd=cwd, timeout=timeout, check=check)
        reason = self.why_fresh(args, env, cwd)
        if reason is not None:
            self.fresh[reason] += 1
            return subprocess.run(args, **options)  # noqa: S603 - the caller's own command
        self.forked += 1
        if capture_output:
            stdout = stderr = subprocess.PIPE
        if input is not None:
            stdin = subprocess.PIPE
            input = input.encode() if isinstance(input, str) else input  # noqa: A001
        with _Streams(stdin, stdout, stderr) as streams:
            request = {"argv": args[1:], "env": env, "cwd": cwd,
                       "python_path": self.command_path(args, env, cwd)[1:]}
            connection = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            try:
                connection.connect(self.socket_path)
                socket.send_fds(connection, [json.dumps(request).encode()], streams.child_fds())
                streams.close_child_ends()
                json.loads(self._receive(connection))["pid"]  # forked: the status follows
                returncode, out, err, timed_out = self._communicate(
                    connection, streams, input, timeout)
            finally:
                connection.close()
        if text:
            out, err = (None if data is None else _text(data) for data in (out, err))
        if timed_out:
            raise subprocess.TimeoutExpired(args, timeout, output=out, stderr=err)
        if check and returncode:
            raise subprocess.CalledProcessError(returncode, args, out, err)
        return subprocess.CompletedProcess(args, returncode, out, err)

    def _receive(self, connection: socket.socket) -> bytes:
        message = connection.recv(4096)
        if not message:
            raise PrewarmedError(f"{SERVER.name}: went away under a command "
                                 f"(server exit {self.server.poll()})")
        return message

    def _communicate(self, connection, streams, input_bytes, timeout):
        """Feed stdin, read stdout and stderr to their ends, wait for the exit status; past
        `timeout` the child is killed and the rest collected, as subprocess.run does."""
        selector = selectors.DefaultSelector()
        selector.register(connection, selectors.EVENT_READ, "status")
        chunks: dict[int, list[bytes]] = {}
        for fd in streams.read_fds():
            os.set_blocking(fd, False)
            selector.register(fd, selectors.EVENT_READ, "output")
            chunks[fd] = []
        pending = memoryview(input_bytes or b"")
        if streams.stdin_w is not None:
            os.set_blocking(streams.stdin_w, False)
            if pending:
                selector.register(streams.stdin_w, selectors.EVENT_WRITE, "input")
            else:
                streams.close_stdin()
        deadline = None if timeout is None else time.monotonic() + timeout
        returncode, timed_out = None, False
        while selector.get_map():
            wait = None if deadline is None else max(0.0, deadline - time.monotonic())
            events = selector.select(wait)
            if not events and deadline is not None and time.monotonic() >= deadline:
                connection.send(b"kill")
                deadline, timed_out = None, True
                continue
            for key, _ in events:
                if key.data == "status":
                    returncode = json.loads(self._receive(connection))["returncode"]
                    selector.unregister(connection)
                elif key.data == "output":
                    data = os.read(key.fd, 1 << 16)
                    if data:
                        chunks[key.fd].append(data)
                    else:
                        selector.unregister(key.fd)
                else:
                    try:
                        pending = pending[os.write(key.fd, pending[:1 << 16]):]
                    except BrokenPipeError:
                        pending = pending[:0]
                    if not pending:
                        selector.unregister(key.fd)
                        streams.close_stdin()
        out = b"".join(chunks[streams.stdout_r]) if streams.stdout_r is not None else None
        err = b"".join(chunks[streams.stderr_r]) if streams.stderr_r is not None else None
        return returncode, out, err, timed_out


def _text(data: bytes) -> str:
    """As subprocess decodes text=True output: the locale's encoding, universal newlines."""
    return data.decode(locale.getpreferredencoding(False)).replace("\r\n", "\n").replace("\r", "\n")


class _Streams:
    """The command's three file descriptors as subprocess would give them, and this side's
    ends of the pipes; everything opened here is closed on exit."""

    def __init__(self, stdin, stdout, stderr):
        self._opened: list[int] = []
        self.stdin_w = self.stdout_r = self.stderr_r = None
        self._child: list[int] = []
        fd_in, self.stdin_w = self._one(stdin, 0, reading=True)
        fd_out, self.stdout_r = self._one(stdout, 1, reading=False)
        if stderr == subprocess.STDOUT:
            fd_err = fd_out
        else:
            fd_err, self.stderr_r = self._one(stderr, 2, reading=False)
        self._child = [fd_in, fd_out, fd_err]

    def _one(self, spec, inherited: int, *, reading: bool) -> tuple[int, int | None]:
        """(the child's fd, this side's pipe end or None)."""
        if spec is None:
            return inherited, None
        if spec == subprocess.DEVNULL:
            fd = os.open(os.devnull, os.O_RDONLY if reading else os.O_WRONLY)
            self._opened.append(fd)
            return fd, None
        if spec == subprocess.PIPE:
            read_end, write_end = os.pipe()
            self._opened += [read_end, write_end]
            return (read_end, write_end) if reading else (write_end, read_end)
        return (spec if isinstance(spec, int) else spec.fileno()), None

    def child_fds(self) -> list[int]:
        return list(self._child)

    def read_fds(self) -> list[int]:
        return [fd for fd in (self.stdout_r, self.stderr_r) if fd is not None]

    def _close(self, fd: int) -> None:
        if fd in self._opened:
            self._opened.remove(fd)
            os.close(fd)

    def close_child_ends(self) -> None:
        """The child has its copies: this side's must close, or the pipes never end."""
        for fd in set(self._child):
            self._close(fd)

    def close_stdin(self) -> None:
        if self.stdin_w is not None:
            self._close(self.stdin_w)
            self.stdin_w = None

    def __enter__(self) -> _Streams:
        return self

    def __exit__(self, *exc) -> None:
        for fd in list(self._opened):
            self._close(fd)


_SERVERS: dict[tuple[str, ...], Prewarmed] = {}
_SERVERS_LOCK = threading.Lock()


def prewarmed(preload: Sequence[str]) -> Prewarmed:
    """This process's server for PRELOAD, started on first use (one, whichever thread asks)."""
    key = tuple(preload)
    with _SERVERS_LOCK:
        if key not in _SERVERS or _SERVERS[key].server.poll() is not None:
            _SERVERS[key] = Prewarmed(key)
        return _SERVERS[key]

