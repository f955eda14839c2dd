"""Layer v13 on real vLLM trees and the fork-shaped stand-in: applied on 0.30.0 and the fork
shape, each group provided by 0.33.0 or applied there, refused on 0.27.1 and on drift; the
patched functions run on CPU torch with the switches on and off."""

import json
import os
import shutil
import sys

import pytest

from recipekit.layers.v13_groups import (
    GROUPS, INDEXER, KPOOL_KERNELS, MODEL_RUNNER, REJECTION_SAMPLER, ROUTER, TAIL_CACHE, WEIGHT_FILTER,
)
from tests.vllm.conftest import REPO_ROOT, patch_layer, run_probes, run_python, run_script, tree_digest

BASES = ["0.30.0", "fork"]
SWITCHES = [group.variable for group in GROUPS]
V13_FILES = {
    KPOOL_KERNELS, TAIL_CACHE, INDEXER, "vllm/models/glm5next/nvidia/model.py", "vllm/glm53_v13_switches.py",
    REJECTION_SAMPLER, MODEL_RUNNER, ROUTER, WEIGHT_FILTER,
}


def patch(root, *extra):
    return patch_layer("v13", root, *extra)[:2]


def without_switches() -> dict[str, str]:
    return {key: value for key, value in os.environ.items() if not key.startswith("GLM53_")}


def run_probe(tree, name: str, switches: dict[str, str], *args: str):
    env = without_switches()
    env.update(PYTHONPATH=str(tree), PYTHONDONTWRITEBYTECODE="1", **switches)
    return run_python(
        [sys.executable, str(REPO_ROOT / "tests/vllm/probes" / name), *args],
        capture_output=True, text=True, timeout=900, check=False, env=env,
    )


def report_of(result) -> dict:
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def probe(tree, switches_on: bool, name: str = "v13_switches.py", *args: str, **extra: str):
    return report_of(run_probe(tree, name, {**({s: "1" for s in SWITCHES} if switches_on else {}), **extra}, *args))


@pytest.fixture(scope="module", params=BASES)
def patched(request, tmp_path_factory, release):
    root = tmp_path_factory.mktemp(f"v13-{request.param}") / "tree"
    shutil.copytree(release(request.param), root, copy_function=os.link)
    code, report = patch(root, "--import-check", "on")
    assert (code, report["outcome"]) == (0, "applied"), report
    assert "touched modules import" in report["reason"], report
    assert {c["change"]: c["status"] for c in report["changes"]} == {g.id: "applied" for g in GROUPS}
    return request.param, root


ON = {s: "1" for s in SWITCHES}
# The adaptive-verify settings refused at import, and the one line each says.
REFUSALS = [
    ({"GLM53_ADAPTIVE_VERIFY_TAU": "1.5"},
     "GLM53_ADAPTIVE_VERIFY_TAU='1.5': the drafter confidence a draft needs to be verified is a number in [0, 1]"),
    ({"GLM53_ADAPTIVE_VERIFY_MAX": "5"},
     "GLM53_ADAPTIVE_VERIFY_MAX=5: above the 4 speculative tokens a step drafts"),
]
# Every probe run of a patched tree: {name: (probe, its arguments, the GLM53_* it runs with)}.
CASES = {
    "switches-off": ("v13_switches.py", [], {}),
    "switches-on": ("v13_switches.py", [], ON),
    "adaptive-tau-0.3": ("adaptive_verify.py", [], {**ON, "GLM53_ADAPTIVE_VERIFY_TAU": "0.3"}),
    "adaptive-capped": ("adaptive_verify.py", [], {**ON, "GLM53_ADAPTIVE_VERIFY_TAU": "0",
                                                   "GLM53_ADAPTIVE_VERIFY_MAX": "1"}),
    "adaptive-off": ("adaptive_verify.py", [], {}),
    **{f"adaptive-refused-{i}": ("adaptive_verify.py", [], {"GLM53_ADAPTIVE_VERIFY": "1", **switches})
       for i, (switches, _) in enumerate(REFUSALS)},
    "skip-mtp-on": ("skip_mtp_weights.py", ["dflash"], {"GLM53_SKIP_MTP_WEIGHTS": "1"}),
    "skip-mtp-off": ("skip_mtp_weights.py", ["dflash"], {}),
    "skip-mtp-drafter": ("skip_mtp_weights.py", ["mtp"], {"GLM53_SKIP_MTP_WEIGHTS": "1"}),
}
# What every case imports and no GLM53_* variable changes: loaded once for all of them. The
# switch module reads GLM53_* at import, so each case imports it (and every patched module,
# which all import it) under its own variables; the runner refuses a preload that loads it.
SHARED_IMPORTS = ["torch", "vllm.config", "vllm.platforms.cpu", "vllm.model_executor.layers.layernorm"]


@pytest.fixture(scope="module")
def probed(patched):
    """{case: the probe's CompletedProcess} for every case of CASES on the patched tree, each
    run as if alone (tests/vllm/probes/runner.py): one interpreter's imports for the ten."""
    return run_probes(patched[1], {name: {"script": script, "args": args, "env": switches}
                                   for name, (script, args, switches) in CASES.items()},
                      preload=SHARED_IMPORTS, fresh=["vllm.glm53_v13_switches"],
                      env=without_switches())


def test_the_fork_shape_carries_the_fork_era_text_v13_patches(release):
    fork, stock = release("fork"), release("0.30.0")
    for relative in (KPOOL_KERNELS, TAIL_CACHE, INDEXER):
        assert (fork / relative).read_bytes() == (stock / relative).read_bytes(), relative
    kernels = (fork / KPOOL_KERNELS).read_text()
    assert "    blk = t // KPOOL  # t >= 0 here" in kernels
    assert "    base = (blk * 2 * KPOOL + t % KPOOL) * HEAD_DIM\n" in kernels
    text = (fork / INDEXER).read_text()
    assert "def compute_kpool_tail_slot_mapping(" in text and "    return max_model_len * 40\n" in text


def test_v13_is_then_already_applied_and_touches_only_its_files(patched, release):
    base, root = patched
    before = tree_digest(root)
    code, report = patch(root)
    assert (code, report["outcome"]) == (0, "already-applied"), report
    assert tree_digest(root) == before
    stock = tree_digest(release(base))
    assert {n for n, d in before.items() if stock.get(n) != d} == V13_FILES


def test_with_every_switch_off_the_patched_code_computes_what_v11_did(probed):
    report = report_of(probed["switches-off"])
    assert report["switches"] == {} and report["kpool_tail_fix"] is False
    assert set(report["tail_block"].values()) == {4}  # kpool, whatever k or the block size
    assert report["workspace_entries"] == 327_680 * 40
    assert report["router_dtype"] == "torch.bfloat16"


def test_with_the_switches_on(probed):
    report = report_of(probed["switches-on"])
    assert report["tail_block"]["k7-b2304"] == 16  # next power of two >= 7 + 4 - 1
    assert report["tail_block"]["k4-b2304"] == report["tail_block"]["k5-b2304"] == 8
    assert report["tail_block"]["k0-b2304"] == 4
    refusal = report["tail_block"]["k7-b2300"]
    assert refusal.startswith("ValueError: GLM53_KPOOL_TAIL_FIX=1: the kpool tail ring (16 slots")
    assert "must divide the block size (2300)" in refusal
    assert report["v2_slots"] == {"equal": True, "in_place": True, "padding_kept": True}
    assert report["workspace_entries"] == 327_680
    assert report["router_dtype"] == "torch.float32"


@pytest.mark.parametrize("version", ["0.33.0", "0.34.0"])
def test_newer_bases_provide_the_ring_and_workspace_and_take_the_router_switch(tree_copy, version):
    root = tree_copy(version)
    code, report = patch(root, "--import-check", "off")
    assert (code, report["outcome"]) == (0, "applied"), report
    changes = {c["change"]: c for c in report["changes"]}
    assert changes["kpool-tail"]["status"] == "provided"
    assert "PR #57477" in changes["kpool-tail"]["detail"]
    assert "V2 runner's positions bug is not addressed" in changes["kpool-tail"]["detail"]
    assert changes["indexer-ws"]["status"] == "provided"
    assert "sparse_mla_prefill_workspace_factor" in changes["indexer-ws"]["detail"]
    assert changes["router-fp32"]["status"] == "applied"
    assert changes["router-fp32"]["file"] == "vllm/models/glm5next/common/model.py"
    assert changes["adaptive-verify"]["status"] == "applied"
    assert sorted(report["files"]) == sorted([
        "vllm/glm53_v13_switches.py", "vllm/models/glm5next/common/model.py",
        REJECTION_SAMPLER, MODEL_RUNNER, ROUTER, WEIGHT_FILTER,
    ])
    before = tree_digest(root)
    assert patch(root)[1]["outcome"] == "already-applied"
    assert tree_digest(root) == before
    # 0.33.0 and 0.34.0 word the rejection sampler's call otherwise; the same masking holds there
    on = probe(root, True, "adaptive_verify.py", GLM53_ADAPTIVE_VERIFY_TAU="0.3")
    assert on["drafts_given"] == ADAPTIVE_DRAFTS_AT_TAU_0_3


# The probe's three requests (tests/vllm/probes/adaptive_verify.py): drafts 1..4 with
# confidences 0.9 0.8 0.25 0.9 / 0.2 0.9 0.9 0.9 (greedy), 0.95 0.1 0.95 0.95 (sampled at 0.7)
ADAPTIVE_DRAFTS_AT_TAU_0_3 = [[100, 101, 102, -1, -1], [105, -1, -1, -1, -1], [110, 111, 112, 113, 114]]


def test_adaptive_verify_masks_the_drafts_past_the_confident_prefix_of_greedy_requests(probed):
    report = report_of(probed["adaptive-tau-0.3"])
    # request slots 4, 1, 2; the other slots keep "verify all" (4) until the drafter reports
    assert report["verify_len"] == [4, 0, 1, 4, 2, 4]
    assert report["drafts_given"] == ADAPTIVE_DRAFTS_AT_TAU_0_3  # the anchor row is never a draft
    router = report["router"]
    assert router["masked_rows"] == [5, 6, 8, 9, 10, 11]
    assert router["first_call_unchanged"] and router["others_unchanged"]
    assert router["masked_take_anchor_ids"] and router["masked_weight_zero"]
    capped = report_of(probed["adaptive-capped"])
    assert capped["verify_len"] == [4, 1, 1, 4, 1, 4]
    assert capped["drafts_given"][0] == [100, 101, -1, -1, -1]


def test_adaptive_verify_off_changes_nothing(probed):
    report = report_of(probed["adaptive-off"])
    assert report["verify_len"] is None and report["drafts_given"] == report["drafts"]
    assert report["router"]["masked_rows"] == [] and report["router"]["first_call_unchanged"]
    assert report["router"]["others_unchanged"]


@pytest.mark.parametrize("index, switches, message", [(i, *r) for i, r in enumerate(REFUSALS)])
def test_adaptive_verify_refuses_bad_settings_in_one_line(probed, index, switches, message):
    assert CASES[f"adaptive-refused-{index}"][2] == {"GLM53_ADAPTIVE_VERIFY": "1", **switches}
    result = probed[f"adaptive-refused-{index}"]
    assert result.returncode != 0
    assert message in result.stderr.strip().splitlines()[-1]


MTP_LAYER = ["model.layers.45.mlp.experts.3.down_proj.weight", "model.layers.45.eh_proj.weight",
             "layers.45.enorm.weight"]


def test_the_mtp_layer_weights_are_skipped_unread_only_when_asked(probed):
    on = report_of(probed["skip-mtp-on"])
    assert on == {"without_ep": MTP_LAYER, "with_ep": MTP_LAYER}  # layer 44, 4, 450 and dense kept
    off = report_of(probed["skip-mtp-off"])
    assert off == {"without_ep": [], "with_ep": [MTP_LAYER[0]]}  # expert 3 is not local: as served


def test_skipping_the_mtp_weights_refuses_the_mtp_drafter(probed):
    result = probed["skip-mtp-drafter"]
    assert result.returncode == 0, result.stderr[-2000:]
    assert json.loads(result.stdout.strip().splitlines()[-1])["refused"].startswith(
        "GLM53_SKIP_MTP_WEIGHTS=1: the drafter is the checkpoint's MTP head")


def test_0_27_1_has_no_glm5next(tree_copy):
    code, report = patch(tree_copy("0.27.1"))
    assert code == 3 and report["reason"].startswith("the base has no Glm5Next")


@pytest.mark.parametrize("base", BASES)
@pytest.mark.parametrize("relative, old, new, message", [
    (KPOOL_KERNELS, "    blk = t // KPOOL  # t >= 0 here", "    blk = t // (KPOOL)  # t >= 0 here",
     "expected 'blk = t // KPOOL  # t >= 0 here' 1 time(s), found it 0"),
    (INDEXER, "    return max_model_len * 40\n", "    return max_model_len * 41\n",
     "expected 'return max_model_len * 40' 1 time(s), found it 0"),
])
def test_drift_is_refused_and_the_tree_is_unchanged(tree_copy, base, relative, old, new, message):
    root = tree_copy(base)
    target = root / relative
    text = target.read_text()
    assert text.count(old) == 1
    os.unlink(target)
    target.write_text(text.replace(old, new))
    before = tree_digest(root)
    code, report = patch(root)
    assert code == 3 and report["outcome"] == "refused"
    assert message in report["reason"] and len(report["reason"].splitlines()) == 1
    assert tree_digest(root) == before


def test_a_partly_patched_group_is_refused(tree_copy):
    root = tree_copy("0.30.0")
    assert patch(root, "--import-check", "off")[0] == 0
    target = root / KPOOL_KERNELS
    text = target.read_text()
    os.unlink(target)
    target.write_text(text.replace("        phys_slot = safe_pos % RING\n", "        phys_slot = safe_pos % POOL_SIZE\n"))
    before = tree_digest(root)
    code, report = patch(root)
    assert code == 3 and "kpool-tail" in report["reason"] and "partly in the tree" in report["reason"]
    assert tree_digest(root) == before


def test_image_v13s_patchers_apply_on_the_fork_shape_after_v9_v10_v11(tree_copy):
    """What docker/Dockerfile.sm121-v13 runs on the fork chain: v13, then v13_weights, on a
    tree that v9, v10 and v11 patched first (v13_weights refuses the bare fork shape: its
    drafter group needs v9's qwen3_dflash2.py)."""
    root = tree_copy("fork")
    for layer in ("v9", "v10", "v11", "v13", "v13_weights"):
        result = run_script("scripts/patch-layer", layer, "--root", str(root), "--json", "--import-check", "off")
        report = json.loads(result.stdout)
        assert (result.returncode, report["outcome"]) == (0, "applied"), (layer, report)
    dockerfile = (REPO_ROOT / "docker" / "Dockerfile.sm121-v13").read_text()
    assert 'apply-layer.py", "v13", "v13_weights"]' in dockerfile
