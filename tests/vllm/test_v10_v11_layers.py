"""v10 and v11 on real vLLM trees: applied to 0.30.0, provided by 0.33.0, refused on 0.27.1 and on drift."""

import json
import os
import subprocess
import sys

import pytest

from tests.vllm.conftest import REPO_ROOT, run_script, tree_digest

NO_GLM5NEXT = "the base has no Glm5Next"


def patch(layer, root, *extra):
    result = run_script("scripts/patch-layer", layer, "--root", str(root), "--json", *extra)
    report = json.loads(result.stdout) if result.stdout.strip() else {}
    return result.returncode, report


def probe(script, tree, *args):
    result = subprocess.run(
        [sys.executable, str(REPO_ROOT / "tests/vllm/probes" / script), *args],
        capture_output=True, text=True, timeout=600, check=False,
        env={**os.environ, "PYTHONPATH": str(tree), "PYTHONDONTWRITEBYTECODE": "1"},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["vllm_file"].startswith(str(tree))
    return report


@pytest.fixture(scope="module")
def patched_0_30_0(tmp_path_factory, release):
    import shutil
    root = tmp_path_factory.mktemp("v10-v11") / "tree"
    shutil.copytree(release("0.30.0"), root, copy_function=os.link)
    for layer in ("v10", "v11"):
        code, report = patch(layer, root, "--import-check", "on")
        assert code == 0, report
        assert report["outcome"] == "applied", report
        assert "touched modules import" in report["reason"], report
    return root


def test_v10_v11_apply_to_0_30_0_then_are_already_applied(patched_0_30_0):
    before = tree_digest(patched_0_30_0)
    for layer in ("v10", "v11"):
        code, report = patch(layer, patched_0_30_0)
        assert (code, report["outcome"]) == (0, "already-applied")
    assert tree_digest(patched_0_30_0) == before


def test_v10_v11_touch_only_their_files(patched_0_30_0, release):
    stock = tree_digest(release("0.30.0"))
    changed = {name for name, digest in tree_digest(patched_0_30_0).items() if stock.get(name) != digest}
    assert changed == {
        "vllm/models/glm5next/nvidia/model.py",
        "vllm/models/glm5next/nvidia/mhc_aux_capture.py",
        "vllm/v1/core/kv_cache_utils.py",
        "vllm/v1/core/glm5_next_draft_kv.py",
    }


def test_0_33_0_provides_both(tree_copy):
    root = tree_copy("0.33.0")
    before = tree_digest(root)
    code, v10 = patch("v10", root)
    assert (code, v10["outcome"]) == (0, "provided-by-base")
    assert "glm5next/common/model.py" in v10["reason"]
    code, v11 = patch("v11", root)
    assert (code, v11["outcome"]) == (0, "provided-by-base")
    assert "kv_cache_planning.py" in v11["reason"] and "_get_packed_kv_cache_groups" in v11["reason"]
    assert tree_digest(root) == before


@pytest.mark.parametrize("layer", ["v10", "v11"])
def test_0_27_1_has_no_glm5next(tree_copy, layer):
    code, report = patch(layer, tree_copy("0.27.1"))
    assert code == 3
    assert report["outcome"] == "refused" and report["reason"].startswith(NO_GLM5NEXT)


@pytest.mark.parametrize("layer, relative, old, new, message", [
    ("v10", "vllm/models/glm5next/nvidia/model.py", "class Glm5NextModel(nn.Module):",
     "class Glm5NextTextModel(nn.Module):", "class Glm5NextModel not found"),
    ("v10", "vllm/models/glm5next/nvidia/model.py", "        for layer in self._active_layers:",
     "        for block in self._active_layers:", "expected one `for layer in self._active_layers` loop"),
    ("v11", "vllm/v1/core/kv_cache_utils.py", "def _glm5_next_tensor_layout(",
     "def _glm5_next_layout(", "function _glm5_next_tensor_layout not found"),
])
def test_a_renamed_anchor_is_refused_and_the_tree_is_unchanged(tree_copy, layer, relative, old, new, message):
    root = tree_copy("0.30.0")
    target = root / relative
    text = target.read_text()
    assert text.count(old) == 1
    os.unlink(target)
    target.write_text(text.replace(old, new))
    before = tree_digest(root)
    code, report = patch(layer, root)
    assert code == 3 and report["outcome"] == "refused"
    assert message in report["reason"]
    assert len(report["reason"].splitlines()) == 1
    assert tree_digest(root) == before


def test_a_partly_patched_tree_is_refused(tree_copy):
    root = tree_copy("0.30.0")
    assert patch("v10", root, "--import-check", "off")[0] == 0
    model = root / "vllm/models/glm5next/nvidia/model.py"
    text = model.read_text()
    model.write_text(text.replace("IsHybrid, SupportsEagle3\n", "IsHybrid\n", 1))
    before = tree_digest(root)
    code, report = patch("v10", root)
    assert code == 3
    assert "partly patched" in report["reason"] and "Glm5NextForCausalLM supports EAGLE3" in report["reason"]
    assert tree_digest(root) == before


def test_v10_captures_completed_mhc_streams(patched_0_30_0):
    report = probe("glm5next_aux_capture.py", patched_0_30_0)
    assert report["model_is_eagle_mixin"]
    assert report["causal_lm_supports_eagle3"] and report["multimodal_supports_eagle3"]
    for name, taps in (("five", 5), ("nine", 9)):
        run = report["runs"][name]
        assert run["aux_layers"] == run["taps_plus_one"]
        assert run["num_captured"] == taps
        assert run["captured_shapes"] == [[5, 16]]
        assert run["max_abs_error"] < 1e-5
        assert run["plain_returns_tensor"] and run["outputs_equal"]
        assert run["deferred_state_bit_identical"]
    assert report["runs"]["nine"]["last_layer_tap_is_final_output"]
    assert report["sequence_parallel"] == {
        "gather_calls": [[3, 16]], "shape": [5, 16], "first_rows_are_shard": True,
    }


@pytest.fixture(scope="module")
def kv_plans(patched_0_30_0, release):
    patched = probe("glm5next_kv_groups.py", patched_0_30_0, "target", "drafter", "two-page-sizes")
    stock = probe("glm5next_kv_groups.py", release("0.30.0"), "target", "drafter")
    plans = {("patched", case): patched[case] for case in ("target", "drafter", "two-page-sizes")}
    plans.update({("stock", case): stock[case] for case in ("target", "drafter")})
    return plans


def test_v11_without_drafter_changes_nothing(kv_plans):
    patched, stock = kv_plans[("patched", "target")], kv_plans[("stock", "target")]
    for key in ("groups", "tensors", "num_blocks", "bytes_per_block", "max_memory_bytes", "bespoke_groups"):
        assert patched[key] == stock[key], key


def test_stock_0_30_0_gives_up_its_grouping_beside_a_drafter(kv_plans):
    assert kv_plans[("stock", "drafter")]["bespoke_groups"] is False


def test_v11_gives_the_drafter_a_quarter_block_group(kv_plans):
    target, drafter = kv_plans[("patched", "target")], kv_plans[("patched", "drafter")]
    assert drafter["bespoke_groups"] is True
    assert drafter["groups"][:-1] == target["groups"]
    group = drafter["groups"][-1]
    assert group["type"] == "SlidingWindowSpec" and group["block_size"] == 1024 // 4
    assert group["layers"] == [f"draft.layers.{45 + i}.self_attn.attn" for i in range(5)]
    draft_page = 256 * 4 * (128 + 128) * 2  # tokens x heads x (K + V) x bf16
    assert drafter["bytes_per_block"] == target["bytes_per_block"] + 5 * draft_page
    extra = drafter["tensors"][len(target["tensors"]):]
    assert [t[1] for t in extra] == [[name] for name in group["layers"]]
    size, num_blocks = drafter["tensors"][0][0], drafter["num_blocks"]
    assert size == drafter["bytes_per_block"] * num_blocks
    assert all(t[3] == draft_page and t[2] == draft_page * num_blocks for t in extra)
    assert extra[-1][4] + draft_page * num_blocks == size  # the drafter region ends the pool
    target_pages = target["max_memory_bytes"] // target["bytes_per_block"]
    draft_pages = -(-(2048 - 1 + 8192) // 256) + 1  # the window plus in-flight tokens, +1
    assert drafter["max_memory_bytes"] == (target_pages + draft_pages) * drafter["bytes_per_block"]


def test_v11_refuses_drafter_layers_of_two_page_sizes(kv_plans):
    error = kv_plans[("patched", "two-page-sizes")]["error"]
    assert error.startswith("ValueError: the drafter's sliding-window layers have KV pages of")
    assert "[1048576, 2097152] bytes" in error
