"""COMPACT_MEMORY and GPU_CLOCK_MHZ on a real (not DRY_RUN) run.sh, stop.sh and scripts/doctor
--platform against the fakes: two nodes of tests/fakes/fake-docker (the worker through
fake-ssh), whose containers have a GPU (FAKE_GPU: tests/fakes/gpu's torch and
fake-nvidia-smi) and a planted /proc each (FAKE_PROC_DIR)."""

from __future__ import annotations

import json
import subprocess

from launcher.apply import host_levers
from launcher.plan import clock_record
from tests.timing import HANG_GUARD_S
from tests.unit.test_launcher_lifecycle import HEAD, WORKER, calls, make_cluster, serve
from tests.unit.test_launcher_support import FAKE_SSH, REPO, launcher_env, run
from tests.unit.test_platform_probe import plant_proc


def node_state(state, node):
    return json.loads((state / f"{node}.json").read_text())


def gpu_settings(tmp_path, gb_s="250"):
    """A GPU in every fake container, each node's /proc planted."""
    for node in ("head", WORKER):
        plant_proc(tmp_path / "proc" / node)
    return {"FAKE_GPU": 1, "FAKE_PROC_DIR": tmp_path / "proc", "FAKE_TORCH_GB_S": gb_s}


def record(tmp_path):
    return clock_record.read_record(str(tmp_path / "runs"))


def stop(tmp_path, state, **settings):
    return run(tmp_path, script="stop.sh", DRY_RUN=0, SSH=str(FAKE_SSH), FAKE_DOCKER_STATE=state,
               RUNS_DIR=tmp_path / "runs", **settings)


def test_levers_at_start_then_doctor_platform_then_stop(tmp_path):
    """One start with both levers on a GPU: compaction between two probes on every node and
    the clocks locked and recorded, before the ranks start; scripts/doctor --platform probes
    each rank in its container and reads the lock; stop.sh resets the clocks."""
    state = make_cluster(tmp_path)
    gpu = gpu_settings(tmp_path)
    result = serve(tmp_path, state, FAKE_CURL_READY_AFTER=1, COMPACT_MEMORY=1, GPU_CLOCK_MHZ=2150,
                   **gpu)
    assert result.returncode == 0, result.stderr
    assert [node_state(state, node).get("compactions") for node in ("head", WORKER)] == [1, 1]
    assert [node_state(state, node)["clocks"] for node in ("head", WORKER)] == ["2150,2150"] * 2
    assert {address: entry["head"] for address, entry in record(tmp_path).items()} == {
        HEAD: True, WORKER: False}
    lines = result.stdout.splitlines()
    assert f"glm53: GPU clocks on {WORKER} (worker 1): locked at 2150,2150 MHz (recorded in " \
           f"{tmp_path}/runs/gpu-clocks.json; ./stop.sh resets them)" in lines
    for where in (f"{HEAD} (head)", f"{WORKER} (worker 1)"):
        before = lines.index(next(line for line in lines if line.startswith(
            f"glm53: platform on {where} before compaction: ")))
        # the probe after the lock: the SM clock at the lock, the lock's reason
        assert lines[before].startswith(
            f"glm53: platform on {where} before compaction: read 250.0 GB/s (NVIDIA GB10, 384 "
            "MiB buffer); SM 2150 of 3003 MHz, memory n/a, clocks held at user-set values, "
            "clock-event reasons: gpu_idle, applications_clocks_setting; MemAvailable 100.0 GiB; ")
        assert lines[before + 1].startswith(f"glm53: platform on {where} after compaction: read "
                                            "250.0 GB/s")
        assert lines[before + 2] == (f"glm53: memory compaction on {where}: read bandwidth 250.0 "
                                     "-> 250.0 GB/s (+0.0%); free memory in 2 MiB blocks 99% -> "
                                     "99%")
    first_rank = lines.index(next(line for line in lines if line.startswith(
        "glm53: starting rank 0")))
    assert max(at for at, line in enumerate(lines) if "compaction" in line or "locked" in line) \
        < first_rank

    doctor = doctor_platform(tmp_path, state, **gpu)
    assert doctor.returncode == 0, doctor.stderr
    report = doctor.stdout.splitlines()
    assert report[0].startswith(f"doctor: {HEAD} (head): read 250.0 GB/s (NVIDIA GB10, 384 MiB "
                                "buffer); SM 2150 of 3003 MHz")
    assert report[1].startswith(f"doctor: {WORKER} (worker 1): read 250.0 GB/s")
    assert report[2:] == [f"doctor: GPU clocks locked by run.sh: {HEAD} at 2150,2150 MHz, "
                          f"{WORKER} at 2150,2150 MHz",
                          "doctor: platform measured on every node (exit 0)"]
    execs = [call["argv"] for call in calls(state) if call["argv"][:1] == ["exec"]]
    assert execs == [["exec", "-i", "glm53-rank0", "python3", "-"],
                     ["exec", "-i", "glm53-rank1", "python3", "-"]]
    doc = json.loads(doctor_platform(tmp_path, state, "--json", **gpu).stdout)
    assert [(node["node"], node["via"], node["bandwidth"]["gb_s"]) for node in doc["nodes"]] == [
        (HEAD, "glm53-rank0", 250.0), (WORKER, "glm53-rank1", 250.0)]
    assert set(doc["clock_lock"]) == {HEAD, WORKER}

    stopped = stop(tmp_path, state)
    assert stopped.returncode == 0, stopped.stderr
    assert [node_state(state, node)["clocks"] for node in ("head", WORKER)] == [None, None]
    assert f"glm53: GPU clocks on {WORKER}: reset (were locked at 2150,2150 MHz)" in stopped.stdout
    assert not (tmp_path / "runs" / clock_record.RECORD).exists()


def test_a_start_that_fails_after_the_lock_resets_the_clocks(tmp_path):
    """The compaction fails once the clocks are locked: the start stops in one line, and the
    clocks it locked are reset before run.sh exits."""
    state = make_cluster(tmp_path)
    result = serve(tmp_path, state, FAKE_CURL_READY_AFTER=1, GPU_CLOCK_MHZ="1200,2150",
                   COMPACT_MEMORY=1, FAKE_TOOL_FAIL="compact")
    assert result.returncode == 1
    assert result.stderr.splitlines()[-2:] == [
        "glm53: start-up did not finish; resetting the GPU clocks it locked",
        f"glm53: memory compaction failed on {HEAD} (head) (Error: fake compact refused on head); "
        "set COMPACT_MEMORY=0 to start without it"]
    assert f"glm53: GPU clocks on {WORKER}: reset (were locked at 1200,2150 MHz)" in result.stdout
    assert [node_state(state, node)["clocks"] for node in ("head", WORKER)] == [None, None]
    assert record(tmp_path) == {} and node_state(state, "head")["containers"] == {}


def test_a_lock_that_fails_stops_the_start_and_leaves_nothing_locked(tmp_path):
    state = make_cluster(tmp_path)
    result = serve(tmp_path, state, FAKE_CURL_READY_AFTER=1, GPU_CLOCK_MHZ=2150,
                   FAKE_TOOL_FAIL="lock")
    assert result.returncode == 1
    assert f"glm53: locking the GPU clocks at 2150,2150 MHz failed on {HEAD} (head) (Error: fake " \
           "lock refused on head); set GPU_CLOCK_MHZ empty to start without the lock" in \
        result.stderr
    assert record(tmp_path) == {} and node_state(state, "head")["containers"] == {}


def test_a_reset_that_fails_keeps_the_record_for_the_next_stop(tmp_path):
    """A record a run left (as a crash would leave it): a stop whose reset fails keeps it, the
    next stop resets and removes it."""
    state = make_cluster(tmp_path)
    entry = {"mhz": "2150,2150", "image": "glm53-sm121-v13", "docker_args": ["--gpus", "all"]}
    host_levers.write_record(str(tmp_path / "runs"), {HEAD: {"head": True, **entry},
                                                      WORKER: {"head": False, **entry}})
    for node in ("head", WORKER):
        (state / f"{node}.json").write_text(json.dumps({**node_state(state, node),
                                                        "clocks": "2150,2150"}))
    failed = stop(tmp_path, state, FAKE_TOOL_FAIL="reset")
    assert failed.returncode == 1
    assert f"glm53: could not reset the GPU clocks on {HEAD} (Error: fake reset refused on " \
           f"head); they stay recorded in {tmp_path}/runs/gpu-clocks.json" in failed.stderr
    assert set(record(tmp_path)) == {HEAD, WORKER}
    assert stop(tmp_path, state).returncode == 0
    assert record(tmp_path) == {}
    assert [node_state(state, node)["clocks"] for node in ("head", WORKER)] == [None, None]


def test_stop_dry_run_shows_the_reset_of_a_record_a_crash_left(tmp_path):
    host_levers.write_record(str(tmp_path / "runs"), {
        WORKER: {"head": False, "mhz": "2150,2150", "image": "glm53-sm121-v13",
                 "docker_args": ["--gpus", "all"]}})
    result = run(tmp_path, script="stop.sh", RUNS_DIR=tmp_path / "runs")
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-2:] == [
        f"# reset the GPU clocks run.sh locked, on every node {tmp_path}/runs/gpu-clocks.json "
        "lists (each leaves the record once reset)",
        f"ssh -o BatchMode=yes {WORKER} 'docker run --rm --label glm53.launcher=tool --privileged "
        "--network none --gpus all --entrypoint nvidia-smi glm53-sm121-v13 --reset-gpu-clocks'"]


def test_a_record_that_cannot_be_read_stops_stop_in_one_line(tmp_path):
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / clock_record.RECORD).write_text("{")
    result = run(tmp_path, script="stop.sh", RUNS_DIR=tmp_path / "runs")
    assert result.returncode == 1
    assert result.stderr.startswith(f"glm53: cannot read {tmp_path}/runs/gpu-clocks.json (the "
                                    "GPU clocks run.sh locked): ")


# ----------------------------------------------------------------------------- doctor --platform


def doctor_platform(tmp_path, state, *args, **settings):
    """scripts/doctor --platform ARGS on the fake cluster."""
    env = launcher_env(tmp_path, DRY_RUN=0, SSH=str(FAKE_SSH), FAKE_DOCKER_STATE=state,
                       RUNS_DIR=tmp_path / "runs", **settings)
    return subprocess.run([str(REPO / "scripts" / "doctor"), "--platform", *args], env=env,
                          capture_output=True, text=True, cwd=tmp_path, check=False,
                          timeout=HANG_GUARD_S)


def test_doctor_platform_without_ranks_probes_the_image_and_says_what_it_could_not_read(
        tmp_path):
    state = make_cluster(tmp_path)
    result = doctor_platform(tmp_path, state)
    assert result.returncode == 7
    assert result.stdout.splitlines()[0].startswith(
        f"doctor: {HEAD} (head): bandwidth not measured (no NVIDIA device in this container (")
    assert result.stdout.splitlines()[-1] == (
        f"doctor: platform bandwidth not measured on {HEAD}, {WORKER} (exit 7)")
    runs = [call["argv"] for call in calls(state) if call["argv"][:2] == ["run", "--rm"]]
    assert runs and all(argv[argv.index("--entrypoint") + 1:] == ["python3", "glm53-sm121-v13",
                                                                  "-"] for argv in runs)
