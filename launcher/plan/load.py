"""This checkout's settings, checked: the repository root, and recipe.toml read with the
environment, cluster.env and the profile over it, then checked as run.sh checks them. What
the launcher's commands and scripts/compare (compare/) both start from."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from launcher.plan import checks, model_heads, user_settings
from launcher.plan.drafter import sliding
from launcher.plan.settings import resolve
from recipekit import recipe

ROOT = Path(__file__).resolve().parents[2]


def cluster_file(environ: Mapping[str, str]) -> Path:
    """The cluster.env the settings read: CLUSTER_ENV, else the checkout's."""
    return Path(environ.get("CLUSTER_ENV") or ROOT / "cluster.env")


def load(environ=None, only=None, the_recipe=None) -> checks.Checked:
    """The checked settings of this checkout: environment, cluster.env, profile, recipe
    (THE_RECIPE: another recipe than recipe.toml, for tests); ONLY: the knobs a command
    needs, checked alone (stop.sh's)."""
    environ = os.environ if environ is None else environ
    the_recipe = the_recipe or recipe.load()
    cluster = cluster_file(environ)
    named = user_settings.set_by_name(the_recipe, environ, cluster)
    if only is None:
        user_settings.check_environment(the_recipe, environ)
    values = resolve(the_recipe, environ, cluster)
    if only is None:
        user_settings.check_applicable(the_recipe, values, named)
    checked = checks.check(the_recipe, values, ROOT, environ.get("HOME", ""), only)
    if only is None:
        user_settings.check_window(checked.values, named, sliding(checked.drafter))
        model_heads.check(checked)
    return checked
