"""MOE_BACKEND=b12x as a measured choice: accepted by the settings, and refused before any
rank starts unless the serving image's labels list the b12x package its layer v8 installed
(v8 installs it only on a base whose vLLM names it: patches/v8/packages-vllm-*.txt). Each
other backend is refused with its own reason (tests/unit/test_launcher_refusals.py)."""

from __future__ import annotations

import json

from launcher.plan import image_base
from recipekit import recipe, sm121_packages
from tests.unit.test_launcher_image_base import labelled_cluster, quick_serve
from tests.unit.test_launcher_lifecycle import IMAGE, containers, started
from tests.unit.test_launcher_support import dry_run

V8_0330 = {image_base.BASE_VLLM_LABEL: "0.30.0", image_base.PROVIDED_LABEL: "v9",
           image_base.PACKAGES_LABEL: "flashinfer-python==0.6.18,b12x==1.3.0,"
                                      "nvidia-nccl-cu13==2.30.7"}
FORK = {image_base.BASE_VLLM_LABEL: "0.1.dev20051+g487ecf187", image_base.PROVIDED_LABEL: "",
        image_base.PACKAGES_LABEL: "flashinfer-python==0.6.18,nvidia-nccl-cu13==2.30.7"}
ACCEPTED = ("accepted: marlin, an IMAGE the chain built on such a base, or FORCE_UNSAFE_MOE=1 to "
            "pass it as asked")


def refusal(labels):
    found = image_base.b12x_refusal(IMAGE, image_base.parse(json.dumps(labels)), "b12x", False)
    return found.line if found else None


def test_the_packages_label_says_which_b12x_the_image_carries():
    assert image_base.carried(image_base.parse(json.dumps(V8_0330)), "b12x") == "1.3.0"
    assert image_base.carried(image_base.parse(json.dumps(FORK)), "b12x") == ""


def test_b12x_is_refused_on_an_image_without_it_and_passed_with_it_or_forced():
    assert refusal(V8_0330) is None
    assert refusal(FORK) == (
        f"refused: MOE_BACKEND=b12x: IMAGE={IMAGE} is built on vLLM 0.1.dev20051+g487ecf187, and "
        "its layer v8 installed no b12x package (v8 installs the release a base's vLLM names for "
        "its b12x extra, on vLLM 0.30.0, 0.33.0 and 0.34.0; the vendor fork's vLLM has no b12x "
        f"backend); {ACCEPTED}")
    assert refusal(None) == (
        f"refused: MOE_BACKEND=b12x: IMAGE={IMAGE} has no labels of the image chain, so nothing "
        f"says it carries the b12x package; {ACCEPTED}")
    unknown = image_base.parse("null")
    assert image_base.b12x_refusal(IMAGE, unknown, "b12x", forced=True) is None
    assert image_base.b12x_refusal(IMAGE, unknown, "marlin", forced=False) is None


def test_a_run_on_the_fork_image_is_refused_before_any_rank_starts(tmp_path):
    state = labelled_cluster(tmp_path, FORK)
    result = quick_serve(tmp_path, state, MOE_BACKEND="b12x")
    assert result.returncode == 2
    assert result.stderr.splitlines()[-1].startswith("refused: MOE_BACKEND=b12x: IMAGE=")
    assert started(state) == [] and containers(state, "head") == {}


def test_a_run_on_an_image_carrying_b12x_serves_it(tmp_path):
    state = labelled_cluster(tmp_path, V8_0330)
    result = quick_serve(tmp_path, state, MOE_BACKEND="b12x")
    assert result.returncode == 0, result.stderr
    argv = started(state)[0]["argv"]
    assert argv[argv.index("--moe-backend") + 1] == "b12x"


def test_dry_run_says_what_the_label_step_refuses(tmp_path):
    assert ("MOE_BACKEND=b12x refused unless its glm53.packages lists b12x (layer v8 installs it "
            "on bases of vLLM 0.30.0, 0.33.0 and 0.34.0)") in dry_run(tmp_path, MOE_BACKEND="b12x")
    assert "b12x refused" not in dry_run(tmp_path, MOE_BACKEND="b12x", FORCE_UNSAFE_MOE=1)


def test_the_recipe_names_every_base_v8_carries_b12x_on():
    sets = recipe.load().knobs["MOE_BACKEND"].sets
    assert all(version in sets for version in sm121_packages.B12X_EXTRA)
