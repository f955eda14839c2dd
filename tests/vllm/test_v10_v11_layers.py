"""v10 and v11 on real vLLM trees and the fork-shaped stand-in: applied to 0.30.0 and the
fork shape, provided by 0.33.0, refused on 0.27.1 and on drift."""

import json
import os
import sys

import pytest

from tests.vllm.conftest import REPO_ROOT, patch_layer, run_python, tree_digest

NO_GLM5NEXT = "the base has no Glm5Next"


def patch(layer, root, *extra):
    return patch_layer(layer, root, *extra)[:2]


def probe(script, tree, *args):
    result = run_python(
        [sys.executable, str(REPO_ROOT / "tests/vllm/probes" / script), *args],
        capture_output=True, text=True, timeout=600, check=False,
        env={**os.environ, "PYTHONPATH": str(tree), "PYTHONDONTWRITEBYTECODE": "1"},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["vllm_file"].startswith(str(tree))
    return report


GLM5NEXT_BASES = ["0.30.0", "fork"]


@pytest.fixture(scope="module", params=GLM5NEXT_BASES)
def patched(request, tmp_path_factory, release):
    """(base, tree with v10 and v11 applied, their module imports checked on torch)."""
    import shutil
    root = tmp_path_factory.mktemp(f"v10-v11-{request.param}") / "tree"
    shutil.copytree(release(request.param), root, copy_function=os.link)
    for layer in ("v10", "v11"):
        code, report = patch(layer, root, "--import-check", "on")
        assert code == 0, report
        assert report["outcome"] == "applied", report
        assert "touched modules import" in report["reason"], report
    return request.param, root


def test_v10_v11_apply_then_are_already_applied(patched):
    _, root = patched
    before = tree_digest(root)
    for layer in ("v10", "v11"):
        code, report = patch(layer, root)
        assert (code, report["outcome"]) == (0, "already-applied")
    assert tree_digest(root) == before


def test_v10_v11_touch_only_their_files(patched, release):
    base, root = patched
    stock = tree_digest(release(base))
    changed = {name for name, digest in tree_digest(root).items() if stock.get(name) != digest}
    assert changed == {
        "vllm/models/glm5next/nvidia/model.py",
        "vllm/models/glm5next/nvidia/mhc_aux_capture.py",
        "vllm/v1/core/kv_cache_utils.py",
        "vllm/v1/core/glm5_next_draft_kv.py",
    }


def test_v11_is_the_same_patch_on_both_planners(patched, release):
    """Only decorators and one import: no statement of either planner is edited."""
    base, root = patched
    stock = (release(base) / "vllm/v1/core/kv_cache_utils.py").read_text().splitlines()
    after = (root / "vllm/v1/core/kv_cache_utils.py").read_text().splitlines()
    import difflib
    added = [l[1:] for l in difflib.unified_diff(stock, after, n=0, lineterm="")
             if l.startswith("+") and not l.startswith("+++")]
    removed = [l for l in difflib.unified_diff(stock, after, n=0, lineterm="")
               if l.startswith("-") and not l.startswith("---")]
    assert removed == []
    decorators = sorted(line for line in added if line.startswith("@"))
    assert decorators == sorted([
        "@bytes_per_block_with_draft", "@glm5_next_groups_with_draft",
        "@glm5_next_layout_past_draft", "@kv_cache_config_with_draft", "@max_memory_with_draft",
    ])
    assert len(added) == len(decorators) + 7  # the helper import, 7 lines


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


@pytest.mark.parametrize("base", GLM5NEXT_BASES)
@pytest.mark.parametrize("layer, relative, old, new, message", [
    ("v10", "vllm/models/glm5next/nvidia/model.py", "class Glm5NextModel(nn.Module):",
     "class Glm5NextTextModel(nn.Module):", "class Glm5NextModel not found"),
    ("v10", "vllm/models/glm5next/nvidia/model.py", "        for layer in self._active_layers:",
     "        for block in self._active_layers:", "expected one `for layer in self._active_layers` loop"),
    ("v11", "vllm/v1/core/kv_cache_utils.py", "def _glm5_next_tensor_layout(",
     "def _glm5_next_layout(", "function _glm5_next_tensor_layout not found"),
])
def test_a_renamed_anchor_is_refused_and_the_tree_is_unchanged(tree_copy, base, layer, relative, old, new, message):
    root = tree_copy(base)
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


def test_v11_refuses_a_layout_reader_it_cannot_place(tree_copy):
    root = tree_copy("fork")
    utils = root / "vllm/v1/core/kv_cache_utils.py"
    text = utils.read_text()
    os.unlink(utils)
    utils.write_text(text + "\n\ndef _glm5_next_report(groups):\n    return _glm5_next_tensor_layout(groups)\n")
    code, report = patch("v11", root)
    assert code == 3
    assert "_glm5_next_report reads _glm5_next_tensor_layout(...) but is not" in report["reason"]


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


def test_v10_captures_completed_mhc_streams(patched):
    report = probe("glm5next_aux_capture.py", patched[1])
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
def kv_plans(patched, release):
    base, root = patched
    cases = ("target", "drafter", "two-page-sizes", "real-pages", "real-pages-drafter")
    patched_plans = probe("glm5next_kv_groups.py", root, *cases)
    stock = probe("glm5next_kv_groups.py", release(base), "target", "drafter", "real-pages")
    plans = {("patched", case): patched_plans[case] for case in cases}
    plans.update({("stock", case): stock[case] for case in ("target", "drafter", "real-pages")})
    return base, plans


def test_v11_without_drafter_changes_nothing(kv_plans):
    _, plans = kv_plans
    patched, stock = plans[("patched", "target")], plans[("stock", "target")]
    for key in ("groups", "tensors", "num_blocks", "bytes_per_block", "max_memory_bytes", "bespoke_groups"):
        assert patched[key] == stock[key], key


def test_stock_planner_gives_up_its_grouping_beside_a_drafter(kv_plans):
    base, plans = kv_plans
    stock = plans[("stock", "drafter")]
    assert stock["bespoke_groups"] is False
    if base == "fork":  # the fork's general path then fails at engine start
        assert stock["error"].startswith("NotImplementedError: Layer model.layers.2.self_attn.attn: page size")


DRAFT_PAGE = 256 * 4 * (128 + 128) * 2  # tokens x heads x (K + V) x bf16
DRAFT_PAGES = -(-(2048 - 1 + 8192) // 256) + 1  # the window plus in-flight tokens, +1


def test_v11_gives_the_drafter_a_quarter_block_group(kv_plans):
    _, plans = kv_plans
    target, drafter = plans[("patched", "target")], plans[("patched", "drafter")]
    assert drafter["bespoke_groups"] is True
    assert drafter["groups"][:-1] == target["groups"]
    group = drafter["groups"][-1]
    assert group["type"] == "SlidingWindowSpec" and group["block_size"] == 1024 // 4
    assert group["layers"] == [f"draft.layers.{45 + i}.self_attn.attn" for i in range(5)]
    assert drafter["bytes_per_block"] == target["bytes_per_block"] + 5 * DRAFT_PAGE
    num_blocks = drafter["num_blocks"]
    assert num_blocks == 4_445_787_956 // drafter["bytes_per_block"]
    target_pages = target["max_memory_bytes"] // target["bytes_per_block"]
    assert drafter["max_memory_bytes"] == (target_pages + DRAFT_PAGES) * drafter["bytes_per_block"]


def test_v11_tensors_in_the_bases_form_cover_every_layer_once(kv_plans):
    base, plans = kv_plans
    target, drafter = plans[("patched", "target")], plans[("patched", "drafter")]
    num_blocks, group = drafter["num_blocks"], drafter["groups"][-1]
    extra = drafter["tensors"][len(target["tensors"]):]
    if base == "fork":  # KVCacheTensor(size, shared_by, offset, block_stride): one allocation each
        covered = [name for t in drafter["tensors"] for name in t["shared_by"]]
        assert [t["shared_by"] for t in extra] == [[name] for name in group["layers"]]
        assert all(t["size"] == DRAFT_PAGE * num_blocks for t in extra)
        assert sum(t["size"] for t in drafter["tensors"]) == drafter["bytes_per_block"] * num_blocks
    else:  # KVCacheTensor(size, layers, layer_stride, block_stride, offset): one shared pool
        covered = [name for t in drafter["tensors"] for name in t["layers"]]
        assert [t["layers"] for t in extra] == [[name] for name in group["layers"]]
        size = drafter["tensors"][0]["size"]
        assert size == drafter["bytes_per_block"] * num_blocks
        assert all(t["size"] == size for t in drafter["tensors"])
        assert all(t["block_stride"] == DRAFT_PAGE and t["layer_stride"] == DRAFT_PAGE * num_blocks for t in extra)
        assert extra[-1]["offset"] + DRAFT_PAGE * num_blocks == size  # the drafter region ends the pool
    every_layer = [name for g in drafter["groups"] for name in g["layers"]]
    assert sorted(covered) == sorted(every_layer)


def test_v11_plans_the_same_drafter_group_on_both_planners(tmp_path_factory, release):
    plans = {}
    for base in GLM5NEXT_BASES:
        root = tmp_path_factory.mktemp(f"same-{base}") / "tree"
        import shutil
        shutil.copytree(release(base), root, copy_function=os.link)
        assert patch("v11", root, "--import-check", "off")[1]["outcome"] == "applied"
        plans[base] = probe("glm5next_kv_groups.py", root, "drafter")["drafter"]
    # Each planner's spec classes print their own fields; the groups are the same layers, types, blocks.
    shape = lambda plan: [(g["layers"], g["type"], g["block_size"]) for g in plan["groups"]]
    assert shape(plans["0.30.0"]) == shape(plans["fork"])
    for key in ("bytes_per_block", "num_blocks"):
        assert plans["0.30.0"][key] == plans["fork"][key], key


def test_v11_with_the_published_tp2_pages(kv_plans):
    """MLA page 1,198,080 bytes and 6,370,560 bytes per block, as published (the seed's PR #1)."""
    _, plans = kv_plans
    target, drafter = plans[("patched", "real-pages")], plans[("patched", "real-pages-drafter")]
    assert target == plans[("stock", "real-pages")]
    assert target["bytes_per_block"] == 6_370_560 == 5 * (1_198_080 + 76_032)
    group = drafter["groups"][-1]
    assert (group["type"], group["block_size"]) == ("SlidingWindowSpec", 2304 // 4)
    draft_page = 576 * 4 * (128 + 128) * 2
    assert drafter["bytes_per_block"] == 6_370_560 + 5 * draft_page
    assert drafter["num_blocks"] == 4_445_787_956 // drafter["bytes_per_block"]
    target_pages = target["max_memory_bytes"] // target["bytes_per_block"]
    draft_pages = -(-(2048 - 1 + 8192) // 576) + 1
    assert drafter["max_memory_bytes"] == (target_pages + draft_pages) * drafter["bytes_per_block"]


def test_v11_refuses_drafter_layers_of_two_page_sizes(kv_plans):
    error = kv_plans[1][("patched", "two-page-sizes")]["error"]
    assert error.startswith("ValueError: the drafter's sliding-window layers have KV pages of")
    assert "[1048576, 2097152] bytes" in error
