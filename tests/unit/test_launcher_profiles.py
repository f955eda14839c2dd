"""PROFILE=... picks an overlay of recipe.toml's defaults; each prints the DRY_RUN saved
from the bash launcher for the settings it stands for (tests/unit/fixtures/dry_run/)."""

import pytest

from recipekit import recipe
from tests.unit.launcher_fixtures import PINNED, fixture, normalised
from tests.unit.test_launcher_support import run

# profile -> (extra settings, the fixture it must equal)
PROFILES = {
    "seed-pr": ({}, "seed-pr"),  # the seed's PR-era run: the defaults saved before the move
    "default": ({}, "defaults"),
    "mtp": ({}, "spec-mtp-unpinned"),
    "eager": ({}, "eager-unpinned"),
    # the field's fastest levers this recipe carries (docs/levers.md); NVFP4 target groups
    # need the force outside scripts/compare
    "field-fastest": ({"FORCE_UNSAFE_WEIGHTS": 1, **PINNED}, "field-fastest"),
}


def test_every_profile_is_tested():
    assert set(PROFILES) == set(recipe.load().profiles)


@pytest.mark.parametrize("profile", PROFILES)
def test_profile_prints_its_saved_dry_run(tmp_path, profile):
    settings, name = PROFILES[profile]
    result = run(tmp_path, PROFILE=profile, **settings)
    assert result.returncode == 0 and result.stderr == "", result.stderr
    assert normalised(result.stdout, tmp_path) == fixture(name)


def test_the_environment_wins_over_the_profile(tmp_path):
    result = run(tmp_path, PROFILE="mtp", SPEC="off", **PINNED)
    assert result.returncode == 0, result.stderr
    assert normalised(result.stdout, tmp_path) == fixture("spec-off")


def test_a_profile_may_come_from_cluster_env(tmp_path):
    cluster = tmp_path / "cluster.env"
    cluster.write_text("PROFILE=eager\n")
    result = run(tmp_path, CLUSTER_ENV=cluster, **PINNED)
    assert result.returncode == 0, result.stderr
    assert normalised(result.stdout, tmp_path) == fixture("eager")


def test_a_profile_overlays_only_knobs():
    data = recipe.tomllib.loads((recipe.RECIPE_PATH).read_text())
    data["profiles"]["mtp"]["NO_SUCH_KNOB"] = "1"
    with pytest.raises(recipe.RecipeError, match=r"\[profiles.mtp\] sets NO_SUCH_KNOB"):
        recipe.parse(data)
