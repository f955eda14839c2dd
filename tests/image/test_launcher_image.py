"""run.sh and stop.sh with a real Docker engine: two ranks of the stand-in v11 image on this machine.

The worker "node" is reached through tests/fakes/fake-ssh, which runs its commands here,
so both ranks share this engine (and --network host). The image's `vllm` is the fake
server (tests/fakes/fake_vllm.py); everything else -- docker run, inspect, logs, kill,
rm, the readiness wait -- is real.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.image.imagetools import REPO_ROOT, docker

SERVE_LABEL = "label=glm53.launcher=serve"
WORKER = "127.0.0.2"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def serve_containers() -> list[str]:
    return docker("ps", "--all", "--filter", SERVE_LABEL, "--format", "{{.Names}}").stdout.split()


@pytest.fixture
def launcher_env(chain_0300, tmp_path):
    prefix, _, build = chain_0300
    assert build.returncode == 0, build.output
    assert not serve_containers(), "serve containers left over from an earlier run; run ./stop.sh"
    model = tmp_path / "model"
    model.mkdir()
    env = {
        **os.environ,
        "IMAGE": f"{prefix}glm53-sm121-v11",
        "NODES": f"127.0.0.1,{WORKER}",
        "IFACE": "lo",
        "HCA": "standin0",
        "SPEC": "off",
        "MODEL": str(model),
        "HF_CACHE": str(tmp_path / "hf"),
        "PORT": str(free_port()),
        "MASTER_PORT": str(free_port()),
        "SSH": str(REPO_ROOT / "tests" / "fakes" / "fake-ssh"),
        "DOCKER_ARGS": "--init",
        "POLL_SECONDS": "1",
        "READY_TIMEOUT": "120",
        "CLUSTER_ENV": str(tmp_path / "no-cluster.env"),
    }
    yield env
    subprocess.run([str(REPO_ROOT / "stop.sh")], env=env, capture_output=True, check=False, timeout=120)
    for name in serve_containers():
        docker("rm", "--force", name, check=False)


def models(port: str) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=5) as answer:
        return json.load(answer)


def test_two_ranks_start_answer_bench_and_stop(launcher_env, tmp_path):
    started = subprocess.run([str(REPO_ROOT / "run.sh")], env=launcher_env, capture_output=True,
                             text=True, timeout=300, check=False)
    assert started.returncode == 0, started.stdout + started.stderr
    assert "glm53: ready: http://127.0.0.1:" in started.stdout
    assert sorted(serve_containers()) == ["glm53-rank0", "glm53-rank1"]
    assert models(launcher_env["PORT"])["data"][0]["id"]
    worker_argv = docker("inspect", "--format", "{{json .Args}}", "glm53-rank1").stdout
    assert "--headless" in worker_argv and "--node-rank" in worker_argv

    receipt = tmp_path / "bench.json"
    bench = subprocess.run(
        [sys.executable, str(REPO_ROOT / "bench" / "bench_decode.py"), "--url",
         f"http://127.0.0.1:{launcher_env['PORT']}", "--runs", "1", "--concurrency", "1,2",
         "--max-tokens", "20", "--json", str(receipt)],
        capture_output=True, text=True, timeout=300, check=False,
    )
    assert bench.returncode == 0, bench.stdout + bench.stderr
    cells = json.loads(receipt.read_text())["cells"]
    assert [(c["phase"], c["concurrency"]) for c in cells] == [
        ("prose", 1), ("prose", 2), ("structured", 1), ("structured", 2)]
    assert all(c["failed_streams"] == 0 and c["per_stream_tok_s"]["median"] > 0 for c in cells)
    assert all(c["acceptance_length"] is None for c in cells)  # SPEC=off: no drafting

    stopped = subprocess.run([str(REPO_ROOT / "stop.sh")], env=launcher_env, capture_output=True,
                             text=True, timeout=120, check=False)
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    assert serve_containers() == []


def test_a_worker_killed_during_the_wait_stops_everything(launcher_env):
    # Rank 0 takes a minute to "boot", so run.sh is still waiting when the worker dies.
    env = {**launcher_env, "DOCKER_ARGS": "--init --env FAKE_VLLM_STARTUP_SECONDS=60"}
    run = subprocess.Popen([str(REPO_ROOT / "run.sh")], env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while "glm53-rank1" not in docker("ps", "--filter", "status=running", "--format", "{{.Names}}").stdout:
        assert run.poll() is None and time.monotonic() < deadline, "run.sh never started the worker"
        time.sleep(0.5)
    time.sleep(2)
    docker("kill", "glm53-rank1")
    killed_at = time.monotonic()
    try:
        stdout, stderr = run.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        run.send_signal(signal.SIGINT)
        raise
    elapsed = time.monotonic() - killed_at
    assert run.returncode != 0
    assert elapsed < 20, f"run.sh took {elapsed:.1f} s to notice"
    assert f"rank 1 (glm53-rank1 on {WORKER})" in stderr, stderr
    assert serve_containers() == []


def test_a_node_with_another_image_id_is_refused_before_anything_starts(launcher_env, tmp_path):
    # The worker's engine reports another ID for the image (both "nodes" share one
    # engine here, so the worker's docker is a shim that answers that one question).
    shim_dir = tmp_path / "worker-bin"
    shim_dir.mkdir()
    real_docker = subprocess.run(["sh", "-c", "command -v docker"], capture_output=True,
                                 text=True, check=True).stdout.strip()
    shim = shim_dir / "docker"
    shim.write_text(
        "#!/bin/sh\n"
        'if [ "$1 $2" = "image inspect" ]; then echo sha256:' + "0" * 64 + "; exit 0; fi\n"
        f'exec {real_docker} "$@"\n'
    )
    shim.chmod(0o755)
    ssh = tmp_path / "worker-ssh"
    ssh.write_text(
        "#!/bin/sh\n"
        f'PATH={shim_dir}:$PATH exec {REPO_ROOT / "tests" / "fakes" / "fake-ssh"} "$@"\n'
    )
    ssh.chmod(0o755)
    result = subprocess.run([str(REPO_ROOT / "run.sh")], env={**launcher_env, "SSH": str(ssh)},
                            capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode != 0
    assert WORKER in result.stderr.splitlines()[-1], result.stderr
    assert serve_containers() == []
    assert not Path(launcher_env["HF_CACHE"], "glm53-drafters").exists()
