"""A second turn on vLLM's own Scheduler with Glm5Next's KV groups and DFlash2's drafter group
(issue 40): the hit, turn 2's prefill, the draft window and the pool, per pinned tree.

One probe process per tree (tests/vllm/probes/glm5next_prefix_reuse.py), every case in it;
the table is printed (pytest -s) and docs/prefix-reuse.md quotes it.
"""

import json
import os
import shutil
import sys

import pytest

from tests.vllm.conftest import REPO_ROOT, patch_layer, run_python

CASES = [
    "pin-target", "pin-drafter",
    "off-sync-roomy", "off-sync-roomy-aligned", "off-async-roomy",
    "accept-sync-roomy", "accept-sync-roomy-aligned", "reject-sync-roomy",
    "accept-async-roomy", "reject-async-roomy",
    "off-sync-tight", "accept-sync-tight", "reject-async-tight",
]
BLOCK = 2304
TURN1 = 9 * BLOCK - 700  # the probe's unaligned first prompt
SHARED = TURN1 + 24  # its prompt and its answer
BEST = SHARED // BLOCK * BLOCK  # 18,432: the last KDA checkpoint a block-aligned hit can use
HASH_BLOCK = BLOCK // 4  # beside v11's quarter-block draft group
# Drafted, without EAGLE's trailing-block drop: 0.30.0 checkpoints KDA at the prompt's last
# hash boundary, so the hit is turn 1's prompt floored to 576 (19,584)
DRAFTED_BEST = TURN1 // HASH_BLOCK * HASH_BLOCK
# v11_dflash_block_drop's planted fault, on 0.30.0 only (its decorator undone in the probe)
STOCK_DROP_CASE = "accept-sync-roomy-stockdrop"
# The fork shape with the drafter's group at the attention block (how it starts with prefix
# caching), with v11_dflash_block_drop's scheduler gates and with them undone (the fault)
FORK_FULL_BLOCK_CASES = ["pin-drafter-fullblock", "accept-sync-roomy-fullblock", "accept-sync-roomy-fullblock-stockdrop"]


def run_probe(tree, *extra_cases):
    result = run_python(
        [sys.executable, str(REPO_ROOT / "tests/vllm/probes/glm5next_prefix_reuse.py"), *CASES, *extra_cases],
        capture_output=True, text=True, timeout=300, check=False,
        env={**os.environ, "PYTHONPATH": str(tree), "PYTHONDONTWRITEBYTECODE": "1"},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["vllm_file"].startswith(str(tree))
    return report


@pytest.fixture(scope="module")
def reports(tmp_path_factory, release):
    """{tree name: the probe's report}: 0.30.0 and the fork shape with v11 and its
    v11_dflash_block_drop (as the chain serves them), 0.33.0 and 0.34.0 as released (both
    provided by the base)."""
    out = {}
    for base in ("0.30.0", "fork"):
        root = tmp_path_factory.mktemp(f"prefix-{base}") / "tree"
        shutil.copytree(release(base), root, copy_function=os.link)
        for layer in ("v11", "v11_dflash_block_drop"):
            code, report, _ = patch_layer(layer, root, "--import-check", "off")
            assert code == 0 and report["outcome"] == "applied", report
        out[f"{base}+v11"] = run_probe(root, *([STOCK_DROP_CASE] if base == "0.30.0" else FORK_FULL_BLOCK_CASES))
    out["0.33.0"] = run_probe(release("0.33.0"))
    out["0.34.0"] = run_probe(release("0.34.0"))
    print("\n" + table(out))
    return out


def table(reports) -> str:
    lines = ["| tree | case | hash block | hit | turn-2 prefill | draft window | free start/end | drafts accepted |",
             "|---|---|---|---|---|---|---|---|"]
    for tree, report in reports.items():
        for case in [name for name in report if name != "vllm_file"]:
            row = report[case]
            if case.startswith("pin"):
                lines.append(f"| {tree} | {case} | | | | | {row.get('num_blocks', row.get('error'))} blocks | |")
            elif "error" in row:
                lines.append(f"| {tree} | {case} | {row['error'][:90]} ({row['where']}) | | | | | |")
            else:
                window = (f"{row['draft_window_blocks_present']}/{row['draft_window_blocks_needed']}"
                          if "draft_window_blocks_needed" in row else "")
                lines.append(
                    f"| {tree} | {case} | {row['hash_block']} | {row['turn2_hit']} of {row['shared_prefix']} "
                    f"| {row['turn2_prefill']} of {row['turn2_prompt']} | {window} "
                    f"| {row['free_at_start']}/{row['free_at_end']} | {row['drafts_accepted']} of {row['drafts_scheduled']} |")
    return "\n".join(lines)


def ran(report):
    return {case: row for case, row in report.items()
            if case in CASES and not case.startswith("pin") and "error" not in row}


def test_no_block_leaks_or_double_frees_after_both_turns(reports):
    for tree, report in reports.items():
        for case, row in ran(report).items():
            assert row["free_at_end"] == row["free_at_start"], (tree, case)
            assert row["free_ids_unique"] and row["ref_counts_zero"], (tree, case)


def test_undrafted_turn_2_reuses_up_to_the_last_kda_checkpoint(reports):
    for tree, report in reports.items():
        for case in ("off-sync-roomy", "off-async-roomy"):
            row = report[case]
            assert row["turn2_hit"] == BEST, (tree, case)
            assert row["turn2_prefill"] == row["turn2_prompt"] - BEST, (tree, case)


def test_a_block_aligned_first_prompt_keeps_nothing_for_turn_2_on_0_30_0(reports):
    """vLLM 0.30.0 retains (retention interval 0, its default) the KDA state at the resend's
    boundary only (prompt - 1, floored): on a 2304-aligned prompt that is one block below the
    only state prefill wrote. 0.33.0 and 0.34.0 keep the longer sibling's boundary too,
    drafted or not."""
    assert reports["0.30.0+v11"]["off-sync-roomy-aligned"]["turn2_hit"] == 0
    for tree in ("0.33.0", "0.34.0"):
        for case in ("off-sync-roomy-aligned", "accept-sync-roomy-aligned"):
            assert reports[tree][case]["turn2_hit"] == BEST, (tree, case)


def test_0_33_0_and_0_34_0_drafting_costs_turn_2_nothing(reports):
    """0.33.0 and 0.34.0 mark the drafter's layers (is_draft), give DFlash no trailing-block
    drop and plan the drafter's own group at the attention block: hash block 2304, no EAGLE
    group, the undrafted hit."""
    for tree in ("0.33.0", "0.34.0"):
        report = reports[tree]
        for case in ("accept-sync-roomy", "reject-sync-roomy", "accept-async-roomy", "reject-async-roomy"):
            row = report[case]
            assert row["turn2_hit"] == report["off-sync-roomy"]["turn2_hit"] == BEST, (tree, case)
            assert row["turn2_prefill"] == row["turn2_prompt"] - BEST, (tree, case)
            assert row["draft_window_blocks_present"] == row["draft_window_blocks_needed"] >= 1, (tree, case)
            assert row["hash_block"] == BLOCK and row["eagle_group_ids"] == [], (tree, case)
            assert row["groups"][-1] == f"SlidingWindowSpec/{BLOCK}", (tree, case)


def test_0_34_0_plans_the_drafter_as_0_33_0_does(reports):
    """0.34.0's planner gives the drafter's sliding-window layers their own group at the
    attention block, as 0.33.0's already did: the same groups, and the same pool at the
    launcher's pin (188 blocks with the drafter, 697 without)."""
    old, new = reports["0.33.0"], reports["0.34.0"]
    assert new["accept-sync-roomy"]["groups"] == old["accept-sync-roomy"]["groups"]
    assert new["accept-sync-roomy"]["groups"].count(f"SlidingWindowSpec/{BLOCK}") == 1
    for case in ("pin-target", "pin-drafter"):
        assert new[case]["num_blocks"] == old[case]["num_blocks"], case
    assert new["pin-drafter"]["num_blocks"] < new["pin-target"]["num_blocks"] // 3


def assert_drafting_keeps_the_last_block(row, case):
    """Turn 2 reuses turn 1's prompt to its last 576 boundary, and the drafter's window before
    the hit's end is all there."""
    assert row["eagle_group_ids"] == [], case
    assert row["hash_block"] == HASH_BLOCK, case
    assert row["turn2_hit"] == DRAFTED_BEST, (case, row["turn2_hit"])
    assert row["turn2_prefill"] == row["turn2_prompt"] - DRAFTED_BEST, case
    assert row["draft_window_blocks_present"] == row["draft_window_blocks_needed"] >= 1, case


def test_0_30_0_with_v11_drafting_keeps_the_block_eagle_drops(reports):
    """v11_dflash_block_drop gives DFlash no EAGLE trailing-block drop on 0.30.0: turn 2 hits
    19,584 of 20,060 (16,128 without it: every group treated as EAGLE's, KDA checkpointed one
    2304 block lower). Accepting or rejecting drafts, async or not: the same."""
    report = reports["0.30.0+v11"]
    for case in ("accept-sync-roomy", "reject-sync-roomy", "accept-async-roomy", "reject-async-roomy"):
        assert_drafting_keeps_the_last_block(report[case], case)
    assert report["accept-sync-roomy"]["drafts_accepted"] == report["accept-sync-roomy"]["drafts_scheduled"] > 0
    assert report["reject-sync-roomy"]["drafts_accepted"] == 0 < report["reject-sync-roomy"]["drafts_scheduled"]


def test_0_30_0_with_the_decorator_undone_loses_the_block_again(reports):
    """The planted fault: use_eagle_block_drop giving 0.30.0's stock answer. The check above
    fails on it, and the hit is the one-block loss the patcher exists for."""
    row = reports["0.30.0+v11"][STOCK_DROP_CASE]
    with pytest.raises(AssertionError):
        assert_drafting_keeps_the_last_block(row, STOCK_DROP_CASE)
    assert row["turn2_hit"] == BEST - BLOCK
    assert row["eagle_group_ids"] == list(range(len(row["groups"])))


def test_0_30_0_drafting_on_a_block_aligned_first_prompt_keeps_nothing(reports):
    """Without the drop, drafting meets 0.30.0's retention like the undrafted turn does: one
    first prompt in 2304 (a multiple of 2304) leaves turn 2 nothing (16,128 with the drop)."""
    assert reports["0.30.0+v11"]["accept-sync-roomy-aligned"]["turn2_hit"] == 0


def test_fork_shape_with_v11_refuses_prefix_caching_beside_the_quarter_block_draft_group(reports):
    """The 0.27.1-era engine core sets the cache block to the smallest group's (576): the KDA
    groups then differ from it, hashing falls back to 2304, and the coordinator refuses the
    576-token draft group at start. Undrafted, the fork shape serves turn 2 like 0.30.0."""
    report = reports["fork+v11"]
    for case in ("accept-sync-roomy", "reject-async-roomy", "accept-sync-tight"):
        assert report[case]["error"].startswith("AssertionError: Each KV cache group's real block_size"), case
        assert report[case]["where"].startswith("kv_cache_coordinator.py")


def test_a_tight_pool_evicts_turn_1_and_stays_whole(reports):
    for tree, report in reports.items():
        row = report["off-sync-tight"]
        assert row["num_blocks"] < report["off-sync-roomy"]["num_blocks"] // 10, tree
        assert row["turn2_hit"] % BLOCK == 0 and row["turn2_hit"] <= BEST, tree


def test_fork_shape_with_the_draft_group_at_the_attention_block_starts_and_keeps_the_block(reports):
    """The fork shape's way past its refusal: the drafter's group at 2304. It then starts, and
    v11_dflash_block_drop's scheduler gates keep the block EAGLE's drop costs (18,432; with the
    gates undone, the planted fault, 16,128), at the cost of pool: 148 blocks at the launcher's
    pin instead of v11's 362."""
    report = reports["fork+v11"]
    row = report["accept-sync-roomy-fullblock"]
    assert row["hash_block"] == BLOCK and row["eagle_group_ids"] == [], row
    assert row["turn2_hit"] == BEST and row["turn2_prefill"] == row["turn2_prompt"] - BEST
    assert row["draft_window_blocks_present"] == row["draft_window_blocks_needed"] >= 1
    assert row["free_at_end"] == row["free_at_start"] and row["free_ids_unique"] and row["ref_counts_zero"]
    fault = report["accept-sync-roomy-fullblock-stockdrop"]
    assert fault["turn2_hit"] == BEST - BLOCK and fault["eagle_group_ids"] == list(range(len(fault["groups"])))
    assert report["pin-drafter-fullblock"]["num_blocks"] < report["pin-drafter"]["num_blocks"] // 2
