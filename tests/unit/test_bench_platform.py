"""The bench's platform block: the probe of every rank at the start and the end of a result
(scripts/doctor --platform --json), or why it was not measured, never a made-up value."""

from __future__ import annotations

import json

from bench import bench_decode, platform_state
from tests.fakes import fake_vllm
from tests.unit.test_launcher_lifecycle import HEAD, WORKER, make_cluster
from tests.unit.test_launcher_support import FAKE_SSH, launcher_env
from tests.unit.test_platform_probe import plant_proc


def test_off_records_that_it_was_not_asked():
    assert platform_state.measure("off") == {"measured": False,
                                             "why": "not asked (--platform off)"}


def test_without_cluster_settings_it_says_the_launcher_cannot_reach_the_ranks(tmp_path,
                                                                            monkeypatch):
    monkeypatch.delenv("NODES", raising=False)
    monkeypatch.setenv("CLUSTER_ENV", str(tmp_path / "no-cluster.env"))
    found = platform_state.measure("auto")
    assert found["measured"] is False
    assert found["why"].startswith("the launcher cannot probe the ranks from here: refused: "
                                   "NODES is unset: ")


def test_on_a_cluster_every_node_is_probed(tmp_path, monkeypatch):
    """No rank runs: each node's probe runs in a container of IMAGE (a fake GPU)."""
    state = make_cluster(tmp_path)
    for node in ("head", WORKER):
        plant_proc(tmp_path / "proc" / node)
    env = launcher_env(tmp_path, DRY_RUN=0, SSH=FAKE_SSH, FAKE_DOCKER_STATE=state, FAKE_GPU=1,
                       FAKE_PROC_DIR=tmp_path / "proc", FAKE_TORCH_GB_S=244,
                       RUNS_DIR=tmp_path / "runs")
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    found = platform_state.measure("auto")
    assert found["measured"] is True
    assert [(n["node"], n["bandwidth"]["gb_s"]) for n in found["nodes"]] == [(HEAD, 244.0),
                                                                             (WORKER, 244.0)]
    assert found["nodes"][0]["line"].startswith("read 244.0 GB/s (NVIDIA GB10, 384 MiB buffer)")
    shown = platform_state.lines({"start": found, "end": {"measured": False, "why": "gone"}})
    assert shown[0].startswith(f"platform at the start, {HEAD} (head): read 244.0 GB/s")
    assert shown[2] == "platform at the end: not measured: gone"


def test_a_node_the_probe_could_not_run_on_is_not_measured(tmp_path, monkeypatch):
    state = make_cluster(tmp_path, worker_images={})  # the worker lacks the image
    env = launcher_env(tmp_path, DRY_RUN=0, SSH=FAKE_SSH, FAKE_DOCKER_STATE=state,
                       RUNS_DIR=tmp_path / "runs")
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    found = platform_state.measure("auto")
    assert found["measured"] is False
    assert found["why"] == (f"{WORKER}: the probe failed (Error: Unable to find image "
                            "'glm53-sm121-v13' locally)")


def test_a_result_carries_the_block_at_its_start_and_end(tmp_path, capsys):
    out = tmp_path / "result.json"
    with fake_vllm.spawn("--step-seconds", "0.001") as fake:
        code = bench_decode.main(["--url", fake.url, "--warmup", "0", "--quiet", "--json",
                                  str(out), "--phase", "prose", "--concurrency", "1", "--runs",
                                  "1", "--max-tokens", "4", "--platform", "off"])
    assert code == 0
    off = {"measured": False, "why": "not asked (--platform off)"}
    assert json.loads(out.read_text())["platform"] == {"start": off, "end": off}
    assert capsys.readouterr().out.splitlines()[-2:] == [
        "platform at the start: not measured: not asked (--platform off)",
        "platform at the end: not measured: not asked (--platform off)"]
