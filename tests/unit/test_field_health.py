"""Readiness on /health and the unified-memory preflight, against fakes with known truth.

The server is tests/fakes/fake_vllm.py read by the real curl: it can be told to lose its
engine while its API answers on (as vLLM's does for about 4 s: /v1/models 200, /health
503). The cluster is tests/fakes/fake-docker with two nodes.
"""

import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.fakes import fake_vllm
from tests.timing import HANG_GUARD_S
from tests.unit.test_launcher_lifecycle import HEAD, WORKER, make_cluster, plant_meminfo, serve
from tests.unit.test_launcher_support import FAKE_SSH, REPO, run

CURL = shutil.which("curl")
pytestmark = pytest.mark.needs_tool("curl", "these tests read a real server with curl")


def real_curl(tmp_path):
    curl = tmp_path / "bin" / "curl"
    curl.unlink()
    curl.symlink_to(CURL)


def fresh_cluster(tmp_path, name):
    """A second fake cluster (its own tools and state) under tmp_path/name."""
    folder = tmp_path / name
    folder.mkdir()
    return folder, make_cluster(folder)


def start_fake(*args):
    """fake_vllm on a free port without waiting for /health (it may never be healthy)."""
    process = subprocess.Popen([sys.executable, fake_vllm.__file__, "serve", "glm-5.3-flash",
                                "--host", "127.0.0.1", "--port", "0", *args],
                               stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    line = process.stdout.readline().strip()
    assert line.startswith("fake-vllm listening on "), line
    return process, line.rsplit(":", 1)[1]


def stop_fake(process):
    if process.poll() is None:
        process.terminate()
        process.wait(timeout=10)
    process.stdout.close()


def get(port, path):
    result = subprocess.run([CURL, "--silent", "--output", "/dev/null", "--write-out", "%{http_code}",
                             "--max-time", "2", f"http://127.0.0.1:{port}{path}"],
                            capture_output=True, text=True, check=False)
    return result.stdout


def test_the_fake_loses_its_engine_behind_a_live_model_list():
    """Windows of seconds, not a fixed sleep: each state is read while it holds (two curls
    beside two busy loops at nice 10 take a fraction of the 2 s and 3 s given), and the
    change is waited for, not slept through."""
    process, port = start_fake("--engine-dies-after", "2", "--api-outlives-engine", "3")
    try:
        assert (get(port, "/health"), get(port, "/v1/models")) == ("200", "200")
        deadline = time.monotonic() + HANG_GUARD_S
        while (health := get(port, "/health")) == "200":
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert (health, get(port, "/v1/models")) == ("503", "200")
        assert process.wait(timeout=HANG_GUARD_S) == 1  # then the API server exits, as vLLM's does
    finally:
        stop_fake(process)


def test_the_wait_never_reports_ready_when_the_engine_dies_as_the_api_comes_up(tmp_path):
    state = make_cluster(tmp_path)
    real_curl(tmp_path)
    # The API outlives its engine for as long as both runs take, however loaded the machine.
    process, port = start_fake("--engine-dies-after", "0", "--api-outlives-engine", str(HANG_GUARD_S))
    try:
        result = serve(tmp_path, state, PORT=port, READY_TIMEOUT=4, SPEC="off")
        assert result.returncode != 0
        assert "ready:" not in result.stdout
        assert "/health did not answer 200 twice in a row within READY_TIMEOUT=4 s" in result.stderr
        # The PR-era wait on /v1/models is fooled by the same server.
        folder, other = fresh_cluster(tmp_path, "models")
        real_curl(folder)
        fooled = serve(folder, other, PORT=port, READY_TIMEOUT=4, SPEC="off", READY_CHECK="models")
        assert fooled.returncode == 0 and "ready:" in fooled.stdout, fooled.stderr
    finally:
        stop_fake(process)


def test_a_healthy_server_is_ready_after_two_healthy_polls(tmp_path):
    state = make_cluster(tmp_path)
    real_curl(tmp_path)
    process, port = start_fake()
    try:
        began = time.monotonic()
        result = serve(tmp_path, state, PORT=port, SPEC="off", POLL_SECONDS=2)
        assert result.returncode == 0, result.stderr
        assert "ready:" in result.stdout
        assert time.monotonic() - began >= 2  # the second healthy poll comes a poll later
    finally:
        stop_fake(process)


def test_doctor_reports_the_rank_down_while_the_api_outlives_its_engine(tmp_path):
    """Judged by an order of events, not a 5 s bound (a doctor run takes 1.3 s idle and
    ten times that beside two busy loops at nice 10): the doctor said down from its one
    /health read while the dead engine's API still answered, and before that API exited."""
    state = make_cluster(tmp_path)
    process, port = start_fake("--api-outlives-engine", str(HANG_GUARD_S))
    try:
        started = serve(tmp_path, state, PORT=port, SPEC="off", FAKE_CURL_READY_AFTER=1)
        assert started.returncode == 0, started.stderr
        real_curl(tmp_path)
        settings = {"DRY_RUN": 0, "FAKE_DOCKER_STATE": state, "PORT": port, "SPEC": "off",
                    "SSH": str(FAKE_SSH), **plant_meminfo(tmp_path)}
        assert run(tmp_path, script="scripts/doctor", **settings).returncode == 0  # engine up
        process.send_signal(signal.SIGUSR1)  # the engine core is killed
        result = run(tmp_path, script="scripts/doctor", **settings)
        assert result.returncode == 6, result.stdout
        assert "/health answers 503: the engine is down" in result.stdout
        assert get(port, "/v1/models") == "200"  # what the PR-era doctor read
        assert process.poll() is None  # the API had not gone: /health alone told it down
    finally:
        stop_fake(process)


def test_a_fake_rank_bound_to_a_process_exits_with_it(tmp_path):
    """FAKE_DOCKER_PID (the engine tier's rank whose main process is a real server): the
    container reads running while the process lives, exited once it is gone, a zombie not
    yet reaped included."""
    state = make_cluster(tmp_path, running=("glm53-rank0",))
    process = subprocess.Popen(["sleep", str(HANG_GUARD_S)])
    fake_docker = [sys.executable, str(REPO / "tests" / "fakes" / "fake-docker"), "inspect",
                   "--format", "{{.State.Status}}", "glm53-rank0"]
    env = {"FAKE_DOCKER_STATE": str(state), "FAKE_DOCKER_PID": f"glm53-rank0:{process.pid}"}

    def status():
        return subprocess.run(fake_docker, env=env, capture_output=True, text=True,
                              check=True).stdout.strip()

    try:
        assert status() == "running"
        process.kill()
        deadline = time.monotonic() + HANG_GUARD_S
        while Path(f"/proc/{process.pid}/stat").read_text().rpartition(")")[2].split()[0] != "Z":
            assert time.monotonic() < deadline, "the killed sleep never became a zombie"
            time.sleep(0.01)
        assert status() == "exited"  # a zombie: dead, not yet reaped
    finally:
        process.kill()
        process.wait()
    assert status() == "exited"


# --- memory preflight -------------------------------------------------------------


def test_a_boot_under_the_floor_is_refused_in_one_line(tmp_path):
    state = make_cluster(tmp_path)
    result = serve(tmp_path, state, MEM_BOOT_FLOOR_GIB=60, FAKE_CURL_READY_AFTER=1)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"refused: MEM_BOOT_FLOOR_GIB=60: {HEAD} (head) has only 50.0 GiB available before boot; "
        "free memory, or set FORCE_UNSAFE_BOOT_MEMORY=1 (risk: the host swaps or wedges while "
        "the weights load)"]
    assert json.loads((state / "head.json").read_text())["containers"] == {}  # nothing started
    assert (f"glm53: memory on {HEAD} (head): vm.swappiness 0, MemAvailable 50.0 GiB, other GPU "
            "containers: none") in result.stdout


def test_a_worker_under_the_floor_names_the_worker_and_force_boots(tmp_path):
    state = make_cluster(tmp_path)
    low = plant_meminfo(tmp_path, **{WORKER: 20})
    result = serve(tmp_path, state, FAKE_CURL_READY_AFTER=1, MEM_BOOT_FLOOR_GIB=40, **low)
    assert result.returncode == 2
    assert f"{WORKER} (worker 1) has only 20.0 GiB available before boot" in result.stderr
    folder, other = fresh_cluster(tmp_path, "forced")
    forced = serve(folder, other, FAKE_CURL_READY_AFTER=1, MEM_BOOT_FLOOR_GIB=40,
                   FORCE_UNSAFE_BOOT_MEMORY=1, **low)
    assert forced.returncode == 0, forced.stderr
    assert "booting anyway (FORCE_UNSAFE_BOOT_MEMORY=1)" in forced.stderr


def test_the_preflight_is_off_with_mem_preflight_0(tmp_path):
    state = make_cluster(tmp_path)
    result = serve(tmp_path, state, MEM_BOOT_FLOOR_GIB=60, MEM_PREFLIGHT=0, FAKE_CURL_READY_AFTER=1)
    assert result.returncode == 0, result.stderr
    assert "memory on" not in result.stdout
