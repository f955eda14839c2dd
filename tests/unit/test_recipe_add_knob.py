"""Adding a knob is one recipe.toml entry: docs/recipe.md's example, added to a copy of the
recipe, reaches every rank, is checked by its type, is refused in EXTRA_ENV, and leaves
PROFILE=seed-pr printing the DRY_RUN saved before the launcher moved to Python."""

import tomllib

import pytest

from launcher.apply import steps
from launcher.plan import plan, render
from launcher.plan.load import load
from launcher.plan.settings import Refused
from recipekit import recipe
from tests.unit.launcher_fixtures import PINNED, fixture, normalised
from tests.unit.test_launcher_support import REPO, launcher_env, sealed_bin


def with_new_knobs():
    """recipe.toml plus the example lever of docs/recipe.md and a new `vllm serve` flag."""
    data = tomllib.loads(recipe.RECIPE_PATH.read_text())
    data["sources"]["seed-v13"] = {"title": "the seed's v13 layer"}
    data["knobs"]["EXAMPLE_LEVER"] = {
        "type": "flag", "default": 1, "env": ["GLM53_EXAMPLE_LEVER"],
        "sets": "`1`: an image layer's example switch on",
        "why": "the example of docs/recipe.md", "source": "seed-v13"}
    data["knobs"]["MAX_NUM_BATCHED_TOKENS"] = {
        "type": "int", "min": 1, "max": 1048576, "optional": True, "default": "",
        "flag": ["--max-num-batched-tokens"], "sets": "`--max-num-batched-tokens`",
        "why": "vLLM's own default", "source": "vllm"}
    data["profiles"]["seed-pr"]["EXAMPLE_LEVER"] = 0
    return recipe.parse(data)


def dry_run_text(tmp_path, the_recipe, **settings):
    env = launcher_env(tmp_path, **settings)
    checked = load(env, the_recipe=the_recipe)
    the_plan = plan.build(checked, plan.nodes_of(checked), REPO)
    return the_plan, normalised(steps.render(the_plan.launch.nodes, steps.run_steps(the_plan)),
                                tmp_path)


@pytest.fixture(autouse=True)
def sealed_path(tmp_path, monkeypatch):
    # DRY_RUN's meter depends on pv being on PATH; the fixtures were made without it.
    monkeypatch.setenv("PATH", str(sealed_bin(tmp_path)))


def test_the_new_variable_reaches_every_rank(tmp_path):
    the_plan, _ = dry_run_text(tmp_path, with_new_knobs(), **PINNED)
    for rank in the_plan.ranks:
        assert rank.env["GLM53_EXAMPLE_LEVER"] == "1"
        # after the link's, before rank 0's API key file (an --env-file, not a knob's --env)
        knob_options = [o for o in rank.options if o[0] != "--env-file"]
        assert knob_options[-1] == ("--env", "GLM53_EXAMPLE_LEVER=1")
        assert "--max-num-batched-tokens" not in rank.serve  # optional and empty: left out


def test_the_new_flag_is_passed_as_is(tmp_path):
    the_plan, _ = dry_run_text(tmp_path, with_new_knobs(), MAX_NUM_BATCHED_TOKENS=8192, **PINNED)
    serve_argv = the_plan.ranks[1].serve
    at = serve_argv.index("--max-num-batched-tokens")
    assert serve_argv[at + 1] == "8192"
    assert serve_argv[at - 2] == "--override-generation-config"  # after the chat flags
    assert serve_argv[at + 2] == "--nnodes"


@pytest.mark.parametrize("settings, line", [
    ({"EXAMPLE_LEVER": "2"}, "refused: EXAMPLE_LEVER=2: accepted: 0 | 1"),
    ({"MAX_NUM_BATCHED_TOKENS": "0"},
     "refused: MAX_NUM_BATCHED_TOKENS=0: accepted: an integer 1..1048576"),
    ({"EXTRA_ENV": "GLM53_EXAMPLE_LEVER=0"},
     "refused: EXTRA_ENV=GLM53_EXAMPLE_LEVER=0: the launcher sets GLM53_EXAMPLE_LEVER: set "
     "from EXAMPLE_LEVER; set that instead"),
    ({"EXTRA_ARGS": "--max-num-batched-tokens 1"},
     "refused: EXTRA_ARGS=--max-num-batched-tokens 1: --max-num-batched-tokens would override "
     "--max-num-batched-tokens, which the launcher sets: set from MAX_NUM_BATCHED_TOKENS; set "
     "that instead"),
])
def test_the_new_knobs_are_checked(tmp_path, settings, line):
    with pytest.raises(Refused) as refused:
        load(launcher_env(tmp_path, **settings), the_recipe=with_new_knobs())
    assert refused.value.line == line


def test_seed_pr_still_prints_the_saved_dry_run(tmp_path):
    _, text = dry_run_text(tmp_path, with_new_knobs(), PROFILE="seed-pr")
    assert text == fixture("seed-pr")
    # ... and the default profile, with the lever on, does not.
    _, text = dry_run_text(tmp_path, with_new_knobs())
    assert text != fixture("defaults") and "GLM53_EXAMPLE_LEVER=1" in text


def test_the_new_knobs_are_in_the_rendered_tables():
    table = render.knobs_table(with_new_knobs())
    assert "| `EXAMPLE_LEVER` | `1` | `0` \\| `1` | `GLM53_EXAMPLE_LEVER` |" in table
    assert "| `MAX_NUM_BATCHED_TOKENS` | — | 1..1048576, or empty | `--max-num-batched-tokens` |" in table
