"""What recipe.toml says each knob drives is what the plan writes: every flag and variable
of a rank has an owner in the recipe (a knob, or [fixed]), and every flag and variable a
knob declares shows up on some rank."""

import pytest

from launcher.plan import plan
from launcher.plan.load import load
from recipekit import recipe
from tests.unit.test_launcher_support import REPO, launcher_env

SETTINGS = [
    {}, {"ENFORCE_EAGER": "1"}, {"HF_TOKEN_FILE": "/tok"}, {"SPEC": "mtp"},
    {"TOOL_CALL_PARSER": "none", "JIT_CACHE": "none"}, {"GENERATION_CONFIG": '{"top_k": 2}'},
    {"TARGET_WEIGHT_GROUPS_INT8": "shared,mla,kda_o,kda_in,lm_head", "INT_GROUP_SIZE": "64",
     "TARGET_WEIGHT_FORMAT": "nvfp4", "FORCE_UNSAFE_WEIGHTS": "1", "DRAFT_WEIGHTS": "nvfp4"},
    {"KPOOL_TAIL_FIX": "1", "ROUTER_FP32": "1", "INDEXER_WS_FACTOR": "1", "SKIP_MTP_WEIGHTS": "1"},
    {"ADAPTIVE_VERIFY_TAU": "1.0", "ADAPTIVE_VERIFY_MAX": "3"},
]


def ranks(tmp_path, **settings):
    checked = load(launcher_env(tmp_path, **settings))
    return plan.build(checked, plan.nodes_of(checked), REPO).ranks


def flags_of(rank):
    return {word for word in rank.serve if word.startswith("--")}


@pytest.mark.parametrize("settings", SETTINGS, ids=str)
def test_every_flag_and_variable_has_an_owner(tmp_path, settings):
    the_recipe = recipe.load()
    for rank in ranks(tmp_path, **settings):
        assert flags_of(rank) <= set(the_recipe.flag_owners())
        assert set(rank.env) <= set(the_recipe.env_owners())


def test_every_declared_flag_and_variable_appears(tmp_path):
    seen_flags, seen_env = set(), set()
    for settings in SETTINGS:
        for rank in ranks(tmp_path, **settings):
            seen_flags |= flags_of(rank)
            seen_env |= set(rank.env)
    the_recipe = recipe.load()
    assert set(the_recipe.flag_owners()) == seen_flags
    assert set(the_recipe.env_owners()) == seen_env


def test_the_built_knobs_are_knobs():
    knobs = recipe.load().knobs
    assert plan.BUILT_HERE <= set(knobs)
    # What is not built here must be passable as is: one flag at most.
    for knob in knobs.values():
        if knob.name not in plan.BUILT_HERE:
            assert len(knob.flags) <= 1, knob.name
