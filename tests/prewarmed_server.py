"""A prewarmed interpreter: imports PRELOAD once, then runs each requested Python command
in a fork of itself, as if it were a fresh `python SCRIPT ARGS` (or `python -c CODE ARGS`).

    python prewarmed_server.py SOCKET MODULE...

Run by tests/prewarmed.py, which decides which commands may come here (an environment that
differs from this process's only where no preloaded module looks, no preloaded name
shadowed on the command's path) and falls back to a fresh interpreter otherwise.

Protocol, over a SOCK_SEQPACKET socket, one connection a command: the client sends one
JSON message {"argv": [...], "env": {...}, "cwd": str, "python_path": [...]} with three
file descriptors (the command's stdin, stdout and stderr); the server answers {"pid": N}
once forked, then {"returncode": N} once the child has exited (negative: killed by that
signal, as subprocess reports it). A message "kill" from the client SIGKILLs the child if
it still runs. The server exits, killing its live children, when its stdin reaches EOF
(its client is gone).

Only the standard library is imported before PRELOAD: this file is run by path, outside
the tests' packages, so nothing of the repository is loaded into the commands' process.
"""

from __future__ import annotations

import atexit
import builtins
import gc
import importlib
import importlib.machinery
import io
import json
import os
import selectors
import signal
import socket
import sys
import threading
import traceback
import types

MAX_MESSAGE = 1 << 22
# the first entries of the interpreter's own search path (its zipped and plain library)
STDLIB = frozenset({sys._stdlib_dir, os.path.join(  # noqa: SLF001
    os.path.dirname(sys._stdlib_dir), f"python{sys.version_info[0]}{sys.version_info[1]}.zip")})  # noqa: SLF001


def exit_code(done: SystemExit) -> int:
    """The exit status the interpreter gives an uncaught SystemExit."""
    if done.code is None:
        return 0
    if isinstance(done.code, int):
        return done.code & 0xFF
    flush(sys.stdout)  # the interpreter flushes stdout before it writes the message
    print(done.code, file=sys.stderr)
    return 1


def flush(stream) -> None:
    try:
        stream.flush()
    except (OSError, ValueError):
        pass


def take_stdio(fds: list[int]) -> None:
    """The command's three descriptors as 0, 1 and 2, and sys's streams over them as the
    interpreter makes them at start: stderr line-buffered, stdout when a tty."""
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    for number, name, mode in ((0, "stdin", "r"), (1, "stdout", "w"), (2, "stderr", "w")):
        old = getattr(sys, name)
        stream = io.TextIOWrapper(
            io.open(number, mode + "b", closefd=False), encoding=old.encoding,
            errors=old.errors, newline="\n", write_through=old.write_through,
            line_buffering=name == "stderr" or (name == "stdout" and os.isatty(number)))
        setattr(sys, name, stream)
        setattr(sys, f"__{name}__", stream)


def search_path(argv: list[str], python_path: list[str], base_path: list[str]) -> list[str]:
    """sys.path as a fresh interpreter builds it: the script's folder ('' for -c), then
    what .pth files put first, PYTHONPATH, the standard library and the rest."""
    stdlib = next((i for i, entry in enumerate(base_path) if entry in STDLIB), 0)
    first = "" if argv[0] == "-c" else os.path.dirname(os.path.realpath(argv[0]))
    return [first, *base_path[:stdlib], *python_path, *base_path[stdlib:]]


def main_module(argv: list[str]) -> tuple[types.ModuleType, str | bytes, str]:
    """(__main__ as the interpreter makes it for `-c CODE` or a script file, its source,
    the file name its code reports)."""
    main = types.ModuleType("__main__")
    main.__dict__.update(__builtins__=builtins, __annotations__={})
    if argv[0] == "-c":
        main.__loader__ = importlib.machinery.BuiltinImporter
        return main, argv[1], "<string>"
    main.__loader__ = importlib.machinery.SourceFileLoader("__main__", argv[0])
    main.__file__, main.__cached__ = argv[0], None
    return main, main.__loader__.get_data(argv[0]), argv[0]


def run_command(request: dict, fds: list[int], base_path: list[str]) -> int:
    """In the child: the command's stdio, directory, environment, path and argv, its code
    run as __main__, then what the interpreter does at exit; its exit status."""
    take_stdio(fds)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    sys.dont_write_bytecode = bool(request["env"].get("PYTHONDONTWRITEBYTECODE"))
    if "numpy.random" in sys.modules:  # its global generator, seeded at import, anew
        sys.modules["numpy.random"].seed()
    argv = request["argv"]
    sys.argv = ["-c", *argv[2:]] if argv[0] == "-c" else list(argv)
    sys.path[:] = search_path(argv, request["python_path"], base_path)
    main, source, filename = main_module(argv)
    sys.modules["__main__"] = main
    code = 0
    try:
        exec(compile(source, filename, "exec", dont_inherit=True), main.__dict__)  # noqa: S102 - the command's own code
    except SystemExit as done:
        code = exit_code(done)
    except BaseException:  # noqa: BLE001 - reported as the interpreter reports it
        kind, error, frames = sys.exc_info()
        # from the command's own first frame, as a fresh interpreter's traceback starts
        while frames is not None and frames.tb_frame.f_code.co_filename == __file__:
            frames = frames.tb_next
        flush(sys.stdout)
        sys.excepthook(kind, error.with_traceback(frames), frames)
        del kind, error, frames
        code = 1
    try:
        threading._shutdown()  # noqa: SLF001 - the interpreter's own wait for threads at exit
        atexit._run_exitfuncs()  # noqa: SLF001
        # then, as the interpreter's teardown does, the command's globals go one by one, so
        # what they held is finalized in order (an unclosed file's text, then its buffer, is
        # written); the collection sees only the command's own objects (the preloaded are
        # frozen)
        main.__dict__.clear()
        gc.collect()
    except BaseException:  # noqa: BLE001
        traceback.print_exc()
    flush(sys.stdout)
    flush(sys.stderr)
    return code


class Server:
    def __init__(self, path: str):
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.listener.bind(path)
        self.listener.listen(64)
        self.selector = selectors.DefaultSelector()
        self.children: dict[int, socket.socket] = {}
        self.wakeup_r, self.wakeup_w = os.pipe()
        os.set_blocking(self.wakeup_w, False)
        # main() took the server's own folder off; its client starts it without PYTHONPATH,
        # so this is what a fresh interpreter of this venv has after the script's folder
        # and PYTHONPATH
        self.base_path = list(sys.path)

    def serve(self) -> None:
        signal.set_wakeup_fd(self.wakeup_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        self.selector.register(self.listener, selectors.EVENT_READ, "accept")
        self.selector.register(sys.stdin.fileno(), selectors.EVENT_READ, "client")
        self.selector.register(self.wakeup_r, selectors.EVENT_READ, "reap")
        # the names a command's path must not shadow: every top-level module loaded here
        loaded = sorted({name.partition(".")[0] for name in sys.modules}
                        - set(sys.builtin_module_names))
        print(json.dumps({"ready": loaded}), flush=True)
        while True:
            for key, _ in self.selector.select():
                if key.data == "accept":
                    self.accept()
                elif key.data == "client":
                    if not os.read(sys.stdin.fileno(), 4096):
                        self.shut_down()
                        return
                elif key.data == "reap":
                    os.read(self.wakeup_r, 4096)
                    self.reap()
                else:
                    self.client_message(key.fileobj, key.data)

    def accept(self) -> None:
        connection, _ = self.listener.accept()
        message, fds, _, _ = socket.recv_fds(connection, MAX_MESSAGE, 3)
        request = json.loads(message)
        pid = os.fork()
        if pid == 0:
            self.in_child(connection, request, fds)
        for fd in fds:
            os.close(fd)
        self.children[pid] = connection
        connection.send(json.dumps({"pid": pid}).encode())
        self.selector.register(connection, selectors.EVENT_READ, pid)

    def in_child(self, connection: socket.socket, request: dict, fds: list[int]) -> None:
        code = 1
        try:
            signal.set_wakeup_fd(-1)
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            self.selector.close()
            for fd in (self.wakeup_r, self.wakeup_w):
                os.close(fd)
            self.listener.close()
            connection.close()
            for other in self.children.values():
                other.close()
            code = run_command(request, fds, self.base_path)
        except BaseException:  # noqa: BLE001 - on the command's stderr where it got that far
            traceback.print_exc()
        finally:
            os._exit(code)

    def client_message(self, connection: socket.socket, pid: int) -> None:
        if connection.recv(64) == b"kill" and pid in self.children:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        else:  # the client went away: its child is reaped all the same
            self.selector.unregister(connection)

    def reap(self) -> None:
        while self.children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            connection = self.children.pop(pid, None)
            if connection is None:
                continue
            try:
                connection.send(json.dumps({"returncode": os.waitstatus_to_exitcode(status)}).encode())
            except OSError:
                pass
            if connection.fileno() in self.selector.get_map():
                self.selector.unregister(connection)
            connection.close()

    def shut_down(self) -> None:
        for pid in list(self.children):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for pid in list(self.children):
            try:
                os.waitpid(pid, 0)
            except ChildProcessError:
                pass


def main() -> None:
    socket_path, *modules = sys.argv[1:]
    del sys.path[0]  # this file's folder (the tests'): nothing preloaded may come from it
    for module in modules:
        importlib.import_module(module)
    # a fork keeps only its caller's thread: a Python thread would leave its locks held in
    # every command (native pools such as OpenBLAS's, which numpy starts, restart after a
    # fork by their own pthread_atfork handlers)
    if threading.active_count() != 1:
        print(f"prewarmed: the preload ({', '.join(modules)}) left Python threads running: "
              f"{', '.join(t.name for t in threading.enumerate())}; preload less",
              file=sys.stderr)
        sys.exit(2)
    if "PYTHONPATH" in os.environ:
        print("prewarmed: started with PYTHONPATH; the commands' paths come with each",
              file=sys.stderr)
        sys.exit(2)
    # the preloaded objects out of the collector's reach: a collection in a command would
    # otherwise write to every one of them and copy the whole heap into the fork
    gc.freeze()
    Server(socket_path).serve()


if __name__ == "__main__":
    main()
