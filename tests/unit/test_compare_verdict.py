"""scripts/compare's verdict and report from saved files alone (compare/results.py
and report.py): each rule of the verdict with files made here, whose truth is known."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import prompts
from compare import boot as boots
from compare import report, results
from compare.rundir import BOOTS, Options, RunDir, read_json

PHASES = ("prose", "structured", "code")
QUALITY_PHASES = ("prose", "code", "structured", "needle")


def cell(phase: str, c: int, tok_s: float, accept: float | None = 3.0, failed: int = 0) -> dict:
    figures = {"median": tok_s, "min": tok_s, "max": tok_s}
    return {"phase": phase, "concurrency": c, "per_stream_tok_s": figures,
            "aggregate_tok_s": {k: v * c for k, v in figures.items()},
            "acceptance_length": accept, "failed_streams": failed}


def platform_block(gb_s: tuple[float | None, float | None]) -> dict:
    """The bench's platform block: the probe of one node at the start and the end (None: a
    reading without a GPU)."""
    def reading(value):
        bandwidth = {"gb_s": value} if value is not None else {"why": "torch sees no CUDA device"}
        return {"measured": True, "nodes": [{"node": "192.0.2.1", "role": "head",
                                             "bandwidth": bandwidth, "line": f"read {value}"}]}
    return {"start": reading(gb_s[0]), "end": reading(gb_s[1])}


def bench(speed: float, failed: int = 0, gb_s=(250.0, 250.0)) -> dict:
    return {"schema": "bench_decode/1", "finished_at": "2026-12-03T00:02:00Z",
            "cells": [cell(p, c, speed / c, failed=failed if (p, c) == ("code", 2) else 0)
                      for p in PHASES for c in (1, 2)],
            **({"platform": platform_block(gb_s)} if gb_s is not None else {})}


def totals(kl: float, top1: float) -> dict:
    return {"positions": 96, "kl_mean": kl, "kl_max": kl, "top1_agreement": top1, "imputed": 0}


def divergence(verdict: str = "identical", position: int | None = None) -> dict:
    text = "identical over 24 tokens" if verdict == "identical" else \
        f"{verdict.replace('_', '-')} at position {position}: a vs b"
    return {"verdict": verdict, "position": position, "compared": position or 24, "text": text}


def quality(kind: str, kl: float = 0.0, top1: float = 1.0, band: dict | None = None,
            first: dict[str, dict] | None = None) -> dict:
    doc = {"kind": kind, "overall": totals(kl, top1),
           "phases": {p: totals(kl, top1) for p in QUALITY_PHASES},
           "prompts": [{"phase": p, "kl": [kl] * 24, "top1_disagree_at": [],
                        "first_divergence": (first or {}).get(p, divergence())}
                       for p in QUALITY_PHASES]}
    if band is not None:
        checks = []
        for scope in ("overall", *QUALITY_PHASES):
            got = doc["overall"] if scope == "overall" else doc["phases"][scope]
            limit = band["overall"] if scope == "overall" else band["phases"][scope]
            checks += [{"scope": scope, "metric": "kl_mean", "value": got["kl_mean"],
                        "limit": limit["kl_mean"], "passed": got["kl_mean"] <= limit["kl_mean"]},
                       {"scope": scope, "metric": "top1_agreement", "value": got["top1_agreement"],
                        "limit": limit["top1_agreement"],
                        "passed": got["top1_agreement"] >= limit["top1_agreement"]}]
        doc.update(checks=checks, passed=all(c["passed"] for c in checks))
    return doc


SERVED = {"image_id": "sha256:" + "1" * 64, "recipe_commit": "a" * 40,
          "model_revision": "b" * 40, "drafter_revision": "c" * 40}


def exit_of(doc: dict) -> int:
    """The exit a bench/ tool gives with DOC as its result: 1 for a failed result, else 0."""
    cells = doc.get("cells", [])
    failed = doc.get("passed") is False or any(c.get("failed_streams") for c in cells)
    return 1 if failed else 0


INTEGRITY = ("multibyte", "tool_cycles")
CORRUPT = ("0 clean, 11 faulty, 0 inconclusive of 11 runs; U+FFFD in the answer by run: 4, 9, "
           "8, 0, 0, 0, 0, 0, 0, 0, 0; first: run 1 ko-field: fault: 4 U+FFFD, 0 lone surrogates, "
           "0 control chars in the answer")


def probes_doc(results_by_probe: dict[str, str]) -> dict:
    """bench/probes.py's document with these probes' statuses (each summary says which)."""
    summaries = {"pass": "11 clean", "fail": CORRUPT,
                 "inconclusive": "10 clean, 0 faulty, 1 inconclusive of 11 runs"}
    return {"schema": "probes/1", "passed": set(results_by_probe.values()) == {"pass"},
            "probes": {name: {"passed": status == "pass", "status": status,
                              "summary": summaries.get(status, status), "details": {}}
                       for name, status in results_by_probe.items()}}


def saved_run(tmp_path: Path, speeds=(30.0, 30.0, 33.0), gate_kl=0.0, gate_top1=1.0,
              receipts=None, differing=(), first=None, failed_candidate_streams=0,
              statuses=None, band_kl=0.001, band_top1=0.99, served=None, probes=None,
              platform=None) -> RunDir:
    """A report directory as three finished boots leave it: each owed measurement's record
    (scripts/compare's own list of them, compare/boot.py) and result file. SERVED:
    boot -> fields of what it served that differ from SERVED's. PROBES: (boot, probe) -> status of
    the integrity probes (default pass; None: the boot left no probes.json). PLATFORM: boot ->
    its node's read bandwidth at the bench's start and end (default 250.0 at both; None: a
    bench without the platform block)."""
    plan = {"reference": {"words": "", "values": {}}, "candidate": {"words": "", "values": {}},
            "options": {"concurrency": [1, 2], "runs": 1, "max_tokens": 24, "check_tokens": 24,
                        "needle_words": 300}, "differing": list(differing)}
    run_dir = RunDir.create(tmp_path / "run", plan)
    band = quality("quality-aa", band_kl, band_top1)
    docs = {"record.json": {"kind": "quality-record"}, "band.json": band,
            "gate.json": quality("quality-gate", gate_kl, gate_top1, band, first)}
    for (boot, speed) in zip(BOOTS, speeds):
        folder = run_dir.boot_dir(boot)
        folder.mkdir(parents=True)
        failed = failed_candidate_streams if boot == "candidate" else 0
        docs["bench.json"] = bench(speed, failed, (platform or {}).get(boot, (250.0, 250.0)))
        for receipt in ("solo-vs-concurrent", "resumed-vs-fresh"):
            passed = (receipts or {}).get((boot, receipt), True)
            docs[f"{receipt}.json"] = {"receipt": receipt, "passed": passed}
        statuses_of = {probe: (probes or {}).get((boot, probe), "pass") for probe in INTEGRITY}
        docs["probes.json"] = (probes_doc(statuses_of) if None not in statuses_of.values()
                               else None)
        measured = {}
        owed = boots.measurements(boot, "http://127.0.0.1:8000",
                                  Options.from_json(plan["options"]), run_dir)
        for measurement in owed:
            doc = docs.get(measurement.output, {"passed": True})  # a tool added since
            if doc is not None:  # None: the tool ran and left no file
                (folder / measurement.output).write_text(json.dumps(doc))
            else:
                doc = {}
            measured[measurement.key] = {"exit": exit_of(doc), "file": measurement.output,
                                         "seconds": 1.0}
        status = (statuses or {}).get(boot, "finished")
        run_dir.save_boot(boot, {"boot": boot, "status": status, "settings": "",
                                 "started_at": "2026-12-03T00:00:00Z", "boot_s": 90.0,
                                 "measure_s": 60.0, "wall_s": 150.0, "measurements": measured,
                                 "served": {**SERVED, **(served or {}).get(boot, {})},
                                 **({"why": "rank 0 (glm53-rank0 on 192.0.2.1) is exited during "
                                            "the bench"} if status != "finished" else {})})
    return run_dir


def verdict_of(run_dir: RunDir) -> results.Verdict:
    return results.decide(results.summarize(run_dir.path, run_dir.plan), run_dir.plan)


def test_a_passing_candidate_names_its_speed_against_the_reference_boots(tmp_path):
    verdict = verdict_of(saved_run(tmp_path, speeds=(30.0, 30.6, 33.0)))
    assert verdict.exit == 0
    assert verdict.line == ("compare: candidate passes the gate and is 8.9% faster at prose c=1 "
                            "(33.0 against 30.3 tok/s per stream; the reference's two boots "
                            "differ by 2.0%)")


def test_a_slower_candidate_within_the_reference_spread_still_passes_and_says_so(tmp_path):
    verdict = verdict_of(saved_run(tmp_path, speeds=(30.0, 31.0, 30.2)))
    assert verdict.exit == 0
    assert verdict.line.endswith("is 1.0% slower at prose c=1 (30.2 against 30.5 tok/s per "
                                 "stream; the reference's two boots differ by 3.3%, within that)")


def test_the_gate_failing_fails_the_candidate_and_names_the_checks(tmp_path):
    verdict = verdict_of(saved_run(tmp_path, gate_kl=0.004, gate_top1=0.995, differing=["MODEL"]))
    assert verdict.exit == 1
    assert verdict.line.startswith(
        "compare: candidate fails: the quality gate (overall mean KL 0.004 beyond the band's "
        "0.001; prose mean KL 0.004 beyond the band's 0.001; code mean KL 0.004 beyond the "
        "band's 0.001; structured mean KL 0.004 beyond the band's 0.001; 1 more checks); it is "
        "10.0% faster at prose c=1"), verdict.line
    assert verdict.failures == [verdict.line.split("fails: ")[1].split("; it is")[0]]


def test_top1_under_the_band_fails_alone(tmp_path):
    verdict = verdict_of(saved_run(tmp_path, gate_kl=0.0005, gate_top1=0.98))
    assert verdict.exit == 1
    assert "overall top-1 agreement 0.9800 under the band's 0.9900" in verdict.line


def test_a_receipt_failing_only_on_the_candidate_fails_it(tmp_path):
    verdict = verdict_of(saved_run(tmp_path, receipts={("candidate", "solo-vs-concurrent"): False}))
    assert verdict.exit == 1
    assert verdict.failures == ["the solo-vs-concurrent receipt"]


def test_a_receipt_failing_on_a_reference_boot_too_is_a_note(tmp_path):
    verdict = verdict_of(saved_run(tmp_path, receipts={("candidate", "resumed-vs-fresh"): False,
                                                       ("reference-b", "resumed-vs-fresh"): False}))
    assert verdict.exit == 0
    assert verdict.notes == ["resumed-vs-fresh fails on the candidate and on a reference boot too"]


def test_failed_streams_fail_the_candidate_but_are_a_note_on_a_reference(tmp_path):
    verdict = verdict_of(saved_run(tmp_path, failed_candidate_streams=2))
    assert verdict.exit == 1
    assert verdict.failures == ["the bench (2 failed stream(s) at code c=2)"]


@pytest.mark.parametrize("boot", ["candidate", "reference-a"])
def test_a_cell_the_bench_invalidated_fails_the_candidate_but_is_a_note_on_a_reference(
        tmp_path, boot):
    """A wave the server queued (or a restart) voids the bench's cell: its figures are not
    the speed of c streams, and the verdict says so instead of judging by them."""
    run_dir = saved_run(tmp_path)
    path = run_dir.boot_dir(boot) / "bench.json"
    doc = json.loads(path.read_text())
    why = ("run 1: /metrics showed 2 request(s) waiting after the wave's first token, so the "
           "server ran fewer than 2 streams at once")
    doc["cells"][1].update(invalid=True, invalid_reason=why)  # prose c=2
    path.write_text(json.dumps(doc))
    verdict = verdict_of(run_dir)
    shown = f"prose c=2 invalid: {why}"
    if boot == "candidate":
        assert verdict.exit == 1 and verdict.failures == [f"the bench ({shown})"]
    else:
        assert verdict.exit == 0 and verdict.notes == [f"reference-a's bench: {shown}"]
    summary = results.summarize(run_dir.path, run_dir.plan)
    (row,) = [line for line in report.speed_table(summary, run_dir.plan["options"])
              if line.startswith("| prose | 2 |")]
    assert row.count(" invalid") == 1


@pytest.mark.parametrize("differing, judged", [([], True), (["NUM_SPECULATIVE_TOKENS"], True),
                                               (["SPEC", "ADAPTIVE_VERIFY"], True),
                                               (["MODEL"], False),
                                               (["NUM_SPECULATIVE_TOKENS", "IMAGE"], False)])
def test_lossless_is_judged_only_when_the_sides_differ_in_drafting_alone(tmp_path, differing,
                                                                         judged):
    first = {"code": divergence("differs", 7)}
    verdict = verdict_of(saved_run(tmp_path, differing=differing, first=first))
    summary = results.summarize(tmp_path / "run", read_json(tmp_path / "run" / "compare.json"))
    assert summary["lossless"]["judged"] is judged
    if judged:
        assert verdict.exit == 1
        assert verdict.failures == ["lossless across boots (code: differs at position 7: a vs b)"]
    else:
        assert verdict.exit == 0 and "not only how tokens are drafted" in summary["lossless"]["why"]


def test_a_near_tie_is_not_a_lossless_failure(tmp_path):
    verdict = verdict_of(saved_run(tmp_path, first={"prose": divergence("near_tie", 3)}))
    assert verdict.exit == 0


def test_a_candidate_that_fails_an_integrity_probe_fails_naming_it(tmp_path):
    verdict = verdict_of(saved_run(tmp_path, probes={("candidate", "multibyte"): "fail"}))
    assert verdict.exit == 1
    assert verdict.failures == [f"the multibyte probe (fail: {CORRUPT[:157]}...)"]
    assert verdict.line.startswith("compare: candidate fails: the multibyte probe (fail: 0 clean, "
                                   "11 faulty"), verdict.line


def test_a_candidate_fails_the_integrity_probes_even_when_the_reference_does(tmp_path):
    """The same checkpoint may corrupt on both sides: the candidate still fails, and each
    reference boot that fails is reported."""
    failing = {(boot, "multibyte"): "fail" for boot in BOOTS}
    verdict = verdict_of(saved_run(tmp_path, probes=failing))
    assert verdict.exit == 1 and len(verdict.failures) == 1
    assert verdict.failures[0].startswith("the multibyte probe (fail: ")
    assert [note.split(":")[0] for note in verdict.notes] == [
        "reference-a's multibyte probe", "reference-b's multibyte probe"]


def test_a_reference_that_fails_an_integrity_probe_is_reported_and_the_candidate_judged(tmp_path):
    verdict = verdict_of(saved_run(tmp_path, probes={("reference-a", "tool_cycles"): "fail"}))
    assert verdict.exit == 0 and verdict.failures == []
    assert verdict.notes == [f"reference-a's tool_cycles probe: fail: {CORRUPT[:157]}..."]


@pytest.mark.parametrize("status, what", [("inconclusive", "inconclusive: 10 clean, 0 faulty, "
                                                           "1 inconclusive of 11 runs"),
                                          ("error", "error: error")])
def test_an_integrity_probe_the_candidate_did_not_pass_fails_it(tmp_path, status, what):
    verdict = verdict_of(saved_run(tmp_path, probes={("candidate", "tool_cycles"): status}))
    assert verdict.exit == 1
    assert verdict.failures == [f"the tool_cycles probe ({what})"]


def test_a_candidate_that_left_no_probe_results_cannot_pass(tmp_path):
    verdict = verdict_of(saved_run(tmp_path, probes={("candidate", "tool_cycles"): None}))
    assert verdict.exit == 2
    assert verdict.line == ("compare: could not run: boot candidate: the integrity probes: "
                            "multibyte, tool_cycles left no result (probes.json is missing or "
                            "not JSON)")


def test_a_boot_that_did_not_finish_means_could_not_run(tmp_path):
    verdict = verdict_of(saved_run(tmp_path, statuses={"candidate": "failed"}))
    assert verdict.exit == 2
    assert verdict.line == ("compare: could not run: boot candidate failed: rank 0 (glm53-rank0 "
                            "on 192.0.2.1) is exited during the bench")


def test_the_report_holds_every_table_and_the_picture(tmp_path):
    run_dir = saved_run(tmp_path, gate_kl=0.004, differing=["MODEL"])
    run_dir.plan["reference"]["values"] = {"MODEL": "/models/a"}
    run_dir.plan["candidate"].update(values={"MODEL": "/models/b"}, words="MODEL=/models/b")
    summary = results.summarize(run_dir.path, run_dir.plan)
    verdict = results.decide(summary, run_dir.plan)
    assert report.write(run_dir, summary, verdict) == []
    text = (run_dir.path / "report.md").read_text()
    assert f"**{verdict.line}**" in text
    assert "Settings that differ: `MODEL` /models/a -> /models/b." in text
    assert ("| prose | 1 | 30.0 (30.0) | 30.0 (30.0) | 33.0 (33.0) | +10.0% | 0.0% | "
            "3.00 / 3.00 / 3.00 |") in text
    assert "| overall | 0.001 | 0.004 | 0.9900 | 1.0000 | FAIL |" in text
    assert "| solo-vs-concurrent | PASS | PASS | PASS |" in text
    assert "Lossless across boots: not judged: the candidate changes MODEL" in text
    assert "| multibyte | PASS | PASS | PASS |" in text and "| tool_cycles | PASS | PASS | PASS |" in text
    assert (run_dir.path / "compare.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    saved = read_json(run_dir.path / "compare.json")
    assert saved["verdict"]["exit"] == 1 and saved["results"]["quality"]["passed"] is False


def test_the_report_shows_each_boots_integrity_probes_and_what_failed(tmp_path):
    run_dir = saved_run(tmp_path, probes={("candidate", "multibyte"): "fail",
                                          ("reference-b", "tool_cycles"): "inconclusive"})
    summary = results.summarize(run_dir.path, run_dir.plan)
    report.write(run_dir, summary, results.decide(summary, run_dir.plan))
    text = (run_dir.path / "report.md").read_text()
    assert "| multibyte | PASS | PASS | FAIL |" in text
    assert "| tool_cycles | PASS | INCONCLUSIVE | PASS |" in text
    assert f"- candidate, multibyte: {CORRUPT}" in text
    assert "- reference B, tool_cycles: 10 clean, 0 faulty, 1 inconclusive of 11 runs" in text


# ----------------------------------------------------------------------------- issue 35
# Every measurement a boot owes leaves its result or voids the comparison (finding 4); a band
# wider than the cap is too noisy to judge (finding 5); boots that served different images,
# recipes or revisions are not compared (finding 6).


def test_a_candidate_whose_receipt_files_are_gone_cannot_pass(tmp_path):
    run_dir = saved_run(tmp_path)
    for receipt in ("solo-vs-concurrent", "resumed-vs-fresh"):
        (run_dir.boot_dir("candidate") / f"{receipt}.json").unlink()
    verdict = verdict_of(run_dir)
    assert verdict.exit == 2, verdict.line
    assert verdict.line == ("compare: could not run: boot candidate: the receipt "
                            "solo-vs-concurrent left no result (solo-vs-concurrent.json is "
                            "missing or not JSON); boot candidate: the receipt resumed-vs-fresh "
                            "left no result (resumed-vs-fresh.json is missing or not JSON)")


@pytest.mark.parametrize("boot", ["candidate", "reference-b"])
def test_a_bench_missing_on_any_boot_voids_the_comparison(tmp_path, boot):
    """Not "speed not measured", and not a reference mean of one boot."""
    run_dir = saved_run(tmp_path)
    (run_dir.boot_dir(boot) / "bench.json").unlink()
    verdict = verdict_of(run_dir)
    assert verdict.exit == 2, verdict.line
    assert verdict.line.startswith(f"compare: could not run: boot {boot}: the bench: every "
                                   "phase at c=1,2, 1 runs x 24 tokens left no result "
                                   "(bench.json is missing or not JSON)"), verdict.line


@pytest.mark.parametrize("file, doc, why", [
    ("bench.json", {"schema": "bench_decode/1", "cells": [], "finished_at": None},
     "bench.json: the bench did not finish (no finished_at)"),
    # a cell, but none of those asked: it passed as "speed not measured" (issue 48)
    ("bench.json", {"finished_at": "x", "cells": [{"phase": "x", "concurrency": 9}]},
     "bench.json: no cell for prose c=1, prose c=2, structured c=1, structured c=2, code c=1, "
     "code c=2"),
    ("bench.json", {**bench(30.0), "cells": bench(30.0)["cells"][:-1]},
     "bench.json: no cell for code c=2"),
    ("solo-vs-concurrent.json", {"receipt": "solo-vs-concurrent"},
     "solo-vs-concurrent.json: no passed verdict"),
    ("gate.json", {"kind": "quality-aa"}, "gate.json: kind 'quality-aa', not 'quality-gate'"),
])
def test_a_file_that_is_not_the_tools_result_voids_the_comparison(tmp_path, file, doc, why):
    run_dir = saved_run(tmp_path)
    (run_dir.boot_dir("candidate") / file).write_text(json.dumps(doc))
    verdict = verdict_of(run_dir)
    assert verdict.exit == 2 and verdict.line.endswith(f"left no result ({why})"), verdict.line


def test_the_bench_phases_owed_are_the_ones_the_bench_runs():
    assert boots.BENCH_PHASES == prompts.PHASES


def test_an_exit_that_disagrees_with_the_result_file_voids_the_comparison(tmp_path):
    """A receipt file that says passed from a tool that exited 1 is not a result (a crash
    after writing it, say)."""
    run_dir = saved_run(tmp_path)
    record = run_dir.boot_record("candidate")
    record["measurements"]["solo-vs-concurrent"]["exit"] = 1
    run_dir.save_boot("candidate", record)
    verdict = verdict_of(run_dir)
    assert verdict.exit == 2
    assert verdict.line.endswith("the receipt solo-vs-concurrent left no result "
                                 "(solo-vs-concurrent.json: passed is true but the tool exited "
                                 "1)"), verdict.line


def test_every_owed_measurement_is_owed_by_the_verdict_too(tmp_path, monkeypatch):
    """A measurement added to the boot's list (as the probes are) is owed at once: a boot
    record without it voids the comparison, naming the boot and the tool."""
    run_dir = saved_run(tmp_path)
    listed = boots.measurements

    def with_a_probe(boot, url, options, run_dir):
        return [*listed(boot, url, options, run_dir),
                boots.Measurement("multibyte", "probe multibyte", ("python3", "probes.py"),
                                  "multibyte.json", (0, 1))]

    monkeypatch.setattr(boots, "measurements", with_a_probe)
    verdict = verdict_of(run_dir)
    assert verdict.exit == 2
    assert verdict.line.startswith("compare: could not run: boot reference-a: the probe "
                                   "multibyte did not run (its boot record has no multibyte)"), \
        verdict.line


@pytest.mark.parametrize("band_kl, band_top1, says", [
    (0.02, 1.0, "overall mean KL limit 0.02 is over the cap 0.012"),
    (0.0, 0.95, "overall top-1 agreement limit 0.9500 is under the cap 0.9670"),
])
def test_a_band_wider_than_the_cap_is_too_noisy_to_judge(tmp_path, band_kl, band_top1, says):
    verdict = verdict_of(saved_run(tmp_path, band_kl=band_kl, band_top1=band_top1))
    assert verdict.exit == 2, verdict.line
    assert verdict.line.startswith("compare: could not run: the reference is too noisy to "
                                   f"judge: {says}"), verdict.line


def test_a_band_within_the_cap_judges_as_before(tmp_path):
    verdict = verdict_of(saved_run(tmp_path, band_kl=results.BAND_CAP_KL_MEAN,
                                   band_top1=results.BAND_FLOOR_TOP1_AGREEMENT))
    assert verdict.exit == 0, verdict.line


@pytest.mark.parametrize("boot, field", [("reference-b", "image_id"),
                                         ("candidate", "recipe_commit"),
                                         ("candidate", "model_revision"),
                                         ("reference-a", "drafter_revision")])
def test_boots_that_served_something_else_are_not_compared(tmp_path, boot, field):
    verdict = verdict_of(saved_run(tmp_path, served={boot: {field: "sha256:" + "9" * 64}}))
    assert verdict.exit == 2, verdict.line
    assert f"served {field} " in verdict.line and "sha256:" + "9" * 64 in verdict.line, \
        verdict.line


def test_a_candidate_may_serve_what_its_differing_settings_choose(tmp_path):
    verdict = verdict_of(saved_run(tmp_path, differing=["IMAGE"],
                                   served={"candidate": {"image_id": "sha256:" + "9" * 64}}))
    assert verdict.exit == 0, verdict.line
    verdict = verdict_of(saved_run(tmp_path / "b", differing=["IMAGE"],
                                   served={"reference-b": {"image_id": "sha256:" + "9" * 64}}))
    assert verdict.exit == 2, verdict.line
