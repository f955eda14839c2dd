"""v9 on real vLLM release trees: generated, pinned, applied exactly, refused on drift (0.27.1's shape)."""

import json
import os

import pytest

from recipekit.backport import NO_LOGITS_CACHE, generate, load_manifest, sha256_text
from recipekit.exact_patch import PatchRefused, plan
from tests.vllm.conftest import run_script, tree_digest

NEW_FILES = (
    "vllm/model_executor/models/qwen3_dflash2.py",
    "vllm/v1/worker/gpu/spec_decode/dflash2/__init__.py",
    "vllm/v1/worker/gpu/spec_decode/dflash2/speculator.py",
)


@pytest.fixture(scope="module")
def backport_diff(tmp_path_factory):
    out = tmp_path_factory.mktemp("backport") / "dflash2.diff"
    result = run_script("scripts/make-backport", "--out", str(out))
    assert result.returncode == 0, result.stderr
    return out


def test_generated_diff_matches_the_pin_twice_in_a_row(release, tmp_path, backport_diff):
    manifest = load_manifest()
    again = tmp_path / "again.diff"
    assert run_script("scripts/make-backport", "--out", str(again)).returncode == 0
    assert again.read_bytes() == backport_diff.read_bytes()
    assert sha256_text(backport_diff.read_text()) == manifest["diff_sha256"][NO_LOGITS_CACHE]
    in_process = generate(release("0.27.1"), release("0.28.0"), manifest, NO_LOGITS_CACHE)
    assert sha256_text(in_process) == manifest["diff_sha256"][NO_LOGITS_CACHE]


def test_other_pull_requests_stay_out(backport_diff):
    text = backport_diff.read_text()
    for foreign in ("MuseGlimmer", "use_multi_module_mtp", "is_neox_style", "logits_cache",
                    "num_lookahead_tokens", "BailingMoeV3"):
        assert foreign not in text, foreign
    assert '+    "DFlash2DraftModel": ("qwen3_dflash2", "DFlash2Qwen3ForCausalLM"),' in text


def test_a_changed_pin_is_refused_and_nothing_is_written(tmp_path):
    manifest = load_manifest()
    manifest["diff_sha256"][NO_LOGITS_CACHE] = "0" * 64
    forged = tmp_path / "manifest.json"
    forged.write_text(json.dumps(manifest))
    out = tmp_path / "out.diff"
    result = run_script("scripts/make-backport", "--out", str(out), "--manifest", str(forged))
    assert result.returncode == 3
    assert "does not match diff_sha256.no-logits-cache" in result.stderr
    assert not out.exists()


def test_applies_to_0_27_1_then_is_already_applied(tree_copy, release, backport_diff):
    root = tree_copy("0.27.1")
    first = run_script("scripts/patch-layer", "v9", "--root", str(root), "--diff",
                       str(backport_diff), "--json", "--import-check", "off")
    assert first.returncode == 0, first.stderr
    report = json.loads(first.stdout)
    assert report["outcome"] == "applied"
    assert set(NEW_FILES) <= set(report["files"])
    assert len(report["files"]) == 10
    for relative in NEW_FILES:
        assert (root / relative).read_bytes() == (release("0.28.0") / relative).read_bytes()
    for relative in report["files"]:
        compile((root / relative).read_text(), relative, "exec")
    before = tree_digest(root)
    second = run_script("scripts/patch-layer", "v9", "--root", str(root), "--diff",
                        str(backport_diff), "--json")
    assert second.returncode == 0
    assert json.loads(second.stdout)["outcome"] == "already-applied"
    assert tree_digest(root) == before


@pytest.mark.parametrize("version", ["0.30.0", "0.33.0", "0.34.0"])
def test_newer_bases_provide_dflash2(tree_copy, backport_diff, version):
    root = tree_copy(version)
    before = tree_digest(root)
    result = run_script("scripts/patch-layer", "v9", "--root", str(root), "--diff",
                        str(backport_diff), "--json")
    assert result.returncode == 0
    report = json.loads(result.stdout)
    assert report["outcome"] == "provided-by-base"
    assert "DFlash2DraftModel" in report["reason"]
    assert tree_digest(root) == before


def test_a_base_shipping_dflash2_otherwise_is_refused_naming_the_probe(tree_copy):
    # 0.34.0 reaches DFlash2Speculator through the draft model's speculator_config_class;
    # without it, the refusal names that, not the diff's first mismatched hunk.
    root = tree_copy("0.34.0")
    model = root / "vllm/model_executor/models/qwen3_dflash2.py"
    text = model.read_text()
    declared = "    speculator_config_class = DFlash2SpeculatorConfig\n"
    assert text.count(declared) == 1
    os.unlink(model)  # break the hard link before editing
    model.write_text(text.replace(declared, ""))
    before = tree_digest(root)
    result = run_script("scripts/patch-layer", "v9", "--root", str(root), "--json")
    assert result.returncode == 3
    reason = json.loads(result.stdout)["reason"]
    assert reason == (
        "the base ships DFlash2DraftModel (its registry maps it), so v9's diff does not apply, yet not "
        "as v9 provides it: vllm.model_executor.models.qwen3_dflash2.DFlash2Qwen3ForCausalLM declares "
        "no speculator_config_class, so init_speculator never reaches DFlash2Speculator")
    assert tree_digest(root) == before


def test_a_drifted_context_line_is_refused_and_the_tree_is_untouched(tree_copy, backport_diff):
    root = tree_copy("0.27.1")
    drifted = root / "vllm/model_executor/models/qwen3_dflash.py"
    text = drifted.read_text()
    anchor = "class DFlashQwen3ForCausalLM(Qwen3ForCausalLM):\n"
    assert text.count(anchor) == 1
    os.unlink(drifted)  # break the hard link before editing
    drifted.write_text(text.replace(anchor, "class DFlashQwen3ForCausalLM(Qwen3ForCausalLM):  # local\n"))
    before = tree_digest(root)
    result = run_script("scripts/patch-layer", "v9", "--root", str(root), "--diff", str(backport_diff))
    assert result.returncode == 3
    assert "vllm/model_executor/models/qwen3_dflash.py: hunk #4 (@@ -662,6 +667,8 @@)" in result.stdout
    assert "does not match" in result.stdout
    assert "# local" in result.stdout  # the closest place is shown
    assert tree_digest(root) == before


def test_check_mode_writes_nothing(tree_copy, backport_diff):
    root = tree_copy("0.27.1")
    before = tree_digest(root)
    result = run_script("scripts/patch-layer", "v9", "--root", str(root), "--diff",
                        str(backport_diff), "--check", "--json")
    assert result.returncode == 0
    assert json.loads(result.stdout)["outcome"] == "applied"
    assert tree_digest(root) == before


def test_a_tampered_diff_file_is_an_environment_error(tree_copy, backport_diff, tmp_path):
    tampered = tmp_path / "tampered.diff"
    tampered.write_text(backport_diff.read_text().replace("DFlash2", "DFlash3", 1))
    result = run_script("scripts/patch-layer", "v9", "--root", str(tree_copy("0.27.1")),
                        "--diff", str(tampered))
    assert result.returncode == 2
    assert "is not the pinned" in result.stderr


def test_the_diff_belongs_to_0_27_1_not_0_28_0(release, backport_diff):
    # Every hunk must place itself by context alone, not by its line number.
    assert plan(release("0.27.1"), backport_diff.read_text()).outcome == "apply"
    with pytest.raises(PatchRefused):
        plan(release("0.28.0"), backport_diff.read_text())
