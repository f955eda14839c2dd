"""run.sh and stop.sh with a real Docker engine: two ranks of the stand-in v11 image on this machine.

The worker "node" is reached through tests/fakes/fake-ssh, which runs its commands here,
so both ranks share this engine (and --network host). The image's `vllm` is the fake
server (tests/fakes/fake_vllm.py); everything else -- docker run, inspect, logs, kill,
rm, the readiness wait -- is real.
"""

from __future__ import annotations

import csv
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.image.imagetools import REPO_ROOT, docker
from tests.timing import HANG_GUARD_S

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
    # The memory guard reads this instead of /proc/meminfo: this machine's own may be low.
    meminfo = tmp_path / "meminfo"
    meminfo.write_text(f"MemAvailable: {50 << 20} kB\n")
    env = {
        **os.environ,
        "IMAGE": f"{prefix}glm53-sm121-v11",
        "NODES": f"127.0.0.1,{WORKER}",
        "IFACE": "lo",
        "HCA": "standin0",
        "SPEC": "off",
        # The stand-in chain's v11 serves here, so the v13 levers on by default are off.
        "KPOOL_TAIL_FIX": "0",
        "TARGET_WEIGHT_GROUPS_INT8": "none",
        "MODEL": str(model),
        # an empty directory the fake vllm serves: nothing for the checkpoint scan to read
        "CHECKPOINT_SCAN": "off",
        "HF_CACHE": str(tmp_path / "hf"),
        "PORT": str(free_port()),
        "MASTER_PORT": str(free_port()),
        "SSH": str(REPO_ROOT / "tests" / "fakes" / "fake-ssh"),
        "DOCKER_ARGS": "--init",
        "POLL_SECONDS": "1",
        "READY_TIMEOUT": "120",
        "CLUSTER_ENV": str(tmp_path / "no-cluster.env"),
        "GLM53_MEMINFO": str(meminfo),
        # The stand-in nodes report 50 GiB (above); a floor under it keeps the preflight on.
        "MEM_BOOT_FLOOR_GIB": "40",
        "RUNS_DIR": str(tmp_path / "runs"),
        "JIT_CACHE": str(tmp_path / "jit"),
        # API_AUTH=key (the default): the key file the run writes, outside the checkout
        "API_KEY_FILE": str(tmp_path / "api-key"),
    }
    yield env
    subprocess.run([str(REPO_ROOT / "stop.sh")], env=env, capture_output=True, check=False, timeout=120)
    for name in serve_containers():
        docker("rm", "--force", name, check=False)


def inspect(name: str) -> dict:
    return json.loads(docker("inspect", name).stdout)[0]


def jit_dir_of(env: dict, image: str) -> Path:
    return Path(env["JIT_CACHE"], docker("image", "inspect", "--format", "{{.Id}}", image)
                .stdout.strip().removeprefix("sha256:"))


def assert_jit_cache_mounted(env: dict, image: str) -> Path:
    """Both ranks mount JIT_CACHE/<image ID> and point every engine's cache into it."""
    jit = jit_dir_of(env, image)
    assert jit.is_dir()
    for name in ("glm53-rank0", "glm53-rank1"):
        container = inspect(name)
        mounts = {m["Destination"]: m["Source"] for m in container["Mounts"]}
        assert mounts["/var/cache/glm53-jit"] == str(jit)
        assert "VLLM_CACHE_ROOT=/var/cache/glm53-jit/vllm" in container["Config"]["Env"]
        assert "TRITON_CACHE_DIR=/var/cache/glm53-jit/triton" in container["Config"]["Env"]
    return jit


def memory_samples(env: dict) -> list[dict]:
    files = list(Path(env["RUNS_DIR"]).glob("*/memory.csv"))
    if not files:
        return []
    with files[-1].open() as handle:
        return list(csv.DictReader(handle))


def doctor(env: dict, **settings) -> subprocess.CompletedProcess:
    return subprocess.run([str(REPO_ROOT / "scripts" / "doctor")], env={**env, **settings},
                          capture_output=True, text=True, timeout=120, check=False)


def models(port: str, key: str | None = None) -> dict:
    request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/models",
                                     headers={"Authorization": f"Bearer {key}"} if key else {})
    with urllib.request.urlopen(request, timeout=5) as answer:
        return json.load(answer)


def test_two_ranks_start_answer_bench_and_stop(launcher_env, tmp_path):
    started = subprocess.run([str(REPO_ROOT / "run.sh")], env=launcher_env, capture_output=True,
                             text=True, timeout=300, check=False)
    assert started.returncode == 0, started.stdout + started.stderr
    assert "glm53: ready: http://127.0.0.1:" in started.stdout
    assert sorted(serve_containers()) == ["glm53-rank0", "glm53-rank1"]
    # rank 0 got the key from docker's own --env-file, and its env file is gone
    key = Path(launcher_env["API_KEY_FILE"]).read_text().strip()
    assert models(launcher_env["PORT"], key)["data"][0]["id"]
    with pytest.raises(urllib.error.HTTPError) as refused:
        models(launcher_env["PORT"])
    assert refused.value.code == 401
    assert key not in docker("inspect", "--format", "{{json .Args}}", "glm53-rank0").stdout
    worker_argv = docker("inspect", "--format", "{{json .Args}}", "glm53-rank1").stdout
    assert "--headless" in worker_argv and "--node-rank" in worker_argv
    worker = inspect("glm53-rank1")
    assert worker["HostConfig"]["ShmSize"] == 32 << 30
    assert worker["HostConfig"]["CapAdd"] in (["IPC_LOCK"], ["CAP_IPC_LOCK"])
    assert "VLLM_HOST_IP=127.0.0.2" in worker["Config"]["Env"]
    jit = assert_jit_cache_mounted(launcher_env, launcher_env["IMAGE"])
    rows = memory_samples(launcher_env)  # the fake boots in about a second: a few rows
    assert rows and {row["node"] for row in rows} <= {"127.0.0.1", WORKER}
    assert all(int(row["mem_available_bytes"]) == 50 << 30 for row in rows)

    receipt = tmp_path / "bench.json"
    bench = subprocess.run(
        [sys.executable, str(REPO_ROOT / "bench" / "bench_decode.py"), "--url",
         f"http://127.0.0.1:{launcher_env['PORT']}", "--runs", "1", "--concurrency", "1,2",
         "--max-tokens", "20", "--api-key-file", launcher_env["API_KEY_FILE"],
         "--json", str(receipt)],
        capture_output=True, text=True, timeout=300, check=False,
    )
    assert bench.returncode == 0, bench.stdout + bench.stderr
    cells = json.loads(receipt.read_text())["cells"]
    assert [(c["phase"], c["concurrency"]) for c in cells] == [
        ("prose", 1), ("prose", 2), ("structured", 1), ("structured", 2), ("code", 1),
        ("code", 2)]
    assert all(c["failed_streams"] == 0 and c["per_stream_tok_s"]["median"] > 0 for c in cells)
    assert all(c["acceptance_length"] is None for c in cells)  # SPEC=off: no drafting

    stopped = subprocess.run([str(REPO_ROOT / "stop.sh")], env=launcher_env, capture_output=True,
                             text=True, timeout=120, check=False)
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    assert serve_containers() == []
    assert jit.is_dir()  # stop.sh leaves the JIT cache for the next boot


def test_a_rebuilt_image_gets_a_new_jit_directory(launcher_env, tmp_path):
    rebuilt = launcher_env["IMAGE"] + "-rebuilt"
    build = subprocess.run(
        ["docker", "build", "--tag", rebuilt, "-"], capture_output=True, text=True, check=False,
        input=f"FROM {launcher_env['IMAGE']}\nLABEL glm53.test.rebuilt={tmp_path.name}\n",
        env={**os.environ, "DOCKER_BUILDKIT": "0"}, timeout=300)
    assert build.returncode == 0, build.stdout + build.stderr
    first = subprocess.run([str(REPO_ROOT / "run.sh")], env=launcher_env, capture_output=True,
                           text=True, timeout=300, check=False)
    assert first.returncode == 0, first.stdout + first.stderr
    old_jit = assert_jit_cache_mounted(launcher_env, launcher_env["IMAGE"])
    subprocess.run([str(REPO_ROOT / "stop.sh")], env=launcher_env, capture_output=True,
                   check=True, timeout=120)
    env = {**launcher_env, "IMAGE": rebuilt}
    second = subprocess.run([str(REPO_ROOT / "run.sh")], env=env, capture_output=True,
                            text=True, timeout=300, check=False)
    assert second.returncode == 0, second.stdout + second.stderr
    new_jit = assert_jit_cache_mounted(env, rebuilt)
    assert new_jit != old_jit and old_jit.is_dir()
    assert f"glm53: JIT cache: {new_jit} on every node" in second.stdout


def sigint_as_at_a_terminal() -> None:
    """In the child before run.sh: SIGINT back to its default, as Ctrl-C at a terminal finds
    it. A test run started in the background by a shell without job control (CI, nohup) has
    SIGINT ignored, and an ignored signal stays ignored across exec: run.sh then never saw
    the interrupt and stopped only when READY_TIMEOUT ran out, 120 s later."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_doctor_tells_loading_ready_mismatch_down_and_missing(launcher_env, tmp_path):
    # A boot that never finishes (rank 0 waits 10 minutes to listen): loading; then Ctrl-C.
    env = {**launcher_env, "DOCKER_ARGS": "--init --env FAKE_VLLM_STARTUP_SECONDS=600"}
    run = subprocess.Popen([str(REPO_ROOT / "run.sh")], env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True, preexec_fn=sigint_as_at_a_terminal)
    deadline = time.monotonic() + HANG_GUARD_S
    while len(docker("ps", "--filter", "status=running", "--filter", SERVE_LABEL,
                     "--format", "{{.Names}}").stdout.split()) < 2:
        assert run.poll() is None and time.monotonic() < deadline, "run.sh never started both ranks"
        time.sleep(0.5)
    loading = doctor(env)
    assert loading.returncode == 4, loading.stdout + loading.stderr
    assert loading.stdout.splitlines()[-1] == "doctor: state loading (exit 4)"
    run.send_signal(signal.SIGINT)
    _, stderr = run.communicate(timeout=HANG_GUARD_S)
    # stopped by the interrupt (130), not by READY_TIMEOUT running out (1)
    assert run.returncode == 130, stderr
    assert "start-up did not finish; stopping every rank" in stderr, stderr
    assert serve_containers() == []

    env = launcher_env
    started = subprocess.run([str(REPO_ROOT / "run.sh")], env=env, capture_output=True,
                             text=True, timeout=300, check=False)
    assert started.returncode == 0, started.stdout + started.stderr
    ready = doctor(env)
    assert ready.returncode == 0, ready.stdout + ready.stderr
    assert (f"doctor: API http://127.0.0.1:{env['PORT']}/v1/models answers: model glm-5.3-flash, "
            "max_model_len 327680") in ready.stdout
    assert f"doctor: {WORKER} (worker 1): glm53-rank1 running, image " in ready.stdout

    # The worker's engine reports another image for its rank (both "nodes" share one engine).
    shim_dir = tmp_path / "worker-bin"
    shim_dir.mkdir()
    real_docker = subprocess.run(["sh", "-c", "command -v docker"], capture_output=True,
                                 text=True, check=True).stdout.strip()
    shim = shim_dir / "docker"
    shim.write_text("#!/bin/sh\n"
                    f'if [ "$1" = inspect ]; then {real_docker} "$@" | sed "s/sha256:[0-9a-f]*/sha256:{"0" * 64}/"; exit 0; fi\n'
                    f'exec {real_docker} "$@"\n')
    shim.chmod(0o755)
    ssh = tmp_path / "worker-ssh"
    ssh.write_text(f'#!/bin/sh\nPATH={shim_dir}:$PATH exec {REPO_ROOT / "tests" / "fakes" / "fake-ssh"} "$@"\n')
    ssh.chmod(0o755)
    mismatch = doctor(env, SSH=str(ssh))
    assert mismatch.returncode == 5, mismatch.stdout + mismatch.stderr
    assert f"doctor: {WORKER} (worker 1): image sha256:{'0' * 64} differs from the head's" in mismatch.stdout

    docker("stop", "--time", "5", "glm53-rank1")
    down = doctor(env)
    assert down.returncode == 6, down.stdout + down.stderr
    assert f"doctor: {WORKER} (worker 1): glm53-rank1 is exited" in down.stdout

    subprocess.run([str(REPO_ROOT / "stop.sh")], env=env, capture_output=True, check=True, timeout=120)
    missing = doctor(env)
    assert missing.returncode == 3, missing.stdout + missing.stderr
    assert missing.stdout.splitlines()[-1] == "doctor: state missing (exit 3)"


def test_memory_guard_kills_the_real_ranks_when_a_node_dips(launcher_env, tmp_path):
    meminfo = tmp_path / "meminfo-by-node"
    meminfo.mkdir()
    for node in ("127.0.0.1", WORKER):
        (meminfo / node).write_text(f"MemAvailable: {50 << 20} kB\n")
    env = {**launcher_env, "FAKE_MEMINFO_DIR": str(meminfo),
           "GLM53_MEMINFO": str(meminfo / "127.0.0.1"),
           "DOCKER_ARGS": "--init --env FAKE_VLLM_STARTUP_SECONDS=30 --env FAKE_VLLM_BOOT_LOG=1"}
    run = subprocess.Popen([str(REPO_ROOT / "run.sh")], env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + HANG_GUARD_S
    while not any(row["phase"] == "kv_ready" for row in memory_samples(env)):
        assert run.poll() is None and time.monotonic() < deadline, run.communicate()
        time.sleep(0.2)
    staged = meminfo / "staged"
    staged.write_text(f"MemAvailable: {2 << 20} kB\n")  # 2 GiB, under kv_ready's 3 GiB
    staged.replace(meminfo / WORKER)
    dipped = time.monotonic()
    stdout, stderr = run.communicate(timeout=HANG_GUARD_S)
    elapsed = time.monotonic() - dipped
    assert run.returncode == 1, stdout + stderr
    assert elapsed < 10, f"the guard took {elapsed:.1f} s"
    assert (f"glm53: memory guard: {WORKER} has MemAvailable 2.00 GiB ({2 << 30} bytes), under "
            "the kv_ready floor of 3 GiB; every rank was stopped") in stderr.splitlines()[-1]
    # Killed, kept for their logs, and the logs copied beside the samples.
    states = docker("ps", "--all", "--filter", SERVE_LABEL, "--format", "{{.Names}} {{.State}}").stdout
    assert sorted(states.split("\n")[:-1]) == ["glm53-rank0 exited", "glm53-rank1 exited"]
    run_dir = next(Path(env["RUNS_DIR"]).iterdir())
    assert "GPU KV cache size" in (run_dir / "glm53-rank0.log").read_text()


def test_a_worker_killed_during_the_wait_stops_everything(launcher_env):
    # Rank 0 takes ten minutes to "boot", so run.sh is still waiting when the worker dies
    # however loaded the machine (a minute could run out before the kill beside a CPU hog).
    env = {**launcher_env, "DOCKER_ARGS": "--init --env FAKE_VLLM_STARTUP_SECONDS=600"}
    run = subprocess.Popen([str(REPO_ROOT / "run.sh")], env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + HANG_GUARD_S
    while "glm53-rank1" not in docker("ps", "--filter", "status=running", "--format", "{{.Names}}").stdout:
        assert run.poll() is None and time.monotonic() < deadline, "run.sh never started the worker"
        time.sleep(0.5)
    time.sleep(2)
    docker("kill", "glm53-rank1")
    killed_at = time.monotonic()
    # run.sh's first words on noticing are the dead rank's log; removing the containers
    # afterwards takes this engine (vfs, shared) anywhere from 5 to 20 s more.
    first = run.stderr.readline()
    elapsed = time.monotonic() - killed_at
    try:
        stdout, stderr = run.communicate(timeout=HANG_GUARD_S)
    except subprocess.TimeoutExpired:
        run.send_signal(signal.SIGINT)
        raise
    assert first == f"glm53: last 40 log lines of glm53-rank1 on {WORKER}:\n", first + stderr
    assert elapsed < 20, f"run.sh took {elapsed:.1f} s to notice"
    assert run.returncode != 0
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
