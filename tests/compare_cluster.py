"""scripts/compare against a one-node cluster of tests/fakes/fake-docker whose rank
containers run a real process (FAKE_DOCKER_RUN): tests/fakes/fake-rank's fake vLLM in the
unit tier, a real vLLM engine in the engine tier (tests/engine/rank_engine.py).

Everything between is the launcher's own code: scripts/compare's settings and checks,
serve.run's steps, the readiness wait through the real curl, stop.sh's stop. Shared by the
unit and engine tiers.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from tests.procs import process_stats
from tests.timing import HANG_GUARD_S
from tests.unit.test_launcher_support import DRAFTER_PIN, FAKE_SSH, REPO, launcher_env, sealed_bin

IMAGE = "glm53-sm121-v13"  # the default IMAGE
IMAGE_ID = "sha256:" + "2" * 64
FAKE_RANK = REPO / "tests" / "fakes" / "fake-rank"


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def live_group_members(pgid: int) -> list[int]:
    """Processes of process group PGID that still run (zombies are done)."""
    return [pid for pid, fields in process_stats()
            if int(fields[2]) == pgid and fields[0] not in ("Z", "X")]


@dataclass
class Cluster:
    tmp: Path
    state: Path
    env: dict[str, str]

    def compare(self, *args: str, popen: bool = False, timeout: float = HANG_GUARD_S, **env):
        """scripts/compare ARGS in the cluster's environment (ENV: more settings)."""
        merged = {**self.env, **{k: str(v) for k, v in env.items()}}
        argv = [str(REPO / "scripts" / "compare"), *args]
        if popen:
            return subprocess.Popen(argv, env=merged, cwd=self.tmp, stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, text=True, bufsize=1)
        try:
            return subprocess.run(argv, env=merged, cwd=self.tmp, capture_output=True, text=True,
                                  timeout=timeout, check=False)
        except subprocess.TimeoutExpired as hung:
            raise AssertionError(f"scripts/compare still ran after {timeout} s; its output: "
                                 f"{hung.stdout!r} {hung.stderr!r}") from None

    def containers(self) -> dict:
        path = self.state / "head.json"
        return json.loads(path.read_text())["containers"] if path.exists() else {}

    def main_processes(self) -> list[dict]:
        path = self.state / "main-processes.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

    def still_running(self) -> list[int]:
        """Every process of every rank's main process group that is still alive."""
        return [pid for started in self.main_processes()
                for pid in live_group_members(started["pid"])]

    def calls(self) -> list[list[str]]:
        path = self.state / "calls.jsonl"
        return [json.loads(line)["argv"] for line in path.read_text().splitlines()]


def make_cluster(tmp: Path, rank_command: str, **settings) -> Cluster:
    """One node whose ranks run RANK_COMMAND (FAKE_DOCKER_RUN); SETTINGS: launcher knobs and
    fake programming (a None removes a default)."""
    state = tmp / "docker-state"
    state.mkdir(parents=True)
    (state / "head.json").write_text(json.dumps(
        {"images": {IMAGE: {"id": IMAGE_ID, "size": 4096}}, "containers": {}}))
    bin_dir = sealed_bin(tmp)
    # this interpreter as invoked (its venv, with the bench's packages), not the one it links to
    python = bin_dir / "python3"
    python.unlink()
    python.write_text(f"#!/bin/sh\nexec {sys.executable} \"$@\"\n")
    python.chmod(0o755)
    (bin_dir / "docker").symlink_to(REPO / "tests" / "fakes" / "fake-docker")
    (bin_dir / "curl").symlink_to(shutil.which("curl"))
    defaults = {"DRY_RUN": 0, "SSH": str(FAKE_SSH), "FAKE_DOCKER_STATE": state,
                "FAKE_DOCKER_RUN": rank_command, "HF_CACHE": tmp / "hf",
                "JIT_CACHE": tmp / "jit", "RUNS_DIR": tmp / "runs", "POLL_SECONDS": 1,
                "DRAFTER_REVISION": DRAFTER_PIN, "MEM_GUARD": 0, "MEM_PREFLIGHT": 0,
                "PORT": free_port(), "PINS_FILE": tmp / "pins.env",
                # the fake models are directories of fake-vllm.env, not checkpoints to scan
                "CHECKPOINT_SCAN": "off",
                # compare's integrity probes ask what run.sh's self-check asks, and more;
                # tests/unit/test_launcher_selfcheck.py turns it on
                "SELF_CHECK": 0}
    env = launcher_env(tmp, nodes=1, **{**defaults, **settings})
    env.setdefault("PYTHONDONTWRITEBYTECODE", "1")
    # the sealed environment keeps the test's temporary directory (the engine tier's is
    # removed at its end, with what the ranks' engines leave there)
    if "TMPDIR" in os.environ:
        env.setdefault("TMPDIR", os.environ["TMPDIR"])
    return Cluster(tmp, state, env)


def fake_rank_command() -> str:
    return f"{sys.executable} {FAKE_RANK}"


def fake_model(folder: Path, **behaviour) -> Path:
    """A MODEL directory whose fake vLLM behaves as BEHAVIOUR (FAKE_VLLM_* names without the
    prefix, e.g. LOGPROB_TILT=0.5) says (tests/fakes/fake-rank)."""
    folder.mkdir(parents=True, exist_ok=True)
    settings = {"STEP_SECONDS": "0.003", "TTFT_SECONDS": "0.01", **behaviour}
    (folder / "fake-vllm.env").write_text(
        "".join(f"FAKE_VLLM_{name}={value}\n" for name, value in settings.items()))
    return folder


def report_of(run_dir: Path) -> dict:
    return json.loads((run_dir / "compare.json").read_text())
