"""docs/levers.md's lines, as recipe.toml's [levers] holds them: each carried lever's
scripts/compare sides load exactly as run.sh would load them (so its line runs), a lever
names only real knobs and either sides or why it is not carried, and the fastest profile's
line judges it against the defaults."""

from __future__ import annotations

import tomllib

import pytest

from launcher.plan import render
from compare import sides
from recipekit import recipe
from tests.unit.test_compare_sides import environ  # noqa: F401 (a fixture)
from tests.unit.test_launcher_support import REPO

LEVERS = recipe.load().levers


@pytest.mark.parametrize("name", [name for name, lever in LEVERS.items()
                                  if not lever.not_carried])
def test_each_carried_levers_sides_load_as_run_sh_loads_them(environ, name):  # noqa: F811
    lever = LEVERS[name]
    reference = sides.load("reference", lever.reference)
    candidate = sides.load("candidate", lever.candidate)
    assert sides.differing(reference, candidate), f"{name}: the sides are the same settings"


def test_the_fastest_profiles_line_lifts_only_what_its_gate_judges(environ):  # noqa: F811
    candidate = sides.load("candidate", f"PROFILE={render.FASTEST_PROFILE}")
    reference = sides.load("reference", "")
    assert candidate.lifted == ["FORCE_UNSAFE_WEIGHTS"]
    assert set(sides.differing(reference, candidate)) == {
        "MOE_BACKEND", "TARGET_WEIGHT_FORMAT", "COMPACT_MEMORY", "GPU_CLOCK_MHZ",
        "FORCE_UNSAFE_WEIGHTS"}
    text = (REPO / "docs" / "levers.md").read_text()
    assert "scripts/compare --reference '' --candidate PROFILE=field-fastest\n" in text


def parsed(change):
    data = tomllib.loads(recipe.RECIPE_PATH.read_text())
    change(data["levers"])
    return recipe.parse(data)


@pytest.mark.parametrize("change, why", [
    (lambda levers: levers["b12x"].update(candidate="MOE_BAKEND=b12x"),
     "[levers.b12x] candidate word 'MOE_BAKEND=b12x': a profile or NAME=VALUE of a knob"),
    (lambda levers: levers["b12x"].update(not_carried="no"),
     "[levers.b12x]: give compare sides (reference, candidate) or not_carried, one of them"),
    (lambda levers: levers["dcp"].update(not_carried=""),
     "[levers.dcp]: give compare sides (reference, candidate) or not_carried, one of them"),
    (lambda levers: levers["k"].update(sources=["nowhere"]),
     "[levers.k] sources = ['nowhere']: name keys of [sources]"),
])
def test_a_lever_that_cannot_be_judged_or_cited_is_a_recipe_error(change, why):
    with pytest.raises(recipe.RecipeError) as error:
        parsed(change)
    assert str(error.value) == f"recipe.toml: {why}"


def test_a_changed_lever_makes_the_render_stale():
    changed = parsed(lambda levers: levers["compaction"].update(measured="another figure"))
    text = (REPO / "docs" / "levers.md").read_text()
    assert render.rendered(text, changed, render.REGIONS["docs/levers.md"]) != text
