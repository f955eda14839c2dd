"""v8_moe_scales on every pinned tree: vLLM's ModelOpt NVFP4 fused MoE honours each half's
global scale (docs/integrity.md). The layer applies, is then already applied, and is refused
or found provided by shape; vLLM's own create_weights and process_weights_after_loading, run
on CPU (tests/vllm/probes/moe_global_scales.py), give the kernel the checkpoint's weights
within the fold's bound, where stock vLLM gives the up half off by the planted ratio."""

from __future__ import annotations

import json
import os
import shutil
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

from recipekit.layers.v8_moe_scales import HELPER, TARGET
from tests.vllm.conftest import REPO_ROOT, answered_by, patch_layer, run_python

TREES = ("fork", "0.27.1", "0.30.0", "0.33.0", "0.34.0")
# what the probe runs of vLLM: a tree identical here to an earlier one is answered by its probe
PROBED_PACKAGES = ("vllm/model_executor/layers/fused_moe",
                   "vllm/model_executor/layers/quantization")
PROBE = REPO_ROOT / "tests/vllm/probes/moe_global_scales.py"
RELATIVE_BOUND = 2.0 ** -4  # the probe's: half an E4M3 step


@pytest.fixture(scope="module")
def probed(tmp_path_factory, release):
    """Each distinct tree patched by v8_moe_scales, and the probe's JSON on it (all at once),
    by every tree it answers for (conftest.answered_by)."""
    answering = answered_by(TREES, PROBED_PACKAGES, release)
    # the probes run side by side, each forked from the prewarmed interpreter
    with ThreadPoolExecutor() as probes:
        runs = {}
        for version in dict.fromkeys(answering.values()):  # each answering tree once, in order
            root = tmp_path_factory.mktemp(f"moe-{version}")
            shutil.copytree(release(version), root, dirs_exist_ok=True, copy_function=os.link)
            code, report, stderr = patch_layer("v8_moe_scales", root, "--import-check", "off")
            assert code == 0 and report["outcome"] == "applied", (version, report, stderr)
            runs[version] = probes.submit(
                run_python, [sys.executable, str(PROBE)], cwd=root, capture_output=True, text=True,
                env={**os.environ, "PYTHONPATH": str(root)}, timeout=600)
        out = {}
        for version, run in runs.items():
            result = run.result()
            assert result.returncode == 0, (version, result.stderr[-3000:])
            out[version] = json.loads(result.stdout.strip().splitlines()[-1])
    return {tree: out[answering[tree]] for tree in TREES}


@pytest.mark.parametrize("version", TREES)
def test_stock_vllm_gives_the_up_half_off_by_the_planted_ratio(probed, version):
    doc = probed[version]
    stock = doc["stock"]
    for expert, ratio in enumerate(doc["ratios"]):
        gate_error, up_error = stock["relative_error"][expert]
        gate, up = doc["globals"][expert]
        assert gate_error == 0.0  # the gate's own global: exact
        assert up / gate == pytest.approx(ratio, rel=1e-6)
        # every up block scale times the gate's global: off by exactly gate / up
        assert up_error == pytest.approx(abs(gate / up - 1), rel=1e-9, abs=0), (expert, ratio)
    # beyond what rounding a block scale could explain, the check fails stock vLLM
    assert stock["failing"] == [e for e, r in enumerate(doc["ratios"]) if abs(r - 1) > 0.07]


@pytest.mark.parametrize("version", TREES)
def test_fixed_vllm_gives_the_checkpoints_weights_within_the_folds_bound(probed, version):
    fixed = probed[version]["fixed"]
    assert fixed["failing"] == [] and not any(fixed["outside_bound"])
    for expert, errors in enumerate(fixed["relative_error"]):
        assert max(errors) <= RELATIVE_BOUND, (expert, errors)


@pytest.mark.parametrize("version", TREES)
def test_a_wrong_way_fold_and_a_global_one_percent_off_are_caught(probed, version):
    doc = probed[version]
    # the wrong way round differs from the right way only where a block scale can move
    assert doc["wrong_way"]["failing"] == [
        e for e, r in enumerate(doc["ratios"]) if abs(r - 1) > 0.07]
    assert doc["global_off_1pct"]["failing"] == list(range(len(doc["ratios"])))


@pytest.mark.parametrize("version", TREES)
def test_equal_scales_load_bit_identical_to_stock(probed, version):
    equal = probed[version]["equal_scales"]
    assert equal["stock"] == equal["fixed"]


def test_the_searched_global_errs_no_more_than_max_or_gate(probed):
    """The choice of global, measured on ModelOpt-shaped weights (docs/integrity.md's table):
    the search never errs more than max; the gate's global overflows E4M3 when up > gate."""
    policies = probed["0.30.0"]["policies"]
    ratios = probed["0.30.0"]["ratios"]
    for expert, ratio in enumerate(ratios):
        searched = policies["searched"]["relative_error"][expert]
        assert searched <= policies["max"]["relative_error"][expert] + 1e-12
        assert searched <= policies["gate"]["relative_error"][expert] + 1e-12
        assert policies["max"]["overflow_blocks"][expert] == 0
        if ratio >= 1.3:
            assert policies["gate"]["overflow_blocks"][expert] > 0
    assert max(policies["searched"]["relative_error"]) < 0.02


@pytest.mark.parametrize("version", TREES)
def test_applies_then_is_already_applied(tree_copy, version):
    root = tree_copy(version)
    code, report, _ = patch_layer("v8_moe_scales", root, "--import-check", "off")
    assert (code, report["outcome"]) == (0, "applied")
    assert sorted(report["files"]) == sorted([TARGET, HELPER])
    source = (root / TARGET).read_text()
    assert "    @honour_w13_global_scales\n    def process_weights_after_loading(" in source
    code, report, _ = patch_layer("v8_moe_scales", root, "--import-check", "off")
    assert (code, report["outcome"]) == (0, "already-applied")


GATE_ONLY = "w13_weight_scale_2 = layer.w13_weight_scale_2[:, 0].contiguous()"


def _edit(root, old: str, new: str) -> None:
    path = root / TARGET
    text = path.read_text()
    assert text.count(old) == 1
    path.unlink()  # a hard link into the cache: replace, never write through
    path.write_text(text.replace(old, new))


def test_a_base_that_honours_each_half_is_found_provided(tree_copy):
    root = tree_copy("0.30.0")
    _edit(root, GATE_ONLY, "w13_weight_scale_2 = reconcile(layer).contiguous()")
    _edit(root, '"w1_weight_scale_2 must match w3_weight_scale_2. "', '"reconciled "')
    code, report, _ = patch_layer("v8_moe_scales", root, "--import-check", "off")
    assert (code, report["outcome"]) == (0, "provided-by-base"), report
    assert "#55073" in report["reason"]


def test_a_base_that_still_warns_but_picks_otherwise_is_refused(tree_copy):
    root = tree_copy("0.30.0")
    before = (root / TARGET).read_bytes()
    _edit(root, GATE_ONLY, "w13_weight_scale_2 = layer.w13_weight_scale_2.amax(1)")
    code, report, _ = patch_layer("v8_moe_scales", root, "--import-check", "off")
    assert (code, report["outcome"]) == (3, "refused")
    assert TARGET in report["reason"] and "drifted" in report["reason"]
    assert (root / TARGET).read_bytes() != before and not (root / HELPER).exists()


def test_a_base_without_the_method_is_refused(tree_copy):
    root = tree_copy("0.30.0")
    _edit(root, "class ModelOptNvFp4FusedMoE(", "class RenamedNvFp4FusedMoE(")
    code, report, _ = patch_layer("v8_moe_scales", root, "--import-check", "off")
    assert (code, report["outcome"]) == (3, "refused")
    assert "ModelOptNvFp4FusedMoE.process_weights_after_loading not found" in report["reason"]


EXACT_BOUND = 1e-6  # float64 emulation: only the float32 ratio's rounding (2^-24) is left
PLANT_FLOOR = 1e-3  # a plant must err at least this much on the experts it touches


@pytest.mark.parametrize("version", TREES)
def test_the_exact_route_gives_the_checkpoints_moe_where_the_fold_and_stock_do_not(
        probed, version):
    """Marlin's experts class: the patched method keeps the gate's global and wraps the built
    experts' activation; the fused MoE emulated in float64 on what vLLM handed the kernel,
    Glm5Next's clamp biting, per expert, against float64 of the intended weights."""
    doc = probed[version]
    exact = doc["exact"]
    routes, ratios = exact["routes"], doc["ratios"]
    assert (exact["exact_wrapped"], exact["stock_wrapped"]) == ("UpHalfRatio", "function")
    assert max(routes["exact"]) <= EXACT_BOUND, routes["exact"]
    for expert, ratio in enumerate(ratios):
        if abs(ratio - 1) > 0.07:  # beyond what a fold's rounding could hide: stock is off
            assert routes["stock"][expert] > 0.1, (expert, routes["stock"])
        power_of_two = ratio in (1.0, 2.0, 0.5)
        # the fold re-rounds a block scale unless the ratio is a power of two: 1% or more
        assert (routes["fold"][expert] <= EXACT_BOUND) == power_of_two, (expert, routes["fold"])
    # the ratio on the routing weight instead: not exact once the clamp bites
    assert max(routes["routing_weight"]) > 0.1


@pytest.mark.parametrize("version", TREES)
def test_the_exact_route_s_plants_fail(probed, version):
    routes = probed[version]["exact"]["routes"]
    off = routes["exact_ratio_1pct_off"]  # expert 3's ratio 1% off: that expert alone fails
    assert [e for e, error in enumerate(off) if error > EXACT_BOUND] == [3]
    assert off[3] > PLANT_FLOOR
    assert min(routes["exact_slot_first"]) > PLANT_FLOOR  # rows read slot-first: every expert


@pytest.mark.parametrize("version", TREES)
def test_marlin_takes_the_exact_route_and_every_other_backend_the_fold(probed, version):
    """Each NVFP4 MoE backend's experts classes, from vLLM's own backend table: the exact route
    only where the experts class hands its activation a 16-bit intermediate (Marlin's); B12X,
    FlashInfer's and CUTLASS's kernels fuse the activation, so they fold."""
    routes = probed[version]["routes_by_backend"]
    assert routes["MARLIN"] == {"MarlinExperts": "exact"}, routes
    for backend, classes in routes.items():
        if backend != "MARLIN" and isinstance(classes, dict):
            assert set(classes.values()) == {"fold"}, (backend, classes)
    if "B12X" in routes:
        assert routes["B12X"] == {"B12xExperts": "fold"}, routes["B12X"]


def test_each_tree_is_probed_or_answered_by_one_with_the_same_moe_files(release, tmp_path):
    """0.27.1 shares every MoE and quantization file with the fork-shaped stand-in built on
    it; every other pin has a probe of its own. A copy differing in one byte gets its own."""
    assert answered_by(TREES, PROBED_PACKAGES, release) == {
        "fork": "fork", "0.27.1": "fork", "0.30.0": "0.30.0", "0.33.0": "0.33.0",
        "0.34.0": "0.34.0"}
    moved = tmp_path / "moved"
    shutil.copytree(release("0.27.1"), moved, copy_function=os.link)
    (moved / TARGET).unlink()
    (moved / TARGET).write_text((release("0.27.1") / TARGET).read_text() + "\n")
    trees = {"fork": release("fork"), "moved": moved}
    assert answered_by(("fork", "moved"), PROBED_PACKAGES, trees.get) == {
        "fork": "fork", "moved": "moved"}
