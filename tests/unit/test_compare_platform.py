"""scripts/compare's platform: each boot's probe readings (its bench's platform block) in the
report, and the verdict's warning when the candidate's read bandwidth leaves the band the
reference boots' own readings span (compare/platform.py)."""

from __future__ import annotations

from compare import platform as compare_platform
from compare import report
from tests.unit.test_compare_verdict import saved_run, verdict_of

PASSING = ("compare: candidate passes the gate and is 10.0% faster at prose c=1 (33.0 against "
           "30.0 tok/s per stream; the reference's two boots differ by 0.0%)")


def test_a_candidate_within_the_reference_band_passes_without_a_warning(tmp_path):
    # the reference's four readings span 240..250 (4.1% of their mean 245): 247 is inside
    run_dir = saved_run(tmp_path, platform={"reference-a": (240.0, 250.0),
                                            "reference-b": (245.0, 245.0),
                                            "candidate": (247.0, 247.0)})
    verdict = verdict_of(run_dir)
    assert verdict.line == PASSING and verdict.notes == []


def test_a_candidate_beyond_the_band_is_warned_in_the_verdict_line(tmp_path):
    run_dir = saved_run(tmp_path, platform={"reference-a": (238.0, 240.0),
                                            "reference-b": (239.0, 241.0),
                                            "candidate": (262.0, 264.0)})
    verdict = verdict_of(run_dir)
    warning = ("192.0.2.1's read bandwidth was 263.0 GB/s on the candidate's boot against 239.5 "
               "on the reference's (+9.8%, beyond the reference boots' own spread of 1.3%): the "
               "platform differed, so the speed is not comparable")
    assert verdict.exit == 0
    assert verdict.line == f"{PASSING}; WARNING: {warning}"
    assert verdict.notes == [f"WARNING: {warning}"]


def test_the_smallest_step_past_the_band_warns(tmp_path):
    """The band is 2.0% (245..250 around 247.5): 2.0% off the mean does not warn, 2.1% does."""
    reference = {"reference-a": (245.0, 250.0), "reference-b": (245.0, 250.0)}
    inside = verdict_of(saved_run(tmp_path / "in", platform={
        **reference, "candidate": (247.5 * 1.0198, 247.5 * 1.0198)}))
    outside = verdict_of(saved_run(tmp_path / "out", platform={
        **reference, "candidate": (247.5 * 0.979, 247.5 * 0.979)}))
    assert "WARNING" not in inside.line
    assert "(-2.1%, beyond the reference boots' own spread of 2.0%)" in outside.line


def test_a_missing_reading_leaves_the_bandwidth_uncompared_with_the_reason(tmp_path):
    verdict = verdict_of(saved_run(tmp_path, platform={"candidate": (None, 250.0)}))
    assert verdict.line == PASSING
    assert verdict.notes == ["platform: no read bandwidth of 192.0.2.1 for candidate at the start; "
                             "bandwidth not compared"]
    no_block = verdict_of(saved_run(tmp_path / "none", platform={
        "reference-a": None, "reference-b": None, "candidate": None}))
    assert no_block.notes == ["platform: no boot's bench recorded a node; bandwidth not compared"]


def test_the_report_shows_each_boots_platform_and_the_bandwidth_table(tmp_path):
    run_dir = saved_run(tmp_path, platform={"reference-a": (238.0, 240.0),
                                            "reference-b": (239.0, 241.0),
                                            "candidate": (262.0, 264.0)})
    from compare import results

    summary = results.summarize(run_dir.path, run_dir.plan)
    text = report.markdown(run_dir.plan, summary, results.decide(summary, run_dir.plan), False)
    assert ("| 192.0.2.1 | 238.0 / 240.0 | 239.0 / 241.0 | 262.0 / 264.0 | 1.3% | +9.8% (beyond "
            "the band) |") in text
    assert "- platform, candidate at the end, 192.0.2.1: read 264.0" in text
    assert compare_platform.lines(summary["platform"])[0] == (
        "platform, reference-a at the start, 192.0.2.1: read 238.0")
