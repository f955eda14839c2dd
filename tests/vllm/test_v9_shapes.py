"""v9 is base-aware: the probed base shape picks its diff, and each shape's DFlash2 is complete.

Shapes (patches/v9/manifest.json): no-logits-cache (0.27.1) and logits-cache (the
fork image, here the fork-shaped stand-in). vLLM's own code runs on CPU torch: its
`_dflash_layer_causal`, and the real speculators `init_speculator` builds.
"""

import json
import os
import shutil
import sys

import pytest

from recipekit.backport import LOGITS_CACHE, SHAPES, generate, load_manifest, sha256_text
from tests.vllm.conftest import REPO_ROOT, patch_layer, run_python, run_script, tree_digest

pytest.importorskip("torch", reason="the vllm tier needs CPU torch 2.13.0 (scripts/test installs it)")


def patch_v9(root, *extra):
    return patch_layer("v9", root, *extra)


@pytest.fixture(scope="module")
def patched(tmp_path_factory, release, diff_dir):
    """{base: tree with v9 applied, its new modules imported on torch}."""
    trees = {}
    for base in ("0.27.1", "fork"):
        root = tmp_path_factory.mktemp(f"v9-{base}") / "tree"
        shutil.copytree(release(base), root, copy_function=os.link)
        code, report, stderr = patch_v9(root, "--diff", str(diff_dir), "--import-check", "on")
        assert code == 0 and report["outcome"] == "applied", (report, stderr)
        assert "2 touched modules import" in report["reason"]
        trees[base] = (root, report)
    return trees


def base_shape_probe(root, *configs):
    result = run_python(
        [sys.executable, str(REPO_ROOT / "tests/vllm/probes/dflash2_base_shape.py"), *map(str, configs)],
        capture_output=True, text=True, timeout=600, check=False,
        env={**os.environ, "PYTHONPATH": str(root), "PYTHONDONTWRITEBYTECODE": "1"},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["vllm_file"].startswith(str(root))
    return report


def test_every_group_names_its_pull_request_and_probe():
    manifest = load_manifest()
    assert set(manifest["diff_sha256"]) == set(SHAPES) == set(manifest["probes"]) == set(manifest["base_shapes"])
    selectors = [s for section in ("shared_files", "companion_files") for f in manifest[section].values() for s in f]
    insertions = [i for f in manifest["recipe_insertions"].values() for i in f]
    for entry in selectors + insertions:
        assert "pr" in entry and entry["why"], entry
        assert entry.get("requires", SHAPES[0]) in SHAPES, entry
    assert sum(s["pr"] == 52816 for s in selectors) >= 15
    assert [i["requires"] for i in insertions] == ["no-logits-cache"]


def test_each_shape_has_its_own_pinned_diff(release, diff_dir):
    manifest = load_manifest()
    for shape in SHAPES:
        text = (diff_dir / f"dflash2-{shape}.diff").read_text()
        assert sha256_text(text) == manifest["diff_sha256"][shape]
        assert generate(release("0.27.1"), release("0.28.0"), manifest, shape) == text
    with_cache = (diff_dir / "dflash2-logits-cache.diff").read_text()
    without = (diff_dir / "dflash2-no-logits-cache.diff").read_text()
    base_speculator = "diff --git a/vllm/v1/worker/gpu/spec_decode/speculator.py "
    assert base_speculator in with_cache and base_speculator not in without
    assert "+            dtype, fill = self.draft_logits_spec(vllm_config)" in with_cache
    assert "draft_sample_method == \"probabilistic\":" in without
    assert "lacks (recipe layer v9" not in with_cache
    for text in (with_cache, without):
        assert '+    is_causal = getattr(config, "is_causal", None)' in text


def test_the_probe_picks_the_diff_and_names_the_shape(patched):
    _, report = patched["fork"]
    assert "base shape logits-cache (probe: gumbel_sample takes logits_cache)" in report["reason"]
    assert "vllm/v1/worker/gpu/spec_decode/speculator.py" in report["files"]
    assert len(report["files"]) == 14  # DFlash2 (11) and the draft-noise salt (3 more: sampler, DSpark, rejection sampler)
    _, report = patched["0.27.1"]
    assert "base shape no-logits-cache" in report["reason"]
    assert len(report["files"]) == 10


def test_applied_then_already_applied_on_the_fork_shape(patched, diff_dir):
    root, _ = patched["fork"]
    before = tree_digest(root)
    code, report, _ = patch_v9(root, "--diff", str(diff_dir))
    assert (code, report["outcome"]) == (0, "already-applied")
    assert tree_digest(root) == before


def test_a_diff_of_the_other_shape_is_refused_with_the_right_hint(release, diff_dir):
    code, _, stderr = patch_v9(release("0.27.1"), "--check", "--diff", str(diff_dir / "dflash2-logits-cache.diff"))
    assert code == 2
    assert "it is the logits-cache diff, and this tree's probe says no-logits-cache" in stderr


@pytest.fixture(scope="module")
def probes(patched, release):
    found = {base: base_shape_probe(root) for base, (root, _) in patched.items()}
    found["0.27.1-unpatched"] = base_shape_probe(release("0.27.1"))
    found["0.28.0"] = base_shape_probe(release("0.28.0"))
    return found


def test_incoai_runs_non_causal_on_every_patched_base(probes):
    assert probes["0.27.1-unpatched"]["causal"]["incoai"] == [True] * 5  # the bug v9 fixes
    for base in ("0.27.1", "fork", "0.28.0"):
        assert probes[base]["causal"]["incoai"] == [False] * 5, base


def test_configs_without_is_causal_resolve_as_0_28_0_does(probes):
    for base in ("0.27.1", "fork"):
        assert probes[base]["causal"] == probes["0.28.0"]["causal"], base
    assert probes["0.28.0"]["causal"]["sliding_no_is_causal"] == [True] * 5


def test_fork_shape_builds_dflash2_with_its_own_draft_distribution(probes):
    fork = probes["fork"]
    assert fork["hooks"] == {"DraftModelSpeculator": ["bfloat16", 0.0], "DFlash2Speculator": ["float32", "-inf"]}
    assert fork["probabilistic"]["DFlash2DraftModel"] == {
        "speculator": "DFlash2Speculator", "dtype": "float32", "shape": [2, 7, 512], "fill": ["-inf"],
    }
    # A DFlash (v1) draft keeps the base's distribution: the head dtype, zeros.
    assert fork["probabilistic"]["DFlashDraftModel"]["dtype"] == "bfloat16"
    assert fork["probabilistic"]["DFlashDraftModel"]["fill"] == ["0.0"]
    assert probes["0.28.0"]["probabilistic"]["DFlash2DraftModel"] == fork["probabilistic"]["DFlash2DraftModel"]


def test_without_the_cache_probabilistic_dflash2_is_refused_at_engine_start(probes):
    refusal = probes["0.27.1"]["probabilistic"]["DFlash2DraftModel"]["refused"]
    assert refusal.startswith("DFlash2 with draft_sample_method='probabilistic' needs vLLM's pre-temperature logits cache")
    assert len(refusal.splitlines()) == 1
    assert probes["0.27.1"]["probabilistic"]["DFlashDraftModel"]["speculator"] == "DFlashSpeculator"


def test_the_chain_v9_v10_v11_on_the_fork_shape(patched):
    root, _ = patched["fork"]
    chained = root.parent / "chain"
    shutil.copytree(root, chained, copy_function=os.link)
    for layer in ("v10", "v11"):
        result = run_script("scripts/patch-layer", layer, "--root", str(chained), "--json", "--import-check", "off")
        assert json.loads(result.stdout)["outcome"] == "applied", result.stdout
    for layer in ("v9", "v10", "v11"):
        result = run_script("scripts/patch-layer", layer, "--root", str(chained), "--json", "--import-check", "off")
        assert json.loads(result.stdout)["outcome"] == "already-applied", result.stdout
    assert LOGITS_CACHE in json.loads(run_script(
        "scripts/patch-layer", "v9", "--root", str(chained), "--json", "--check").stdout)["reason"]


def test_prepare_drafter_says_non_causal_only_where_the_engine_runs_it_so(patched, release, tmp_path):
    from tests.unit.test_drafter_synthetic import make_incoai

    snapshot = make_incoai(tmp_path / "hf")
    engines = {
        "0.27.1 unpatched": release("0.27.1"), "fork unpatched": release("fork"),
        "0.27.1+v9": patched["0.27.1"][0], "fork+v9": patched["fork"][0], "0.30.0": release("0.30.0"),
    }
    for name, root in engines.items():
        out = tmp_path / name.replace(" ", "-")
        result = run_script("scripts/prepare-drafter", str(snapshot), "--out", str(out), "--json",
                            "--vllm-root", str(root))
        assert result.returncode == 0, result.stderr
        summary = json.loads(result.stdout)
        engine = base_shape_probe(root, snapshot / "config.json")["causal"][str(snapshot / "config.json")]
        assert [summary["causal"]] * 5 == engine, name  # what vLLM's own _dflash_layer_causal resolves
        assert (", non-causal," in summary["startup"]) == (not summary["causal"]), name
        assert str(root) in summary["causal_rule"]
        if name.endswith("unpatched"):
            assert summary["causal"] is True and ", causal, mask row from the target's" in summary["startup"]
        else:
            assert summary["causal"] is False
