"""scripts/compare end to end on fakes: the real launcher (settings, checks, serve.run, the
readiness wait with the real curl, stop.sh's stop) against tests/fakes/fake-docker, whose
rank containers run tests/fakes/fake_vllm.py as their main process; the bench, the receipts
and the quality gate are the real commands. A fake model's behaviour is its MODEL
directory's (tests/fakes/fake-rank), so `MODEL=...` on a side selects another fake model.

The reference's two boots run once (module fixture); the other cases reuse them with
--reference-from, one boot each.
"""

from __future__ import annotations

import json

import pytest

from tests.compare_cluster import (
    IMAGE,
    IMAGE_ID,
    fake_model,
    fake_rank_command,
    make_cluster,
    report_of,
)
from tests.unit.test_launcher_support import DRAFTER_PIN

# small measurements: the fake's truth does not need long ones
SIZES = ("--concurrency", "1,2", "--runs", "1", "--max-tokens", "32", "--check-tokens", "12",
         "--needle-words", "40")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("compare")
    models = {"same": fake_model(tmp / "models" / "same"),
              "dies": fake_model(tmp / "models" / "dies", ENGINE_DIES_AT_REQUEST="3",
                                 API_OUTLIVES_ENGINE="30"),
              "never-up": fake_model(tmp / "models" / "never-up", ENGINE_DIES_AFTER="0",
                                     API_OUTLIVES_ENGINE="0"),
              # serves the bench as "same" does, and four U+FFFD in every Korean answer
              "corrupt": fake_model(tmp / "models" / "corrupt", ANSWER_FAULTS="mb_replacement")}
    return make_cluster(tmp, fake_rank_command(), MODEL=models["same"]), models


@pytest.fixture(scope="module")
def aa_run(cluster):
    """The identical candidate: three boots of the same settings."""
    the_cluster, _ = cluster
    out = the_cluster.tmp / "aa"
    result = the_cluster.compare("--reference", "", "--candidate", "", "--out", str(out), *SIZES)
    return result, out


def assert_nothing_left(the_cluster) -> None:
    assert the_cluster.containers() == {}
    assert the_cluster.still_running() == []


def test_an_identical_candidate_passes_and_every_boot_is_stopped(cluster, aa_run):
    the_cluster, _ = cluster
    result, out = aa_run
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert lines[-1].startswith("compare: candidate passes the gate and is "), lines[-1]
    assert "at prose c=1" in lines[-1]
    assert any("this is an A/A check" in line for line in lines)
    for boot in ("reference-a", "reference-b", "candidate"):
        assert any(line.startswith("compare: [") and f"{boot}: finished (boot " in line
                   for line in lines), boot
    doc = report_of(out)
    assert doc["verdict"]["exit"] == 0 and doc["differing"] == []
    assert [doc["boots"][b]["status"] for b in ("reference-a", "reference-b", "candidate")] == \
        ["finished"] * 3
    # what each boot served, as the launcher found it (a local MODEL has no revision)
    for record in doc["boots"].values():
        served = record["served"]
        assert (served["image_id"], served["drafter_revision"], served["model_revision"]) == \
            (IMAGE_ID, DRAFTER_PIN, "")
        assert served["recipe_commit"] == "unknown (git is not installed)"  # the sealed PATH
    assert doc["results"]["quality"]["passed"] is True
    assert doc["results"]["lossless"]["judged"] and doc["results"]["lossless"]["passed"]
    speeds = {(r["phase"], r["concurrency"]) for r in doc["results"]["speed"]}
    assert speeds == {(p, c) for p in ("prose", "structured", "code") for c in (1, 2)}
    # the fake drafts k = 7 (run.sh's default), every draft accepted
    assert all(r["acceptance_length"]["candidate"] == 8.0 for r in doc["results"]["speed"])
    assert all(all(v is True for v in by_boot.values())
               for by_boot in doc["results"]["receipts"].values())
    report = (out / "report.md").read_text()
    assert lines[-1] in report and "| prose | 1 |" in report
    # the integrity probes ran on every boot, and passed
    assert doc["results"]["integrity"] == {
        probe: {boot: {"status": "pass", "summary": doc["results"]["integrity"][probe][boot][
            "summary"]} for boot in ("reference-a", "reference-b", "candidate")}
        for probe in ("multibyte", "tool_cycles")}
    for boot in ("reference-a", "reference-b", "candidate"):
        assert doc["boots"][boot]["measurements"]["probes"]["exit"] == 0
        assert json.loads((out / "boots" / boot / "probes.json").read_text())["passed"]
    assert "| multibyte | PASS | PASS | PASS |" in report
    assert (out / "compare.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # three boots through the launcher: three rank starts, each removed again
    starts = [argv for argv in the_cluster.calls() if argv[:2] == ["run", "--detach"]]
    removals = [argv for argv in the_cluster.calls() if argv[:2] == ["rm", "--force"]]
    assert len(starts) == 3 and len(removals) >= 3
    assert_nothing_left(the_cluster)


def test_a_boot_that_dies_midway_is_reported_stopped_and_resumed(cluster, aa_run):
    """The candidate's engine dies at its third request (during the quality gate): the
    report names the boot and why, no rank is left, its log is kept. The model is then
    replaced by one whose distributions differ (same MODEL path, so the same settings) and
    --resume reuses the reference boots, keeps the failed attempt aside, boots the candidate
    again, and fails it with the gate's numbers."""
    the_cluster, models = cluster
    out = the_cluster.tmp / "dies"
    model = models["dies"]
    result = the_cluster.compare("--reference", "", "--candidate", f"MODEL={model}",
                                 "--reference-from", str(aa_run[1]), "--out", str(out), *SIZES)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "reusing the finished boot" in result.stdout
    verdict = result.stdout.splitlines()[-2]
    # the API outlives its engine (30 s here; vLLM's about 4 s): /health is what shows it
    assert verdict.startswith("compare: could not run: boot candidate failed: http://127.0.0.1:"
                              f"{the_cluster.env['PORT']}/health does not answer 200 during the "
                              "quality gate (its rank logs are kept with the boot's files); "
                              "every rank was stopped"), verdict
    assert verdict.endswith("every rank was stopped")
    assert f"scripts/compare --resume {out}" in result.stdout.splitlines()[-1]
    record = report_of(out)["boots"]["candidate"]
    assert record["status"] == "failed" and record["failed_during"] == "quality gate"
    assert record["stopped"] is True
    assert "fake-vllm listening" in (out / "boots" / "candidate" / "glm53-rank0.log").read_text()
    assert "could not run: boot candidate failed" in (out / "report.md").read_text()
    assert_nothing_left(the_cluster)

    fake_model(model, LOGPROB_TILT="0.5")  # rewritten: no death, distributions tilted
    resumed = the_cluster.compare("--resume", str(out))
    assert resumed.returncode == 1, resumed.stdout + resumed.stderr
    assert resumed.stdout.count("reusing the finished boot") == 2
    verdict = resumed.stdout.splitlines()[-1]
    assert verdict.startswith("compare: candidate fails: the quality gate (overall mean KL "), \
        verdict
    assert (out / "boots" / "candidate.attempt-1" / "boot.json").exists()
    doc = report_of(out)
    gate = doc["results"]["quality"]
    assert doc["boots"]["candidate"]["status"] == "finished"
    assert gate["passed"] is False and gate["gate"]["overall"]["kl_mean"] > 0
    assert gate["band"]["overall"]["kl_mean"] == 0
    assert doc["differing"] == ["MODEL"] and doc["results"]["lossless"]["judged"] is False
    assert f"{gate['gate']['overall']['kl_mean']:.3g}" in (out / "report.md").read_text()
    # boots through the launcher so far: the three of the A/A run, the candidate twice
    assert len([a for a in the_cluster.calls() if a[:2] == ["run", "--detach"]]) == 5
    assert_nothing_left(the_cluster)


def test_a_candidate_serving_corrupted_text_fails_on_the_integrity_probes(cluster, aa_run):
    """Its bench, gate and receipts are the reference's; its Korean answers carry U+FFFD."""
    the_cluster, models = cluster
    out = the_cluster.tmp / "corrupt"
    result = the_cluster.compare("--reference", "", "--candidate", f"MODEL={models['corrupt']}",
                                 "--reference-from", str(aa_run[1]), "--out", str(out), *SIZES)
    assert result.returncode == 1, result.stdout + result.stderr
    verdict = result.stdout.splitlines()[-1]
    assert verdict.startswith("compare: candidate fails: the multibyte probe (fail: 0 clean, 11 "
                              "faulty, 0 inconclusive of 11 runs; U+FFFD in the answer by run: "
                              "4, 4, 4, "), verdict
    doc = report_of(out)
    assert doc["verdict"]["failures"] == [verdict.split("fails: ")[1].split("; it is")[0]]
    assert doc["results"]["quality"]["passed"] is True
    assert "| multibyte | PASS | PASS | FAIL |" in (out / "report.md").read_text()
    assert_nothing_left(the_cluster)


def test_a_boot_the_launcher_cannot_bring_up_is_reported(cluster, aa_run):
    the_cluster, models = cluster
    out = the_cluster.tmp / "never-up"
    result = the_cluster.compare("--reference", "", "--candidate",
                                 f"MODEL={models['never-up']}", "--reference-from",
                                 str(aa_run[1]), "--out", str(out), *SIZES)
    assert result.returncode == 2, result.stdout + result.stderr
    verdict = result.stdout.splitlines()[-2]
    assert verdict == ("compare: could not run: boot candidate failed: the launcher did not bring "
                       "it up: rank 0 (glm53-rank0 on 192.0.2.1) is exited before the API "
                       "answered; every rank was stopped"), verdict
    assert_nothing_left(the_cluster)


def test_ranks_already_running_are_refused_and_left_alone(cluster, tmp_path):
    the_cluster, _ = cluster
    head = the_cluster.state / "head.json"
    saved = head.read_text()
    state = json.loads(saved)
    state["containers"]["glm53-rank0"] = {"labels": ["glm53.launcher=serve"],
                                          "status": "running", "argv": [], "inspects": 0}
    head.write_text(json.dumps(state))
    try:
        result = the_cluster.compare("--reference", "", "--candidate", "", "--out",
                                     str(tmp_path / "busy"), *SIZES)
        assert result.returncode == 2
        assert result.stderr.strip() == (
            "refused: scripts/compare: already running: glm53-rank0 on 192.0.2.1; scripts/"
            "compare boots its own ranks: run ./stop.sh first")
        assert "glm53-rank0" in the_cluster.containers()
        assert not (tmp_path / "busy").exists()  # refused before anything was written
    finally:
        head.write_text(saved)


def test_a_rebuilt_image_is_not_compared_with_the_old_boots(cluster, aa_run, tmp_path):
    """The tag now names another image (rebuilt since the reference boots): the candidate's
    boot is ended as soon as it is up, naming both image IDs (issue 35, finding 6)."""
    the_cluster, _ = cluster
    head = the_cluster.state / "head.json"
    saved = head.read_text()
    state = json.loads(saved)
    rebuilt = "sha256:" + "3" * 64
    state["images"][IMAGE]["id"] = rebuilt
    head.write_text(json.dumps(state))
    try:
        result = the_cluster.compare("--reference", "", "--candidate", "", "--reference-from",
                                     str(aa_run[1]), "--out", str(tmp_path / "rebuilt"), *SIZES)
    finally:
        head.write_text(saved)
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stdout.splitlines()[-2] == (
        f"compare: could not run: boot candidate failed: boot candidate served image_id "
        f"{rebuilt} where boot reference-a served {IMAGE_ID} (the settings do not differ there); "
        "start a new comparison")
    assert_nothing_left(the_cluster)
