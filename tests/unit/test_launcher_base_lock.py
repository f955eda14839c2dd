"""run.sh and recipe.lock (recipekit/baselock.py), against fake docker and ssh: a vendor tag
that moved is refused before anything is built or started, BASE_LOCK=strict refuses a first
use before the build, and the build's own refusal (scripts/build.sh exit 4: the vendor image
cannot be pulled) is the run's one line. A refused run leaves the lock, the images and the
containers as they were (an earlier run's exited rank included).

Each test runs a copy of this checkout (tests/checkout.py), so that its recipe.lock and its
scripts/build.sh (a stub here: the real one is the image tier's, tests/image/test_first_run.py)
are its own.
"""

import json

import pytest

from recipekit.baselock import BaseLock
from tests.checkout import copy_checkout
from tests.unit.test_launcher_lifecycle import (
    IMAGE,
    IMAGE_ID,
    calls,
    containers,
    make_cluster,
    serve,
    started,
)

VENDOR = "vllm/vllm-openai:glm53-flash-arm64-cu130"
OLD = "sha256:" + "a" * 64
NEW = "sha256:" + "b" * 64
BUILD_STUB = """#!/usr/bin/env bash
# scripts/build.sh's stand-in: records its argv, says FAKE_BUILD_SAYS, exits FAKE_BUILD_EXIT.
printf '%s\\n' "$*" >>"$FAKE_DOCKER_STATE/build-calls"
[[ -z ${FAKE_BUILD_SAYS:-} ]] || echo "$FAKE_BUILD_SAYS" >&2
exit "${FAKE_BUILD_EXIT:-1}"
"""


@pytest.fixture
def head(tmp_path):
    """A copy of this checkout with a stub scripts/build.sh: its root."""
    root = copy_checkout(tmp_path / "checkout")
    (root / "scripts" / "build.sh").write_text(BUILD_STUB)
    return root


def cluster(tmp_path, images, leftover=False):
    """Fake docker state: IMAGES on the head (the worker has IMAGE), and with LEFTOVER an
    exited rank an earlier run kept for its logs."""
    state = make_cluster(tmp_path, head_images=images)
    if leftover:
        head_file = state / "head.json"
        head_state = json.loads(head_file.read_text())
        head_state["containers"]["glm53-rank0"] = {"labels": ["glm53.launcher=serve"],
                                                   "status": "exited", "argv": [], "inspects": 0}
        head_file.write_text(json.dumps(head_state))
    return state


def builds(state):
    path = state / "build-calls"
    return path.read_text().splitlines() if path.exists() else []


def trust(root, image_id):
    lock = root / "recipe.lock"
    BaseLock.read(lock).record(VENDOR, image_id, "", "first use")
    return lock.read_bytes()


def test_a_moved_vendor_tag_is_refused_before_anything_is_built_or_started(tmp_path, head):
    before = trust(head, OLD)
    state = cluster(tmp_path, {IMAGE: {"id": IMAGE_ID, "size": 4096},
                               VENDOR: {"id": NEW, "size": 4096}}, leftover=True)
    result = serve(tmp_path, state, root=head, SPEC="off", FAKE_CURL_READY_AFTER=1)
    assert result.returncode == 2
    assert result.stderr == (
        f"refused: BASE_IMAGE={VENDOR}: recipe.lock records {OLD}, but the tag now names {NEW} "
        "(it moved); check what changed, then accept it with scripts/build.sh --accept-base\n")
    assert started(state) == [] and builds(state) == []
    assert containers(state, "head")["glm53-rank0"]["status"] == "exited"  # kept for its logs
    assert (head / "recipe.lock").read_bytes() == before


def test_strict_refuses_a_first_use_before_the_build_pulls_anything(tmp_path, head):
    state = cluster(tmp_path, {})
    result = serve(tmp_path, state, root=head, SPEC="off", BASE_LOCK="strict")
    assert result.returncode == 2
    assert result.stderr == (
        f"refused: BASE_LOCK=strict: recipe.lock records no image ID for {VENDOR} and "
        "BASE_LOCK=strict records none on first use; check the image, then record it with "
        "scripts/build.sh --accept-base (or commit the site's recipe.lock)\n")
    assert builds(state) == [] and started(state) == []
    assert not (head / "recipe.lock").exists()


def test_the_builds_refusal_of_the_base_is_the_runs_one_line(tmp_path, head):
    state = cluster(tmp_path, {}, leftover=True)
    line = f"build.sh: refused: {VENDOR} is not on this host and pulling it failed (...); ..."
    result = serve(tmp_path, state, root=head, SPEC="off", FAKE_BUILD_EXIT=4, FAKE_BUILD_SAYS=line)
    assert result.returncode == 2
    assert result.stderr == line + "\n"
    assert builds(state) == [f"--base {VENDOR} --to v13 --base-lock first-use"]
    assert f"glm53: {IMAGE} is not on the head: building the image chain from {VENDOR}" in result.stdout
    assert started(state) == [] and containers(state, "head")["glm53-rank0"]["status"] == "exited"


def test_a_build_that_fails_otherwise_says_so_after_its_output(tmp_path, head):
    state = cluster(tmp_path, {})
    result = serve(tmp_path, state, root=head, SPEC="off", FAKE_BUILD_EXIT=1,
                   FAKE_BUILD_SAYS="build.sh: error: v9: docker build failed")
    assert result.returncode == 1
    assert result.stderr.splitlines() == ["build.sh: error: v9: docker build failed",
                                          "glm53: scripts/build.sh failed; nothing was started"]


def test_a_trusted_vendor_image_serves_and_the_leftovers_go_just_before_the_ranks(tmp_path, head):
    before = trust(head, OLD)
    state = cluster(tmp_path, {IMAGE: {"id": IMAGE_ID, "size": 4096},
                               VENDOR: {"id": OLD, "size": 4096}}, leftover=True)
    result = serve(tmp_path, state, root=head, SPEC="off", BASE_LOCK="strict",
                   FAKE_CURL_READY_AFTER=1)
    assert result.returncode == 0, result.stderr
    assert (head / "recipe.lock").read_bytes() == before and builds(state) == []
    argvs = [call["argv"] for call in calls(state) if call["node"] == "head"]
    removed = argvs.index(["rm", "--force", "glm53-rank0"])
    assert argvs.index(["image", "inspect", "--format", "{{.Id}}", VENDOR]) < removed
    assert argvs[removed + 1][:2] == ["run", "--detach"]


def test_an_unreadable_lock_is_refused_in_one_line(tmp_path, head):
    (head / "recipe.lock").write_text("[images\n")
    state = cluster(tmp_path, {IMAGE: {"id": IMAGE_ID, "size": 4096}})
    result = serve(tmp_path, state, root=head, SPEC="off")
    assert result.returncode == 2
    assert len(result.stderr.splitlines()) == 1
    assert result.stderr.startswith("refused: recipe.lock: ")
    assert "delete it to trust the base images there again on the next build" in result.stderr
    assert started(state) == []
