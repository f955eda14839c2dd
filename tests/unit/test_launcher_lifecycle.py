"""A real (not DRY_RUN) run.sh and stop.sh against fake docker, ssh and curl on this machine.

Two "nodes": the head's docker calls run directly, the worker's go through
tests/fakes/fake-ssh, and tests/fakes/fake-docker keeps one state file per node, so image
IDs, streaming, container deaths and clean-up can be programmed and checked.
"""

import csv
import json
import os
import stat
import subprocess
import time

from bench import plot
from tests.timing import HANG_GUARD_S
from tests.unit.test_launcher_support import (
    DRAFTER_PIN,
    FAKE_SSH,
    MODEL_PIN,
    NODES,
    REPO,
    launcher_env,
    run,
    sealed_bin,
)

HEAD, WORKER = NODES[0], NODES[1]
IMAGE = "glm53-sm121-v13"  # the default IMAGE
IMAGE_ID = "sha256:" + "1" * 64
FAKE_CURL = """#!/bin/sh
# Answers once FAKE_CURL_READY_AFTER polls were made; never when it is unset. Each poll's
# Unix time goes to curl-times.
date +%s.%N >>"$FAKE_DOCKER_STATE/curl-times"
count_file="$FAKE_DOCKER_STATE/curl-count"
count=$(( $(cat "$count_file" 2>/dev/null || echo 0) + 1 ))
echo "$count" >"$count_file"
[ -n "${FAKE_CURL_READY_AFTER:-}" ] && [ "$count" -ge "$FAKE_CURL_READY_AFTER" ]
"""


def make_cluster(tmp_path, head_images=None, worker_images=None, running=()):
    state = tmp_path / "docker-state"
    state.mkdir()
    images = {IMAGE: {"id": IMAGE_ID, "size": 4096}}
    for node, node_images in (("head", head_images), (WORKER, worker_images)):
        containers = {name: {"labels": ["glm53.launcher=serve"], "status": "running",
                             "argv": [], "inspects": 0}
                      for name in running if node == "head"}
        (state / f"{node}.json").write_text(json.dumps(
            {"images": images if node_images is None else node_images,
             "containers": containers}))
    bin_dir = sealed_bin(tmp_path)
    (bin_dir / "docker").symlink_to(REPO / "tests" / "fakes" / "fake-docker")
    curl = bin_dir / "curl"
    curl.write_text(FAKE_CURL)
    curl.chmod(curl.stat().st_mode | stat.S_IXUSR)
    return state


def plant_meminfo(tmp_path, **gib_by_node):
    """The memory guard's MemAvailable source per node (GLM53_MEMINFO, through fake-ssh for
    workers); every node has 50 GiB unless given. Returns the settings that point there."""
    folder = tmp_path / "meminfo"
    folder.mkdir(exist_ok=True)
    for node in NODES[:2]:
        set_meminfo(folder / node, gib_by_node.get(node, 50))
    return {"FAKE_MEMINFO_DIR": folder, "GLM53_MEMINFO": folder / HEAD}


def plant_swappiness(tmp_path, value="0"):
    """vm.swappiness as every node reports it (GLM53_SWAPPINESS, the preflight's test seam)."""
    path = tmp_path / "swappiness"
    path.write_text(f"{value}\n")
    return path


def set_meminfo(path, gib):
    """Replaces a planted /proc/meminfo at once (a rename), as the kernel's file changes."""
    staged = path.with_suffix(".new")
    staged.write_text(f"MemTotal:       {128 << 20} kB\nMemFree:        1024 kB\n"
                      f"MemAvailable:   {int(gib * (1 << 20))} kB\n")
    staged.replace(path)


def serve(tmp_path, state, popen=False, root=REPO, **settings):
    defaults = {"DRY_RUN": 0, "SSH": str(FAKE_SSH), "FAKE_DOCKER_STATE": state,
                "HF_CACHE": tmp_path / "hf", "POLL_SECONDS": 1, "MODEL_REVISION": MODEL_PIN,
                "DRAFTER_REVISION": DRAFTER_PIN, "JIT_CACHE": tmp_path / "jit",
                "RUNS_DIR": tmp_path / "runs",
                # No boot floor: the memory guard's tests plant low memory (plant_meminfo);
                # tests/unit/test_field_health.py tests the floor.
                "MEM_BOOT_FLOOR_GIB": 0, "GLM53_SWAPPINESS": plant_swappiness(tmp_path),
                # the fake curl answers for no server; test_launcher_selfcheck.py runs the
                # self-check against one
                "SELF_CHECK": 0}
    if "FAKE_MEMINFO_DIR" not in settings:
        defaults.update(plant_meminfo(tmp_path))
    merged = {**defaults, **settings}
    if popen:
        return subprocess.Popen([str(root / "run.sh")], env=launcher_env(tmp_path, **merged),
                                cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)
    return run(tmp_path, root=root, **merged)


def samples(tmp_path):
    """The memory guard's CSV rows of the one run under tmp_path/runs."""
    files = list((tmp_path / "runs").glob("*/memory.csv"))
    if not files:
        return []
    assert len(files) == 1
    with files[0].open() as handle:
        return list(csv.DictReader(handle))


def containers(state, node):
    return json.loads((state / f"{node}.json").read_text())["containers"]


def calls(state):
    return [json.loads(line) for line in (state / "calls.jsonl").read_text().splitlines()]


def started(state):
    return [call for call in calls(state) if call["argv"][:2] == ["run", "--detach"]]


def test_starts_one_rank_per_node_waits_for_the_api_and_stop_removes_both(tmp_path):
    state = make_cluster(tmp_path)
    result = serve(tmp_path, state, FAKE_CURL_READY_AFTER=2,
                   FAKE_PREPARE_STARTUP="incoai/GLM-5.3-Flash-DFlash2 (CC BY-NC-ND 4.0, non-commercial), 5 sliding layers, window 2048")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[-1].startswith(f"glm53: ready: http://{HEAD}:8000/v1 after ")
    startup = [line for line in lines if line.startswith("glm53: model ")]
    assert len(startup) == 1
    assert "drafter incoai/GLM-5.3-Flash-DFlash2 (CC BY-NC-ND 4.0, non-commercial)" in startup[0]
    assert list(containers(state, "head")) == ["glm53-rank0"]
    assert list(containers(state, WORKER)) == ["glm53-rank1"]
    assert [(call["node"], call["argv"][3]) for call in started(state)] == [
        ("head", "glm53-rank0"), (WORKER, "glm53-rank1")]

    stopped = run(tmp_path, script="stop.sh", SSH=str(FAKE_SSH), FAKE_DOCKER_STATE=state, DRY_RUN=0)
    assert stopped.returncode == 0, stopped.stderr
    assert containers(state, "head") == {} and containers(state, WORKER) == {}


def test_a_worker_dying_during_the_wait_stops_every_rank_and_shows_its_log(tmp_path):
    """Judged by the fake Docker's record, not the clock (a loaded machine took 41 s here):
    the launcher stopped at the very status read that said exited, the second, without
    another poll or a wait for READY_TIMEOUT."""
    state = make_cluster(tmp_path)
    result = serve(tmp_path, state, SPEC="off", FAKE_DOCKER_DIE="glm53-rank1:2")
    status_reads = [call["node"] for call in calls(state)
                    if call["argv"][:3] == ["inspect", "--format", "{{.State.Status}}"]
                    and call["argv"][-1] == "glm53-rank1"]
    assert status_reads == [WORKER, WORKER]
    assert "READY_TIMEOUT" not in result.stderr
    assert (f"glm53: rank 1 (glm53-rank1 on {WORKER}) is exited before the API answered; "
            "every rank was stopped") in result.stderr
    assert result.returncode == 1
    assert f"glm53: last 40 log lines of glm53-rank1 on {WORKER}:" in result.stderr
    assert "glm53-rank1 log line 3" in result.stderr
    assert result.stderr.splitlines()[-1] == (
        f"glm53: rank 1 (glm53-rank1 on {WORKER}) is exited before the API answered; "
        "every rank was stopped")
    assert containers(state, "head") == {} and containers(state, WORKER) == {}


def test_a_worker_with_another_image_id_is_refused_before_anything_starts(tmp_path):
    other = {IMAGE: {"id": "sha256:" + "2" * 64, "size": 4096}}
    state = make_cluster(tmp_path, worker_images=other)
    result = serve(tmp_path, state, SPEC="off", FAKE_CURL_READY_AFTER=1)
    assert result.returncode == 2
    assert result.stderr == (
        f"refused: IMAGE={IMAGE}: on {WORKER} it is sha256:{'2' * 64}, on the head {IMAGE_ID}; "
        f"accepted: one image ID on every node (docker rmi it on {WORKER} and rerun to stream "
        "the head's)\n")
    assert started(state) == []


def test_a_worker_without_the_image_gets_the_heads_copy_streamed(tmp_path):
    state = make_cluster(tmp_path, worker_images={})
    result = serve(tmp_path, state, SPEC="off", FAKE_CURL_READY_AFTER=1)
    assert result.returncode == 0, result.stderr
    assert f"glm53: streaming {IMAGE} to {WORKER} (worker 1)" in result.stdout
    assert f"{IMAGE} to {WORKER}: 0.00 GiB" in result.stderr  # the byte counter (no pv here)
    assert json.loads((state / f"{WORKER}.json").read_text())["images"][IMAGE]["id"] == IMAGE_ID
    assert len(started(state)) == 2


def test_a_cluster_already_running_is_refused(tmp_path):
    state = make_cluster(tmp_path, running=["glm53-rank0"])
    result = serve(tmp_path, state, SPEC="off")
    assert result.returncode == 1
    assert result.stderr == f"glm53: already running on {HEAD}: glm53-rank0; run ./stop.sh first\n"
    assert started(state) == []


def test_unpinned_revisions_are_resolved_once_and_recorded(tmp_path):
    state = make_cluster(tmp_path)
    resolved = "fedcba9876543210fedcba9876543210fedcba98"
    result = serve(tmp_path, state, MODEL="someone/other-checkpoint", DRAFTER="dflash2-g",
                   MODEL_REVISION=None, DRAFTER_REVISION=None, FAKE_RESOLVED_SHA=resolved,
                   FAKE_CURL_READY_AFTER=1)
    assert result.returncode == 0, result.stderr
    pins = (tmp_path / "pins.env").read_text().splitlines()
    assert pins == [f"someone/other-checkpoint {resolved}",
                    f"canada-quant/GLM-5.3-Flash-DFlash2-G {resolved}"]
    assert f"glm53: pinned canada-quant/GLM-5.3-Flash-DFlash2-G at {resolved}" in result.stdout
    rank1 = containers(state, WORKER)["glm53-rank1"]["argv"]
    assert rank1[rank1.index("--revision") + 1] == resolved


def test_the_token_reaches_containers_only_as_a_read_only_file(tmp_path):
    state = make_cluster(tmp_path)
    token = tmp_path / "token"
    token.write_text("hf_SECRETVALUE\n")
    result = serve(tmp_path, state, SPEC="off", HF_TOKEN_FILE=token, HF_TOKEN="hf_SECRETVALUE",
                   FAKE_CURL_READY_AFTER=1)
    assert result.returncode == 0, result.stderr
    for call in started(state):
        assert f"type=bind,src={token},dst=/run/secrets/hf_token,readonly" in call["argv"]
        assert "hf_SECRETVALUE" not in json.dumps(call)


def test_no_answer_within_ready_timeout_stops_every_rank(tmp_path):
    state = make_cluster(tmp_path)
    result = serve(tmp_path, state, SPEC="off", READY_TIMEOUT=2)
    assert result.returncode == 1
    assert result.stderr.splitlines()[-1] == (
        "glm53: /health did not answer 200 twice in a row within READY_TIMEOUT=2 s; every rank was stopped")
    assert containers(state, "head") == {} and containers(state, WORKER) == {}


def test_stop_reports_a_node_it_cannot_reach_and_still_cleans_the_others(tmp_path):
    state = make_cluster(tmp_path, running=["glm53-rank0"])
    unreachable = tmp_path / "unreachable-ssh"
    unreachable.write_text("#!/bin/sh\necho 'ssh: connect to host: No route to host' >&2\nexit 255\n")
    unreachable.chmod(unreachable.stat().st_mode | stat.S_IXUSR)
    result = run(tmp_path, script="stop.sh", SSH=str(unreachable), FAKE_DOCKER_STATE=state,
                 DRY_RUN=0)
    assert result.returncode == 1
    assert f"glm53: could not list containers on {WORKER}" in result.stderr
    assert result.stderr.splitlines()[-1] == "glm53: 1 node(s) could not be cleaned; see above"
    assert containers(state, "head") == {}



def test_the_seeds_pins_need_no_hub_lookup(tmp_path):
    state = make_cluster(tmp_path)
    result = serve(tmp_path, state, MODEL_REVISION=None, DRAFTER_REVISION=None,
                   FAKE_CURL_READY_AFTER=1)
    assert result.returncode == 0, result.stderr
    assert not (tmp_path / "pins.env").exists()
    assert not any("model_info" in " ".join(call["argv"]) for call in calls(state))
    rank0 = containers(state, "head")["glm53-rank0"]["argv"]
    assert rank0[rank0.index("--revision") + 1] == "aa28e1f54130286c95fee10d0705c74ce8743734"


# ----------------------------------------------------------------------------- JIT caches


def jit_mounts(state, node):
    mounts = {}
    for name, container in containers(state, node).items():
        argv = container["argv"]
        mounts[name] = [argv[i + 1] for i, word in enumerate(argv)
                        if word == "--mount" and "dst=/var/cache/glm53-jit" in argv[i + 1]]
    return mounts


def test_jit_cache_is_one_directory_per_image_id_kept_by_stop(tmp_path):
    state = make_cluster(tmp_path)
    result = serve(tmp_path, state, SPEC="off", FAKE_CURL_READY_AFTER=1)
    assert result.returncode == 0, result.stderr
    jit = tmp_path / "jit" / IMAGE_ID.removeprefix("sha256:")
    assert f"glm53: JIT cache: {jit} on every node" in result.stdout
    assert jit.is_dir()
    assert jit_mounts(state, "head") == {"glm53-rank0": [f"type=bind,src={jit},dst=/var/cache/glm53-jit"]}
    assert jit_mounts(state, WORKER) == {"glm53-rank1": [f"type=bind,src={jit},dst=/var/cache/glm53-jit"]}
    (jit / "vllm").mkdir()
    (jit / "vllm" / "kernel.bin").write_text("built once")
    stopped = run(tmp_path, script="stop.sh", SSH=str(FAKE_SSH), FAKE_DOCKER_STATE=state, DRY_RUN=0)
    assert stopped.returncode == 0, stopped.stderr
    assert (jit / "vllm" / "kernel.bin").read_text() == "built once"

    # A rebuilt image (same tag, new ID) gets a new directory; the old one stays.
    rebuilt = "sha256:" + "3" * 64
    for node in ("head", WORKER):
        node_state = json.loads((state / f"{node}.json").read_text())
        node_state["images"][IMAGE]["id"] = rebuilt
        (state / f"{node}.json").write_text(json.dumps(node_state))
    again = serve(tmp_path, state, SPEC="off", FAKE_CURL_READY_AFTER=1)
    assert again.returncode == 0, again.stderr
    new_jit = tmp_path / "jit" / ("3" * 64)
    assert new_jit.is_dir() and (jit / "vllm" / "kernel.bin").exists()
    assert jit_mounts(state, WORKER) == {"glm53-rank1": [f"type=bind,src={new_jit},dst=/var/cache/glm53-jit"]}


# ----------------------------------------------------------------------------- memory guard

PROFILE_LOG = "INFO 10-01 12:00:00 [gpu_model_runner.py:5417] Model loading took 45.31 GiB memory and 301.5 seconds"


def test_memory_guard_is_silent_without_a_dip_and_writes_samples(tmp_path):
    state = make_cluster(tmp_path)
    before = time.time()
    result = serve(tmp_path, state, SPEC="off", FAKE_CURL_READY_AFTER=3, FAKE_DOCKER_LOG=PROFILE_LOG)
    after = time.time()
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    assert "memory guard: MemAvailable every 0.250 s on 192.0.2.1 192.0.2.2" in result.stdout
    rows = samples(tmp_path)
    assert list(rows[0]) == ["time_unix", "elapsed_s", "node", "phase", "mem_available_bytes",
                             "floor_bytes"]
    assert {row["node"] for row in rows} == {HEAD, WORKER}
    assert {row["phase"] for row in rows} <= {"load", "profile"} and rows[-1]["phase"] == "profile"
    assert {row["mem_available_bytes"] for row in rows} == {str(50 << 30)}
    floors = {row["phase"]: row["floor_bytes"] for row in rows}
    assert floors["profile"] == str(8 << 30)
    # About four samples a second per node over the ~2 s wait.
    per_node = sum(row["node"] == WORKER for row in rows)
    assert 4 <= per_node <= 40, per_node
    # Each node's reader appends its own rows, so time runs forward per node (two readers'
    # rows may interleave a sample apart); stamps are Unix time, taken during the run.
    for node in (HEAD, WORKER):
        times = [float(row["time_unix"]) for row in rows if row["node"] == node]
        assert times == sorted(times) and before <= times[0] and times[-1] <= after


def test_memory_guard_stops_every_rank_when_a_node_dips_under_the_phase_floor(tmp_path):
    state = make_cluster(tmp_path)
    meminfo = plant_meminfo(tmp_path)
    process = serve(tmp_path, state, popen=True, SPEC="off", FAKE_DOCKER_LOG=PROFILE_LOG,
                    **meminfo)
    deadline = time.monotonic() + HANG_GUARD_S
    while not any(row["phase"] == "profile" for row in samples(tmp_path)):
        assert process.poll() is None and time.monotonic() < deadline, process.communicate()
        time.sleep(0.1)
    set_meminfo(meminfo["FAKE_MEMINFO_DIR"] / WORKER, 7.5)  # profile floor: 8 GiB
    dipped = time.monotonic()
    stdout, stderr = process.communicate(timeout=HANG_GUARD_S)
    # Stopped at once, judged by the records: the worker's first sample under the floor is
    # its last, and at most the one API poll under way then began after it (a wait that
    # slept through the guard would poll on). The wall bound only tells this apart from
    # waiting READY_TIMEOUT (7200 s): idle it takes under a second, beside two busy loops
    # at nice 10 it took 5.9 s, so 60 s.
    assert time.monotonic() - dipped < 60
    assert process.returncode == 1
    worker_rows = [row for row in samples(tmp_path) if row["node"] == WORKER]
    first_low = next(i for i, row in enumerate(worker_rows)
                     if int(row["mem_available_bytes"]) < 8 << 30)
    assert first_low == len(worker_rows) - 1, worker_rows[first_low:]
    polls = [float(t) for t in (state / "curl-times").read_text().split()]
    assert sum(t > float(worker_rows[first_low]["time_unix"]) for t in polls) <= 1, polls
    run_dir = next((tmp_path / "runs").iterdir())
    assert stderr.splitlines()[-1] == (
        f"glm53: memory guard: {WORKER} has MemAvailable 7.50 GiB ({int(7.5 * (1 << 30))} bytes), "
        "under the profile floor of 8 GiB; every rank was stopped (containers kept for docker "
        f"logs; logs and samples in {run_dir})")
    # Killed, not removed: the logs stay in Docker and are copied beside the samples.
    assert containers(state, "head")["glm53-rank0"]["status"] == "exited"
    assert containers(state, WORKER)["glm53-rank1"]["status"] == "exited"
    assert PROFILE_LOG in (run_dir / "glm53-rank1.log").read_text()
    assert "glm53-rank0 log line 1" in (run_dir / "glm53-rank0.log").read_text()
    low = [row for row in samples(tmp_path) if int(row["mem_available_bytes"]) < 8 << 30]
    assert low and low[0]["node"] == WORKER and low[0]["phase"] == "profile"
    # The file the guard wrote is the file bench/plot.py draws: the dip is marked on the
    # worker's line, and nothing on the head's.
    figure = plot.memory_figure(plot.load_memory_samples(str(run_dir / "memory.csv")))
    gids = {artist.get_gid() for artist in figure.axes[0].collections}
    assert f"under_floor/{WORKER}" in gids and f"under_floor/{HEAD}" not in gids
    assert plot.main([str(run_dir / "memory.csv")]) == 0 and (run_dir / "memory.png").is_file()


def test_memory_guard_uses_the_floor_of_the_phase_the_logs_reached(tmp_path):
    # 5 GiB is under the load floor (10) but over the kv_ready floor (3): a cluster whose
    # head logged its KV cache size goes on; one still loading is stopped.
    kv_log = PROFILE_LOG + "\nINFO [kv_cache_utils.py:2396] GPU KV cache size: 400,497 tokens"
    state = make_cluster(tmp_path)
    result = serve(tmp_path, state, SPEC="off", FAKE_CURL_READY_AFTER=3, FAKE_DOCKER_LOG=kv_log,
                   **plant_meminfo(tmp_path, **{WORKER: 50, HEAD: 50}))
    assert result.returncode == 0, result.stderr

    loading = tmp_path / "loading"
    loading.mkdir()
    state = make_cluster(loading)
    result = serve(loading, state, SPEC="off", FAKE_CURL_READY_AFTER=30,
                   **plant_meminfo(loading, **{HEAD: 5}))
    assert result.returncode == 1
    assert (f"glm53: memory guard: {HEAD} has MemAvailable 5.00 GiB ({5 << 30} bytes), under the "
            "load floor of 10 GiB;") in result.stderr


def test_memory_guard_fails_closed_when_a_node_cannot_be_sampled(tmp_path):
    state = make_cluster(tmp_path)
    meminfo = plant_meminfo(tmp_path)
    (meminfo["FAKE_MEMINFO_DIR"] / WORKER).write_text("MemTotal: 1 kB\n")  # no MemAvailable
    result = serve(tmp_path, state, SPEC="off", FAKE_CURL_READY_AFTER=30, MEM_PREFLIGHT=0, **meminfo)
    assert result.returncode == 1
    assert (f"glm53: memory guard: lost the MemAvailable samples of {WORKER} (its sampler over "
            "SSH ended or was silent for 10 s; see MEM_GUARD in docs/launcher.md);") in result.stderr


def test_memory_guard_fails_closed_when_a_node_sampler_goes_silent(tmp_path):
    state = make_cluster(tmp_path)
    meminfo = plant_meminfo(tmp_path)
    silent = meminfo["FAKE_MEMINFO_DIR"] / WORKER
    silent.unlink()
    os.mkfifo(silent)  # nobody writes it: the worker's sampler blocks on its first read
    started = time.monotonic()
    try:
        result = serve(tmp_path, state, SPEC="off", FAKE_CURL_READY_AFTER=60, MEM_PREFLIGHT=0, **meminfo)
    finally:
        release_fifo_reader(silent)
    assert result.returncode == 1
    assert (f"glm53: memory guard: lost the MemAvailable samples of {WORKER} (its sampler over "
            "SSH ended or was silent for 10 s; see MEM_GUARD in docs/launcher.md);") in result.stderr
    assert time.monotonic() - started < 40


def release_fifo_reader(path):
    """Ends the "remote" sampler left blocked on PATH: a writer that opens and closes it."""
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
    except OSError:
        pass  # nobody was blocked on it any more
