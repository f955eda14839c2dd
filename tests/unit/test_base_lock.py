"""recipe.lock (recipekit/baselock.py): the base images a host trusted, by image ID, beside the
recipe; what it refuses and what recording writes. The build's use of it is
tests/unit/test_build_base.py, the launcher's tests/unit/test_launcher_base_lock.py, the
whole first run tests/image/test_first_run.py."""

from __future__ import annotations

import subprocess

import pytest

from recipekit import baselock, recipe
from recipekit.baselock import BaseLock, LockError

VENDOR = "vllm/vllm-openai:glm53-flash-arm64-cu130"
OLD = "sha256:" + "a" * 64
NEW = "sha256:" + "b" * 64
DIGEST = "sha256:" + "d" * 64


def test_the_lock_lives_beside_the_recipe_and_the_repository_ships_none():
    assert baselock.lock_path(recipe.RECIPE_PATH) == recipe.REPO / "recipe.lock"
    tracked = subprocess.run(["git", "-C", str(recipe.REPO), "ls-files", "recipe.lock"],
                             capture_output=True, text=True, check=True).stdout
    assert tracked == ""
    ignored = subprocess.run(["git", "-C", str(recipe.REPO), "check-ignore", "-q", "recipe.lock"],
                             check=False)
    assert ignored.returncode == 0, "a first run would leave the clone with an untracked file"


def test_recipe_toml_pins_checkpoints_only():
    loaded = recipe.load()
    assert loaded.knobs["BASE_IMAGE"].default == VENDOR
    assert VENDOR not in loaded.pins and "LibertAIDAI/GLM-5.3-Flash-NVFP4" in loaded.pins
    assert "image_id" not in recipe.RECIPE_PATH.read_text()
    assert loaded.knobs["BASE_LOCK"].choices == (baselock.FIRST_USE, baselock.STRICT)
    assert loaded.knobs["BASE_LOCK"].default == baselock.FIRST_USE


def test_an_image_pin_in_recipe_toml_is_refused_naming_the_lock(tmp_path):
    path = tmp_path / "recipe.toml"
    path.write_text(recipe.RECIPE_PATH.read_text().replace(
        "[pins]\n", f'[pins]\n"{VENDOR}" = {{ image_id = "{OLD}", source = "site" }}\n', 1))
    with pytest.raises(recipe.RecipeError, match=r"base images are trusted by image ID in recipe\.lock"):
        recipe.load(path)


def test_no_lock_is_an_empty_lock(tmp_path):
    lock = BaseLock.read(tmp_path / "recipe.lock")
    assert lock.images == {}
    assert lock.moved(VENDOR, NEW, VENDOR) == ""
    assert lock.unrecorded(VENDOR, NEW, baselock.FIRST_USE, VENDOR) == ""


def test_recording_writes_a_lock_toml_reads_back_and_keeps_the_other_entries(tmp_path):
    path = tmp_path / "recipe.lock"
    BaseLock.read(path).record("site/base:1", OLD, "", "accepted")
    lock = BaseLock.read(path)
    lock.record(VENDOR, OLD, DIGEST, "first use")
    again = BaseLock.read(path)
    assert list(again.images) == ["site/base:1", VENDOR]
    assert again.images[VENDOR].image_id == OLD and again.images[VENDOR].digest == DIGEST
    assert again.images[VENDOR].how == "first use"
    assert again.images["site/base:1"] == lock.images["site/base:1"]
    again.record(VENDOR, NEW, "", "accepted")
    rewritten = BaseLock.read(path).images
    assert (rewritten[VENDOR].image_id, rewritten[VENDOR].digest) == (NEW, "")
    assert rewritten["site/base:1"].image_id == OLD
    assert path.read_text().startswith("# The base images this host trusted")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["recipe.lock"]  # no staged file left


def test_a_tag_that_moved_is_refused_with_both_ids_and_the_command(tmp_path):
    lock = BaseLock.read(tmp_path / "recipe.lock")
    lock.record(VENDOR, OLD, "", "first use")
    lock.record("site/base:1", OLD, "", "accepted")
    assert lock.moved(VENDOR, OLD, VENDOR) == ""
    assert lock.moved(VENDOR, "", VENDOR) == ""  # not on this host: nothing to compare
    assert lock.moved("other/image:1", NEW, VENDOR) == ""  # a base the lock does not hold
    assert lock.moved(VENDOR, NEW, VENDOR) == (
        f"{tmp_path / 'recipe.lock'} records {OLD}, but the tag now names {NEW} (it moved); check "
        "what changed, then accept it with scripts/build.sh --accept-base")
    assert lock.moved("site/base:1", NEW, VENDOR).endswith(
        "accept it with scripts/build.sh --accept-base --base site/base:1")


def test_strict_refuses_only_a_first_use(tmp_path):
    lock = BaseLock.read(tmp_path / "recipe.lock")
    assert lock.unrecorded(VENDOR, "", baselock.FIRST_USE, VENDOR) == ""
    assert lock.unrecorded(VENDOR, NEW, baselock.STRICT, VENDOR) == (
        f"{tmp_path / 'recipe.lock'} records no image ID for {VENDOR}, whose tag names {NEW} here, "
        "and BASE_LOCK=strict records none on first use; check the image, then record it with "
        "scripts/build.sh --accept-base (or commit the site's recipe.lock)")
    lock.record(VENDOR, NEW, "", "accepted")
    assert lock.unrecorded(VENDOR, NEW, baselock.STRICT, VENDOR) == ""


@pytest.mark.parametrize("text, says", [
    ("[images\n", "recipe.lock: "),
    (f'[images."{VENDOR}"]\nimage_id = "latest"\n', 'image_id = "latest"'),
    (f'[images."{VENDOR}"]\nimage_id = "{OLD}"\ndigest = "v1"\n', 'digest = "v1"'),
])
def test_a_malformed_lock_is_refused_in_one_line_naming_it(tmp_path, text, says):
    path = tmp_path / "recipe.lock"
    path.write_text(text)
    with pytest.raises(LockError) as raised:
        BaseLock.read(path)
    assert str(path) in str(raised.value) and says in str(raised.value)
    assert "\n" not in str(raised.value)


def test_only_image_ids_and_digests_are_recorded(tmp_path):
    lock = BaseLock.read(tmp_path / "recipe.lock")
    with pytest.raises(LockError, match="is not an image ID"):
        lock.record(VENDOR, "latest", "", "accepted")
    assert not (tmp_path / "recipe.lock").exists()


def _record_after_both_read(path, ref, image_id, barrier):
    """One first-use build's record: it reads the lock, waits until the other build has
    read it too, then records its own entry (run in its own process)."""
    lock = BaseLock.read(path)
    barrier.wait(timeout=60)
    lock.record(ref, image_id, "", "first use")


def test_two_first_use_records_at_once_keep_both_entries(tmp_path):
    """Two builds that each read the lock before either wrote it (issue 35, finding 7): both
    entries survive, because a record re-reads the lock under a file lock before it writes.
    Reading before the barrier makes the interleaving certain, not a matter of timing."""
    import multiprocessing

    path = tmp_path / "recipe.lock"
    context = multiprocessing.get_context("fork")
    barrier = context.Barrier(2)
    builds = [context.Process(target=_record_after_both_read, args=(path, ref, image_id, barrier))
              for ref, image_id in ((VENDOR, OLD), ("site/base:1", NEW))]
    for build in builds:
        build.start()
    for build in builds:
        build.join(timeout=60)
    assert [build.exitcode for build in builds] == [0, 0]
    images = BaseLock.read(path).images
    assert sorted(images) == sorted([VENDOR, "site/base:1"]), images
    assert (images[VENDOR].image_id, images["site/base:1"].image_id) == (OLD, NEW)


def test_a_first_use_that_another_build_recorded_meanwhile_is_not_rewritten(tmp_path):
    """A first use whose entry another build wrote since this one read the lock keeps that
    entry when the IDs agree, and is refused when they differ (the tag moved in between)."""
    for image_id in (OLD, NEW):
        path = tmp_path / f"{image_id[7]}.lock"
        late = BaseLock.read(path)  # read before the other build wrote
        BaseLock.read(path).record(VENDOR, OLD, DIGEST, "first use")  # the other build
        if image_id == OLD:
            assert late.record(VENDOR, OLD, "", "first use").digest == DIGEST
        else:
            with pytest.raises(LockError, match="another build recorded"):
                late.record(VENDOR, NEW, "", "first use")
        trusted = BaseLock.read(path).images[VENDOR]
        assert (trusted.image_id, trusted.digest) == (OLD, DIGEST)
