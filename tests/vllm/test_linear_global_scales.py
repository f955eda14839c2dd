"""v8_linear_scales: vLLM's merged ModelOpt NVFP4 linears honour each shard's global scale
(docs/integrity.md). The layer applies on every pinned tree, then is already applied, and is
refused or found provided by shape. On the trees whose ModelOpt linear is the generic
ModelOptLinearMethod (0.30.0, 0.33.0, 0.34.0), vLLM's own MergedColumnParallelLinear and
QKVParallelLinear, with vLLM's create_weights, process_weights_after_loading and apply around a
float64 stand-in of the kernel (tests/vllm/probes/linear_global_scales.py), give every shard
its checkpoint's output where stock vLLM gives the smaller shards off by kept / own."""

from __future__ import annotations

import json
import os
import shutil
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

from recipekit.layers.v8_linear_scales import HELPER, TARGET
from tests.vllm.conftest import REPO_ROOT, patch_layer, run_python

PROBED_TREES = ("0.30.0", "0.33.0", "0.34.0")
TREES = ("0.27.1", "fork", *PROBED_TREES)
PROBES = REPO_ROOT / "tests/vllm/probes"
EXACT_BOUND = 1e-6  # float64 against float64: the float32 factor's rounding is all that is left


@pytest.fixture(scope="module")
def probed(tmp_path_factory, release):
    # the probes run side by side, each forked from the prewarmed interpreter
    with ThreadPoolExecutor() as probes:
        runs = {}
        for version in PROBED_TREES:
            root = tmp_path_factory.mktemp(f"linear-{version}")
            shutil.copytree(release(version), root, dirs_exist_ok=True, copy_function=os.link)
            code, report, stderr = patch_layer("v8_linear_scales", root, "--import-check", "off")
            assert code == 0 and report["outcome"] == "applied", (version, report, stderr)
            runs[version] = probes.submit(
                run_python, [sys.executable, str(PROBES / "linear_global_scales.py")], cwd=root,
                capture_output=True, text=True, timeout=600,
                env={**os.environ, "PYTHONPATH": f"{root}{os.pathsep}{PROBES}"})
        out = {}
        for version, run in runs.items():
            result = run.result()
            assert result.returncode == 0, (version, result.stderr[-3000:])
            out[version] = json.loads(result.stdout.strip().splitlines()[-1])
    return out


@pytest.mark.parametrize("version", PROBED_TREES)
def test_stock_serves_each_smaller_shard_off_and_the_fix_serves_every_shard_right(
        probed, version):
    for name, doc in probed[version]["cases"].items():
        kept = max(doc["globals"])
        for shard, own in enumerate(doc["globals"]):
            assert doc["fixed"][shard] <= EXACT_BOUND, (name, shard, doc["fixed"])
            if own != kept:  # stock: off by exactly kept / own
                assert doc["stock"][shard] == pytest.approx(kept / own - 1, rel=1e-6)
            else:
                assert doc["stock"][shard] <= EXACT_BOUND
        assert doc["fixed_scaled"] == (len(set(doc["globals"])) > 1)


@pytest.mark.parametrize("version", PROBED_TREES)
def test_the_plants_fail_and_the_fold_would_err_where_the_output_route_does_not(
        probed, version):
    cases = probed[version]["cases"]
    for name in ("gate_up", "qkv"):
        doc = cases[name]
        assert doc["factor_1pct_off"][1] == pytest.approx(0.01, rel=1e-3), name
        assert max(doc["scaled_after_bias"]) > 0.01, name
        assert max(doc["bias_as_the_kernel_holds_it"]) > 0.01, name
        # the fold re-rounds every block scale of a shard whose ratio is not a power of two
        assert max(doc["fold_instead"]) > 0.01, name
    equal = cases["gate_up_equal"]
    assert equal["stock_fixed_bit_identical"] and not equal["fixed_scaled"]


@pytest.mark.parametrize("version", TREES)
def test_applies_then_is_already_applied(tree_copy, version):
    root = tree_copy(version)
    code, report, _ = patch_layer("v8_linear_scales", root, "--import-check", "off")
    assert (code, report["outcome"]) == (0, "applied"), report
    assert sorted(report["files"]) == sorted([TARGET, HELPER])
    source = (root / TARGET).read_text()
    assert "    @scale_shard_outputs\n    def apply(" in source
    assert "    @honour_shard_global_scales\n    def process_weights_after_loading(" in source
    code, report, _ = patch_layer("v8_linear_scales", root, "--import-check", "off")
    assert (code, report["outcome"]) == (0, "already-applied")


def _edit(root, old: str, new: str) -> None:
    path = root / TARGET
    text = path.read_text()
    assert old in text
    path.unlink()  # a hard link into the cache: replace, never write through
    path.write_text(text.replace(old, new))


def test_a_base_that_keeps_neither_the_max_nor_the_warning_is_found_provided(tree_copy):
    root = tree_copy("0.30.0")
    _edit(root, "weight_scale_2.max()", "weight_scale_2.amin()")
    _edit(root, "global weight scale differs across", "shards were reconciled across")
    code, report, _ = patch_layer("v8_linear_scales", root, "--import-check", "off")
    assert (code, report["outcome"]) == (0, "provided-by-base"), report


def test_a_base_that_still_warns_but_keeps_another_global_is_refused(tree_copy):
    root = tree_copy("0.30.0")
    _edit(root, "weight_scale_2.max()", "weight_scale_2.amin()")
    code, report, _ = patch_layer("v8_linear_scales", root, "--import-check", "off")
    assert (code, report["outcome"]) == (3, "refused"), report
    assert "drifted" in report["reason"] and not (root / HELPER).exists()
