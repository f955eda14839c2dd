"""Every patcher's answer on every tested tree (applied, provided or refused with its reason),
run in the images' order on one private copy per tree, equals patches/layer-outcomes.json:
the data docs/images.md's per-layer, per-tree table is rendered from (scripts/render-docs).

GLM53_WRITE_LAYER_OUTCOMES=1 rewrites the file from this run instead of comparing.
"""

import json
import os
import re
import shutil

import pytest

from launcher.plan.render import LAYER_OUTCOMES
from recipekit.flashinfer_sources import flashinfer_tree
from recipekit.layers import PATCHERS, load_layer, run_layer
from recipekit.vllm_sources import known_trees

# The images' order: each Dockerfile runs its layer, then the patchers named after it.
CHAIN = ("v8", "v8_moe_scales", "v8_linear_scales", "v8_api_key", "v9", "v10", "v11",
         "v11_dflash_block_drop", "v13", "v13_weights")
TREES = ("0.27.1", "fork", "0.30.0", "0.33.0", "0.34.0")
# The FlashInfer each tree's image carries beside vLLM, so that v8's F1-F3 answer too: the
# fork set's 0.6.18, 0.33.0's own 0.7.2.post1, and for 0.34.0 (0.7.3, not on PyPI) 0.7.4
FLASHINFER = {"fork": "0.6.18", "0.30.0": "0.6.18", "0.33.0": "0.7.2.post1", "0.34.0": "0.7.4"}
_GROUPS = re.compile(r" \[([^\]]*)\]$")


def cell(result) -> str:
    """The table's words for one result: the outcome, and for a refusal its first clause."""
    reason = result.reason.splitlines()[0] if result.reason else ""
    if result.outcome == "refused":
        return "refused: " + reason.split("; ")[0]
    groups = _GROUPS.search(reason)
    return result.outcome + (f" ({groups[1]})" if groups else "")


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory, release):
    """{tree: {patcher: cell}}, each tree patched in CHAIN order (a refusal writes nothing)."""
    table = {}
    for tree in TREES:
        root = tmp_path_factory.mktemp(f"chain-{tree}")
        shutil.copytree(release(tree) / "vllm", root / "vllm", copy_function=os.link)
        if tree in FLASHINFER:
            shutil.copytree(flashinfer_tree(FLASHINFER[tree]) / "flashinfer", root / "flashinfer",
                            copy_function=os.link)
        table[tree] = {name: cell(run_layer(load_layer(name), root, import_check="off")) for name in CHAIN}
    return table


def test_the_chain_covers_every_patcher_and_every_tree():
    assert sorted(CHAIN) == sorted(PATCHERS)
    assert set(known_trees()) - set(TREES) == {"0.28.0"}  # v9's source release, not a base


def test_every_patcher_gives_one_of_three_answers_on_every_tree(outcomes):
    for tree, cells in outcomes.items():
        for name, text in cells.items():
            assert text.split(" ")[0].rstrip(":") in ("applied", "provided-by-base", "refused"), (tree, name, text)


def test_the_recorded_outcomes_are_this_run_s(outcomes):
    fresh = {"trees": list(TREES), "chain": list(CHAIN),
             "cells": {name: {tree: outcomes[tree][name] for tree in TREES} for name in CHAIN}}
    if os.environ.get("GLM53_WRITE_LAYER_OUTCOMES") == "1":
        LAYER_OUTCOMES.write_text(json.dumps(fresh, indent=1) + "\n")
    recorded = json.loads(LAYER_OUTCOMES.read_text())
    assert recorded == fresh, (
        "patches/layer-outcomes.json is stale: rerun this file with GLM53_WRITE_LAYER_OUTCOMES=1, "
        "then scripts/render-docs")


def test_0340_gives_the_answers_its_code_supports(outcomes):
    """Checked in 0.34.0's own code (issue 39): DFlash2 upstream via the speculator registry,
    v10, v11, the block drop and v13's kpool-tail and indexer-ws provided; v8 with every
    change (its package set, patches/v8/packages-vllm-0.34.0.txt, asks the base for FlashInfer
    0.7.3); the MoE scale fix, router-fp32, adaptive verify, skip-mtp-weights and weight
    groups applied."""
    cells = outcomes["0.34.0"]
    assert cells["v8"] == ("applied (applied: D1 D2a D2b D2c D4 V7a V7b V7c F1 F2 F3; "
                           "present: D2e)")
    for name in ("v9", "v10", "v11", "v11_dflash_block_drop"):
        assert cells[name] == "provided-by-base", name
    assert cells["v13"] == ("applied (provided: kpool-tail indexer-ws; "
                            "applied: router-fp32 adaptive-verify skip-mtp-weights)")
    assert cells["v8_moe_scales"] == cells["v8_linear_scales"] == cells["v13_weights"] == "applied"
