"""Base images pinned by image ID in recipe.toml's [pins]: what scripts/build.sh refuses and
what --accept-base writes (recipekit/recipe.py; the build's side is tests/image/test_chain.py)."""

from __future__ import annotations

import pytest

from recipekit import recipe

VENDOR = "vllm/vllm-openai:glm53-flash-arm64-cu130"
OLD = "sha256:" + "a" * 64
NEW = "sha256:" + "b" * 64


def copy_of_recipe(tmp_path):
    path = tmp_path / "recipe.toml"
    path.write_text(recipe.RECIPE_PATH.read_text())
    return path


def test_the_vendor_image_is_pinned_and_the_model_pins_stay_model_pins():
    loaded = recipe.load()
    assert loaded.knobs["BASE_IMAGE"].default == VENDOR
    assert VENDOR in loaded.image_pins
    assert VENDOR not in loaded.pins
    assert "LibertAIDAI/GLM-5.3-Flash-NVFP4" in loaded.pins


def test_a_base_whose_tag_moved_is_refused_with_both_ids_and_the_command(tmp_path):
    path = copy_of_recipe(tmp_path)
    recipe.accept_image_pin(path, VENDOR, OLD)
    pinned = recipe.load(path)
    assert pinned.image_pin_refusal(VENDOR, OLD) == ""
    assert pinned.image_pin_refusal("unpinned:tag", NEW) == ""
    moved = pinned.image_pin_refusal(VENDOR, NEW)
    assert moved == (f"image_id {OLD}, but the tag now names {NEW} (it moved); check what changed, "
                     "then accept it with scripts/build.sh --accept-base")


def test_the_shipped_vendor_pin_refuses_until_accepted():
    loaded = recipe.load()
    accepted = loaded.image_pins[VENDOR][0]
    if accepted:
        assert loaded.image_pin_refusal(VENDOR, accepted) == ""
        assert loaded.image_pin_refusal(VENDOR, NEW) != ""
    else:
        assert "no image ID accepted yet" in loaded.image_pin_refusal(VENDOR, NEW)


def test_accepting_rewrites_only_the_pin_line(tmp_path):
    path = copy_of_recipe(tmp_path)
    before = path.read_text().splitlines()
    recipe.accept_image_pin(path, VENDOR, NEW)
    after = path.read_text().splitlines()
    changed = [(old, new) for old, new in zip(before, after) if old != new]
    assert len(before) == len(after) and len(changed) == 1
    assert changed[0][1] == f'"{VENDOR}" = {{ image_id = "{NEW}", source = "site" }}'
    assert recipe.load(path).image_pins[VENDOR] == (NEW, "site")
    assert recipe.load(path).image_pin_refusal(VENDOR, NEW) == ""


def test_accepting_another_base_adds_its_pin_inside_pins(tmp_path):
    path = copy_of_recipe(tmp_path)
    recipe.accept_image_pin(path, "site/base:1", OLD)
    loaded = recipe.load(path)
    assert loaded.image_pins["site/base:1"] == (OLD, "site")
    assert loaded.pins == recipe.load().pins
    assert loaded.knobs == recipe.load().knobs


def test_a_malformed_pin_or_id_is_refused(tmp_path):
    with pytest.raises(recipe.RecipeError, match="is not an image ID"):
        recipe.accept_image_pin(copy_of_recipe(tmp_path), VENDOR, "latest")
    path = copy_of_recipe(tmp_path)
    path.write_text(path.read_text().replace(f'"{VENDOR}" = {{ image_id = ""', f'"{VENDOR}" = {{ image_id = "abc"'))
    with pytest.raises(recipe.RecipeError, match=r'\[pins\] "vllm/vllm-openai:glm53-flash-arm64-cu130" image_id'):
        recipe.load(path)
