"""A real `vllm serve` of an engine venv, as a context manager: started on a free loopback
port in its own process group, ready when /v1/models answers, always stopped with its whole
process tree (API server, engine core, workers).

    with EngineServer(venv, model, ["--max-model-len", "4096"], name="plain") as server:
        server.url, server.model, server.ready_s

Several servers start at once with `start()` on each, then `wait_ready()` on each. A server
that dies or does not answer within `ready_timeout` raises EngineStartError with the tail
of its log. `argv=` runs a given command line instead of `vllm serve MODEL ARGS` (the
launcher's own argv); then the port must be in it.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from tests.engine.cache import progress
from tests.engine.engine_env import EngineVenv

LOG_TAIL_LINES = 40
# This process's waits for servers to answer, (name, seconds the caller waited, seconds from
# the server's start to its answer), in order: tests/engine/conftest.py moves them onto the
# test's report, and the run's end tells per test file how much of its wall was boots.
READY_WAITS: list[tuple[str, float, float]] = []


def note_ready(name: str, waited_s: float, ready_s: float) -> None:
    """A boot this process waited on that no EngineServer here started (run.sh's, compare's)."""
    READY_WAITS.append((name, waited_s, ready_s))


@dataclass(frozen=True)
class EngineSpec:
    """What a `vllm serve` of a venv is: MODEL, the ARGS after it, and ENV over base_env. The
    engine tier's fleet keys its shared servers by it (tests/engine/conftest.py): tests that
    ask for equal specs get one server."""
    model: Path
    args: tuple[str, ...]
    env: tuple[tuple[str, str], ...] = ()

    def server(self, venv: EngineVenv, name: str, log_dir: Path, **options) -> EngineServer:
        """A server of this spec of its own (not started)."""
        return EngineServer(venv, self.model, self.args, dict(self.env), name=name,
                            log_dir=log_dir, **options)


class EngineStartError(RuntimeError):
    """The engine did not come up; the message carries its log's tail."""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def base_env(venv: EngineVenv) -> dict[str, str]:
    """What every engine of the tier runs with, and why."""
    compile_cache = venv.compile_cache()
    return {
        # the models are local directories; nothing may be fetched from a hub
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        # vLLM's CPU default binds OpenMP to core 0 and reserves the rest, so engines started
        # side by side would all run on one core; one unbound thread each suits a tiny model
        "VLLM_CPU_OMP_THREADS_BIND": "nobind",
        "OMP_NUM_THREADS": "1",
        # vLLM's CPU platform turns the one-rank `uni` executor (vLLM's default for one rank,
        # and TINY_SERVE_ARGS') into `mp` unless this is 0, so every boot spawned a worker
        # apart from its engine core: one more interpreter importing torch and vLLM (about
        # 13 s of CPU here), as a GPU's one rank does not. `vllm serve` still runs its engine
        # core in a process of its own (the health tests kill it); explicit `mp` (the two
        # ranks) is left as it is
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        # torch.compile and vLLM caches survive between runs, keyed by the venv
        "VLLM_CACHE_ROOT": str(compile_cache / "vllm"),
        "TORCHINDUCTOR_CACHE_DIR": str(compile_cache / "inductor"),
        "TRITON_CACHE_DIR": str(compile_cache / "triton"),
        "PATH": f"{venv.path / 'bin'}:{os.environ.get('PATH', '')}",
    }


class EngineServer:
    def __init__(self, venv: EngineVenv, model: Path | str, args: Sequence[str] = (),
                 env: Mapping[str, str] | None = None, *, name: str = "engine",
                 argv: Sequence[str] | None = None, port: int | None = None,
                 ready_timeout: float = 900.0, log_dir: Path | None = None,
                 niceness: int = 0):
        self.venv, self.model, self.name = venv, str(model), name
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.argv = list(argv) if argv is not None else [
            str(venv.vllm_command), "serve", self.model, "--host", "127.0.0.1",
            "--port", str(self.port), *args]
        self.env = {**os.environ, **base_env(venv), **(env or {})}
        self.env.pop("VLLM_CPU_KVCACHE_SPACE", None)  # it would override --kv-cache-memory-bytes
        self.ready_timeout = ready_timeout
        self.niceness = niceness
        self.log_path = (log_dir or venv.compile_cache().parent) / f"engine-{name}-{self.port}.log"
        self.process: subprocess.Popen | None = None
        self.started_at: float | None = None
        self.ready_s: float | None = None
        self.served_models: list[str] = []

    # -- lifecycle ---------------------------------------------------------------------
    def start(self) -> EngineServer:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = self.log_path.open("w")
        log.write(f"$ {' '.join(self.argv)}\n")
        log.flush()
        self.started_at = time.monotonic()
        # own process group (the whole tree: API server, engine core, workers) but not
        # its own session: with autogroup scheduling a new session is a new CPU group,
        # and niceness would then not yield to the bench and relay outside it
        command = ["nice", "-n", str(self.niceness), *self.argv] if self.niceness else self.argv
        self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                                        stdin=subprocess.DEVNULL, env=self.env,
                                        process_group=0)
        log.close()
        progress(f"engine {self.name}: starting on {self.url} (log {self.log_path})")
        return self

    def wait_ready(self) -> EngineServer:
        assert self.process is not None and self.started_at is not None, "start() first"
        entered = time.monotonic()
        deadline = self.started_at + self.ready_timeout
        while True:
            if self.process.poll() is not None:
                self.stop()
                raise EngineStartError(self._failure(f"exited with {self.process.returncode} "
                                                     f"before answering"))
            models = self._models()
            if models is not None:
                self.served_models = models
                self.ready_s = time.monotonic() - self.started_at
                note_ready(self.name, time.monotonic() - entered, self.ready_s)
                progress(f"engine {self.name}: ready after {self.ready_s:.0f} s")
                return self
            if time.monotonic() > deadline:
                self.stop()
                raise EngineStartError(self._failure(
                    f"no answer from {self.url}/v1/models within {self.ready_timeout:.0f} s"))
            time.sleep(1.0)

    def stop(self, grace: float = 30.0) -> None:
        """SIGTERM to the process group, SIGKILL after `grace` seconds; idempotent."""
        if self.process is None:
            return
        pgid = self.process.pid
        for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 10.0)):
            try:
                os.killpg(pgid, sig)
            except ProcessLookupError:
                break
            if self._group_gone(pgid, wait, self.process):
                break
        if self.process.poll() is None:
            self.process.wait(timeout=10)

    @staticmethod
    def _group_gone(pgid: int, wait: float, leader: subprocess.Popen) -> bool:
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            # reap the leader once it exits: a zombie still counts as a member of its group
            leader.poll()
            try:
                os.killpg(pgid, 0)
            except ProcessLookupError:
                return True
            time.sleep(0.2)
        return False

    def __enter__(self) -> EngineServer:
        if self.process is None:
            self.start()
        try:
            return self.wait_ready()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- helpers -----------------------------------------------------------------------
    @property
    def model_id(self) -> str:
        if len(self.served_models) != 1:
            raise EngineStartError(f"engine {self.name} serves {self.served_models}")
        return self.served_models[0]

    def _models(self) -> list[str] | None:
        try:
            with urllib.request.urlopen(self.url + "/v1/models", timeout=5) as reply:
                return [m["id"] for m in json.load(reply)["data"]]
        except (urllib.error.URLError, OSError, ValueError, KeyError):
            return None

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        try:
            text = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return "(no log)"
        return "\n".join(text[-lines:])

    def _failure(self, what: str) -> str:
        return (f"engine {self.name} ({' '.join(self.argv[:3])} ...) {what}; "
                f"the last lines of {self.log_path}:\n{self.log_tail()}")

    def metrics_text(self) -> str:
        with urllib.request.urlopen(self.url + "/metrics", timeout=10) as reply:
            return reply.read().decode()


def start_all(servers: Sequence[EngineServer]) -> list[EngineServer]:
    """Start every server at once, then wait for each; on any failure stop them all."""
    try:
        for server in servers:
            server.start()
        for server in servers:
            server.wait_ready()
    except BaseException:
        for server in servers:
            server.stop()
        raise
    return list(servers)
