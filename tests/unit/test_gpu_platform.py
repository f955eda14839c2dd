"""The GPU tier's platform stage (tests/gpu/platform_probe.py) judged on CPU: the probe's
figure against the card's specification, and the stage failing on a figure a read kernel
cannot give (above the specification: a cache; far under it: not memory) or on none."""

from __future__ import annotations

import json

from tests.gpu import platform_probe as stage

H100 = "NVIDIA H100 80GB HBM3"


def probe(gb_s=None, why="torch sees no CUDA device"):
    return {"bandwidth": {"gb_s": gb_s} if gb_s is not None else {"why": why}}


def test_the_h100s_committed_figure_passes_against_its_specification():
    committed = json.loads(stage.PROBE.parents[1].joinpath(
        "docs", "gpu-results", "platform-h100.json").read_text())
    result = stage.judge(committed["gpu"], "", committed["probe"])
    assert result["passed"] and result["gpu"] == H100 and result["spec_gb_s"] == 3350.0
    assert result["share_of_spec"] == committed["share_of_spec"]


def test_a_figure_outside_the_bounds_fails_with_the_reason():
    assert stage.judge(H100, "", probe(2828.5))["passed"] is True
    above = stage.judge(H100, "", probe(3351.0))
    assert above["passed"] is False
    assert above["why"] == "3351.0 GB/s is 100.0% of the 3350 GB/s specification, outside 60%..100%"
    assert stage.judge(H100, "", probe(2000.0))["passed"] is False   # 59.7%
    assert stage.judge(H100, "", probe(2010.0))["passed"] is True    # 60.0%


def test_no_card_no_specification_or_no_figure_fails():
    assert stage.judge(None, "nvidia-smi did not run", probe(250.0)) == {
        "stage": "platform", "gpu": None, "probe": probe(250.0), "passed": False,
        "why": "nvidia-smi did not run"}
    assert stage.judge("NVIDIA A100", "", probe(1500.0))["why"] == (
        "no specification for 'NVIDIA A100' here (tests/gpu/platform_probe.py SPECS)")
    assert stage.judge("NVIDIA GB10", "", probe())["why"] == (
        "the read bandwidth was not measured: torch sees no CUDA device")
