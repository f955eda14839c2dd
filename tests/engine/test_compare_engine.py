"""scripts/compare against real vLLM CPU engines, through the launcher.

The cluster is one node of tests/fakes/fake-docker whose rank containers run a real engine
as their main process (tests/engine/rank_engine.py: run.sh's `vllm serve` argv with the
overrides test_launcher_engine.py documents); scripts/compare, the launcher's run and stop,
the readiness wait (the real curl), the bench, the receipts and the quality gate are the
real ones. Settings, not overrides, make a boot cheap here: MODEL the tier's tiny target,
MAX_MODEL_LEN 4096, KV_CACHE_MEMORY_BYTES 256 MiB, ENFORCE_EAGER=1 (no torch.compile:
test_launcher_engine.py covers it), MAX_NUM_SEQS 8 (the integrity probes' eleven multibyte
answers in two waves, not six), no self-check (tests/compare_cluster.py: compare's probes
ask what it asks, and more), no memory guard or preflight.

Four runs, six boots (about a minute and a half each here):
1. an identical candidate (three boots): passes the gate, lossless and both receipts, and
   fails only the integrity probes, on every boot: the random tiny target writes no tool
   call, and its random byte tokens are no text;
2. the quality tier's INT8 model as the candidate (`MODEL=...`), reusing run 1's reference
   boots (--reference-from), its engine SIGKILLed as the boot becomes ready: reported as the
   candidate's boot, failed during the quality gate, with no rank and no engine process left;
3. --resume of run 2: the reference boots reused, the candidate booted again, and failed on
   the gate's numbers (mean KL and top-1 beyond the A/A band, 0 and 1.0 on CPU);
4. docs/levers.md's line for PROFILE=field-fastest (B12X, NVFP4 target groups, compaction, a
   clock cap), reusing run 1's reference boots: one more boot, judged as run 1's candidate,
   its bench carrying the platform probe at its start and end.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time

import pytest

from tests.compare_cluster import Cluster, make_cluster, report_of
from tests.engine.cache import engine_cache_root, progress
from tests.engine.engine_server import note_ready
from tests.engine.test_quality_engine import int8_model_dir
from tests.unit.test_launcher_support import REPO

pytestmark = pytest.mark.timeout(3600)
# small measurements: the tiny model's speed says nothing about a Spark's
SIZES = ("--concurrency", "1,2", "--runs", "1", "--max-tokens", "24", "--check-tokens", "24",
         "--needle-words", "300")
# how long a run of compare may take before the test calls it hung (five boots in all)
RUN_GUARD_S = 1800


@pytest.fixture(scope="module")
def cluster(engine, models, tmp_path_factory) -> Cluster:
    tmp = tmp_path_factory.mktemp("compare-engine")
    return make_cluster(
        tmp, f"{sys.executable} -m tests.engine.rank_engine", MODEL=models.target,
        MAX_MODEL_LEN=4096, KV_CACHE_MEMORY_BYTES=256 << 20, ENFORCE_EAGER=1,
        MAX_NUM_SEQS=8,
        READY_TIMEOUT=900, PYTHONPATH=REPO, ENGINE_RANK_VENV=engine.path,
        ENGINE_RANK_PATH=os.environ["PATH"], GLM53_ENGINE_CACHE=engine_cache_root())


def shown(result_or_text, out) -> str:
    """What a run printed, and its report (for the log and for docs/compare.md)."""
    text = result_or_text if isinstance(result_or_text, str) else result_or_text.stdout + \
        result_or_text.stderr
    report = (out / "report.md").read_text() if (out / "report.md").exists() else "(no report)"
    return f"{text}\n--- {out / 'report.md'}\n{report}"


def timed(cluster: Cluster, *args: str):
    started = time.monotonic()
    result = cluster.compare(*args, timeout=RUN_GUARD_S)
    return result, time.monotonic() - started


def note_boots(out) -> None:
    """The boots a run of compare made (not those it copied, nor a resumed run's earlier
    attempt), for the tier's boot summary."""
    for record_file in sorted((out / "boots").glob("*/boot.json")):
        record = json.loads(record_file.read_text())
        seen = (out, record.get("started_at"))
        if "boot_s" in record and "copied_from" not in record and seen not in NOTED:
            NOTED.add(seen)
            note_ready(f"{out.name}/{record_file.parent.name}", record["boot_s"],
                       record["boot_s"])


NOTED: set = set()


@pytest.fixture(scope="module")
def aa_run(cluster):
    out = cluster.tmp / "aa"
    result, seconds = timed(cluster, "--reference", "", "--candidate", "", "--out", str(out),
                            *SIZES)
    progress(f"compare, identical candidate: {seconds:.0f} s\n{shown(result, out)}")
    note_boots(out)
    return result, out


def test_an_identical_candidate_passes_all_but_the_integrity_probes(cluster, aa_run):
    result, out = aa_run
    assert result.returncode == 1, shown(result, out)
    verdict = result.stdout.splitlines()[-1]
    doc = report_of(out)
    # the random target fails tool_cycles (no tool call) on every boot; whatever multibyte
    # says of its random bytes, the candidate's failures are the probes' alone
    assert verdict.startswith("compare: candidate fails: the "), verdict
    failures = doc["verdict"]["failures"]
    assert failures and all(f.startswith(("the multibyte probe (", "the tool_cycles probe ("))
                            for f in failures), failures
    integrity = doc["results"]["integrity"]
    assert {boot: r["status"] for boot, r in integrity["tool_cycles"].items()} == {
        "reference-a": "fail", "reference-b": "fail", "candidate": "fail"}
    assert "reference-a's tool_cycles probe: fail: " in " ".join(doc["verdict"]["notes"])
    quality = doc["results"]["quality"]
    assert quality["band"]["overall"]["top1_agreement"] == 1.0
    assert quality["gate"]["overall"]["kl_mean"] <= quality["band"]["overall"]["kl_mean"]
    assert all(r["first_divergence"]["verdict"] == "identical"
               for r in json.loads((out / "boots" / "candidate" / "gate.json").read_text())
               ["prompts"])
    assert doc["results"]["lossless"] == {**doc["results"]["lossless"], "judged": True,
                                          "passed": True}
    # run.sh's k = 7 reaches the engine: the oracle drafter is accepted k + 1
    assert all(r["acceptance_length"][boot] == 8.0 for r in doc["results"]["speed"]
               for boot in ("reference-a", "reference-b", "candidate")
               if r["phase"] == "structured")
    assert all(v is True for by_boot in doc["results"]["receipts"].values()
               for v in by_boot.values())
    assert cluster.containers() == {} and cluster.still_running() == []


@pytest.fixture(scope="module")
def killed_run(cluster, aa_run):
    """The INT8 candidate, its engine SIGKILLed (the rank's whole process group, as the
    kernel's OOM killer or a crash would leave it) as compare says the boot is ready."""
    out = cluster.tmp / "int8"
    started = time.monotonic()
    process = cluster.compare("--reference", "", "--candidate", f"MODEL={int8_model_dir()}",
                              "--reference-from", str(aa_run[1]), "--out", str(out), *SIZES,
                              popen=True)
    lines, killed = [], None
    for line in process.stdout:
        lines.append(line)
        if killed is None and "[3/3] candidate: ready after" in line:
            killed = cluster.main_processes()[-1]["pid"]
            os.killpg(killed, signal.SIGKILL)
    process.wait(timeout=RUN_GUARD_S)
    text = "".join(lines)
    progress(f"compare, candidate killed: {time.monotonic() - started:.0f} s\n{shown(text, out)}")
    note_boots(out)
    return process.returncode, text, out, killed


def test_a_boot_that_dies_midway_is_reported_and_leaves_no_rank_running(cluster, killed_run):
    code, text, out, killed = killed_run
    assert killed is not None, text
    assert code == 2, text
    verdict = text.splitlines()[-2]
    assert verdict.startswith("compare: could not run: boot candidate failed: rank 0 "
                              "(glm53-rank0 on 192.0.2.1) is exited during the quality gate"), \
        verdict
    assert verdict.endswith("every rank was stopped"), verdict
    record = report_of(out)["boots"]["candidate"]
    assert record["status"] == "failed" and record["stopped"] is True
    assert "could not run: boot candidate failed" in (out / "report.md").read_text()
    assert cluster.containers() == {} and cluster.still_running() == []


def test_a_candidate_that_flips_tokens_fails_with_the_gates_numbers(cluster, killed_run):
    """--resume of the killed run: the INT8 candidate boots again and fails the gate."""
    out = killed_run[2]
    result, seconds = timed(cluster, "--resume", str(out))
    progress(f"compare --resume, INT8 candidate: {seconds:.0f} s\n{shown(result, out)}")
    note_boots(out)
    assert result.returncode == 1, shown(result, out)
    assert result.stdout.count("reusing the finished boot") == 2
    verdict = result.stdout.splitlines()[-1]
    assert verdict.startswith("compare: candidate fails: the quality gate (overall mean KL "), \
        verdict
    doc = report_of(out)
    quality = doc["results"]["quality"]
    assert quality["passed"] is False
    assert quality["gate"]["overall"]["kl_mean"] > quality["band"]["overall"]["kl_mean"]
    assert quality["gate"]["overall"]["top1_agreement"] < 1.0
    assert doc["differing"] == ["MODEL"] and doc["results"]["lossless"]["judged"] is False
    assert (out / "boots" / "candidate.attempt-1" / "boot.json").exists()
    assert cluster.containers() == {} and cluster.still_running() == []


# The fake image's labels as layer v8 writes them on a vLLM 0.30.0 base, where it installs
# b12x (MOE_BACKEND=b12x is refused on an image whose labels do not list it)
B12X_LABELS = {"glm53.base.vllm": "0.30.0", "glm53.provided": "",
               "glm53.packages": "flashinfer-python==0.6.18,b12x==1.3.0"}


@pytest.fixture(scope="module")
def fastest_run(cluster, aa_run):
    """docs/levers.md's one line for PROFILE=field-fastest, reusing run 1's reference boots:
    its candidate boots with b12x, NVFP4 target groups, compaction and a clock cap."""
    head = cluster.state / "head.json"
    state = json.loads(head.read_text())
    for image in state["images"].values():
        image["labels"] = B12X_LABELS
    head.write_text(json.dumps(state))
    out = cluster.tmp / "fastest"
    result, seconds = timed(cluster, "--reference", "", "--candidate", "PROFILE=field-fastest",
                            "--reference-from", str(aa_run[1]), "--out", str(out), *SIZES)
    progress(f"compare, PROFILE=field-fastest: {seconds:.0f} s\n{shown(result, out)}")
    note_boots(out)
    return result, out


def test_the_fastest_profiles_line_runs_and_records_the_platform(cluster, fastest_run):
    """The candidate boots with every lever of the profile and is judged like run 1's (only
    the random target's integrity probes fail); each boot's bench carries the platform
    probe at its start and end, compare prints and tabulates it; the clocks the candidate
    locked are reset by its stop."""
    result, out = fastest_run
    assert result.returncode == 1, shown(result, out)
    doc = report_of(out)
    assert set(doc["differing"]) == {"MOE_BACKEND", "TARGET_WEIGHT_FORMAT", "COMPACT_MEMORY",
                                     "GPU_CLOCK_MHZ", "FORCE_UNSAFE_WEIGHTS"}
    assert doc["boots"]["candidate"]["status"] == "finished"
    assert all(f.startswith(("the multibyte probe (", "the tool_cycles probe ("))
               for f in doc["verdict"]["failures"]), doc["verdict"]
    bench = json.loads((out / "boots" / "candidate" / "bench.json").read_text())
    for when in ("start", "end"):
        reading = bench["platform"][when]
        assert reading["measured"] is True, reading
        (node,) = reading["nodes"]
        assert node["via"] == "glm53-rank0" and node["memory"]["available_kib"] > 0
        assert node["bandwidth"]["why"].startswith("no NVIDIA device in this container")
    assert "platform, candidate at the end, 192.0.2.1: bandwidth not measured" in result.stdout
    assert "## Platform (scripts/doctor --platform at each bench's start and end)" in \
        (out / "report.md").read_text()
    state = json.loads((cluster.state / "head.json").read_text())
    assert state.get("compactions") == 1 and state.get("clocks") is None
    started = [c for c in cluster.calls() if c[:2] == ["run", "--detach"]][-1]
    assert started[started.index("--moe-backend") + 1] == "b12x"
    assert cluster.containers() == {} and cluster.still_running() == []
