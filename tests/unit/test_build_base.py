"""scripts/build.sh's base (recipekit/imagebuild/chain.py): the vendor image pulled when
missing, layer by layer, and trusted on first use in recipe.lock; what is refused, and that a
refusal leaves the lock and the images as they were. A fake engine stands in for Docker here;
tests/image/test_first_run.py runs the same against a real engine and registry."""

from __future__ import annotations

import pytest

from recipekit import recipe
from recipekit.baselock import BaseLock
from recipekit.imagebuild import chain
from recipekit.imagebuild.engine import PullFailed, PullProgress

VENDOR = "vllm/vllm-openai:glm53-flash-arm64-cu130"
OLD = "sha256:" + "a" * 64
NEW = "sha256:" + "b" * 64
DIGEST = "sha256:" + "d" * 64
EVENTS = [
    {"status": "Pulling from vllm/vllm-openai", "id": "glm53-flash-arm64-cu130"},
    {"status": "Already exists", "progressDetail": {}, "id": "111111111111"},
    {"status": "Pulling fs layer", "progressDetail": {}, "id": "222222222222"},
    *({"status": "Downloading", "progressDetail": {"current": done, "total": 4_000_000},
       "id": "222222222222"} for done in (500_000, 1_000_000, 1_100_000, 3_900_000, 4_000_000)),
    {"status": "Download complete", "progressDetail": {}, "id": "222222222222"},
    {"status": "Extracting", "progressDetail": {"current": 4_000_000, "total": 4_000_000},
     "id": "222222222222"},
    {"status": "Pull complete", "progressDetail": {}, "id": "222222222222"},
    {"status": "Digest: " + DIGEST},
]


class FakeEngine:
    """Images by reference; a pull tags PULLS_TO (an image ID) as the reference, or fails."""

    def __init__(self, images=None, pulls_to=NEW, fails="", digest=DIGEST):
        self.images, self.pulls_to, self.fails = dict(images or {}), pulls_to, fails
        self.registry_digest = digest
        self.pulled, self.untagged = [], []

    def image_id(self, ref):
        return self.images.get(ref, "")

    def digest(self, ref):
        return self.registry_digest if ref in self.images else ""

    def pull(self, ref, show, digest=""):
        self.pulled.append((ref, digest))
        if self.fails:
            raise PullFailed(self.fails)
        for event in EVENTS:
            show(event)
        self.images[ref] = self.pulls_to
        return self.pulls_to

    def untag(self, ref):
        self.untagged.append(ref)
        self.images.pop(ref)


@pytest.fixture
def recipe_copy(tmp_path):
    path = tmp_path / "recipe.toml"
    path.write_text(recipe.RECIPE_PATH.read_text())
    return path


def base_of(recipe_copy, engine, *flags):
    args = chain.arguments(["--recipe", str(recipe_copy), *flags])
    return chain.Chain(args, engine).base()


def lock_of(recipe_copy):
    return BaseLock.read(recipe_copy.with_suffix(".lock")).images


def test_first_use_records_the_vendor_image_and_says_so_in_one_line(recipe_copy, capsys):
    engine = FakeEngine({VENDOR: OLD})
    assert base_of(recipe_copy, engine) == (VENDOR, OLD)
    trusted = lock_of(recipe_copy)[VENDOR]
    assert (trusted.image_id, trusted.digest, trusted.how) == (OLD, DIGEST, "first use")
    assert capsys.readouterr().err.splitlines() == [
        f"build.sh: recorded {VENDOR} as {OLD} (digest {DIGEST}) in {recipe_copy.with_suffix('.lock')} "
        "on first use; a later build or ./run.sh refuses the tag once it names another image"]
    assert base_of(recipe_copy, engine) == (VENDOR, OLD)  # a second build: trusted, nothing new
    assert capsys.readouterr().err == ""
    assert recipe_copy.read_text() == recipe.RECIPE_PATH.read_text()


def test_a_missing_vendor_image_is_pulled_layer_by_layer_then_recorded(recipe_copy, capsys):
    engine = FakeEngine()
    assert base_of(recipe_copy, engine) == (VENDOR, NEW)
    assert engine.pulled == [(VENDOR, "")]
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"build.sh [1/11] base: {VENDOR} is not on this host: pulling it"
    assert out[1:-1] == [
        "  layer 111111111111: already here",
        "  layer 222222222222: downloading, 1.0 of 4.0 MB",
        "  layer 222222222222: downloading, 3.9 of 4.0 MB",
        "  layer 222222222222: downloaded (4.0 MB)",
        "  layer 222222222222: extracted (1 of 1 layers to pull)",
    ]
    assert out[-1].startswith(f"build.sh [1/11] base: pulled {VENDOR} ({NEW[7:19]}): 1 layers pulled "
                              "(4.0 MB), 1 already here in ")
    assert lock_of(recipe_copy)[VENDOR].image_id == NEW


def test_a_lock_with_a_digest_pulls_exactly_that_image(recipe_copy):
    BaseLock.read(recipe_copy.with_suffix(".lock")).record(VENDOR, NEW, DIGEST, "first use")
    engine = FakeEngine()
    assert base_of(recipe_copy, engine) == (VENDOR, NEW)
    assert engine.pulled == [(VENDOR, DIGEST)]


def test_a_pull_that_fails_is_refused_in_one_line_naming_docker_load(recipe_copy):
    engine = FakeEngine(fails='Get "https://registry-1.docker.io/v2/": dial tcp: lookup '
                              "registry-1.docker.io: no such host")
    with pytest.raises(chain.BaseRefused) as refused:
        base_of(recipe_copy, engine)
    assert str(refused.value) == (
        f"{VENDOR} is not on this host and pulling it failed (Get \"https://registry-1.docker.io/v2/\": "
        "dial tcp: lookup registry-1.docker.io: no such host); where its registry cannot be reached, "
        "docker load it from an archive (docker save on a host that has it), then run this again")
    assert lock_of(recipe_copy) == {}


def test_strict_refuses_the_first_use_before_pulling(recipe_copy):
    engine = FakeEngine()
    with pytest.raises(chain.BaseRefused, match="BASE_LOCK=strict records none on first use"):
        base_of(recipe_copy, engine, "--base-lock", "strict")
    assert engine.pulled == [] and lock_of(recipe_copy) == {}
    present = FakeEngine({VENDOR: OLD})
    with pytest.raises(chain.BaseRefused, match=f"whose tag names {OLD} here"):
        base_of(recipe_copy, present, "--base-lock", "strict")
    assert lock_of(recipe_copy) == {}


def test_strict_comes_from_the_environment_when_not_passed(recipe_copy, monkeypatch):
    monkeypatch.setenv("BASE_LOCK", "strict")
    with pytest.raises(chain.BaseRefused, match="BASE_LOCK=strict"):
        base_of(recipe_copy, FakeEngine({VENDOR: OLD}))
    monkeypatch.setenv("BASE_LOCK", "loose")
    with pytest.raises(chain.BuildError, match=r"BASE_LOCK=loose: accepted: first-use \| strict"):
        base_of(recipe_copy, FakeEngine({VENDOR: OLD}))


def test_a_moved_tag_is_refused_and_the_lock_left_as_it_was(recipe_copy):
    lock = recipe_copy.with_suffix(".lock")
    BaseLock.read(lock).record(VENDOR, OLD, "", "first use")
    before = lock.read_bytes()
    with pytest.raises(chain.BaseRefused) as refused:
        base_of(recipe_copy, FakeEngine({VENDOR: NEW}))
    assert str(refused.value) == (
        f"{VENDOR}: {lock} records {OLD}, but the tag now names {NEW} (it moved); check what "
        "changed, then accept it with scripts/build.sh --accept-base")
    assert lock.read_bytes() == before


def test_an_image_pulled_for_a_tag_that_moved_is_removed_again(recipe_copy):
    BaseLock.read(recipe_copy.with_suffix(".lock")).record(VENDOR, OLD, "", "first use")
    engine = FakeEngine()  # no digest recorded: the tag is pulled, and names NEW now
    with pytest.raises(chain.BaseRefused, match="it moved"):
        base_of(recipe_copy, engine)
    assert engine.pulled == [(VENDOR, "")] and engine.untagged == [VENDOR]
    assert engine.images == {}  # the host has what it had


def test_accept_base_rewrites_the_lock_never_the_recipe(recipe_copy, capsys):
    BaseLock.read(recipe_copy.with_suffix(".lock")).record(VENDOR, OLD, "", "first use")
    assert base_of(recipe_copy, FakeEngine({VENDOR: NEW}), "--accept-base") == (VENDOR, NEW)
    trusted = lock_of(recipe_copy)[VENDOR]
    assert (trusted.image_id, trusted.how) == (NEW, "accepted")
    assert f"build.sh: accepted {VENDOR} as {NEW} in " in capsys.readouterr().err
    assert recipe_copy.read_text() == recipe.RECIPE_PATH.read_text()
    assert base_of(recipe_copy, FakeEngine({VENDOR: NEW}), "--base-lock", "strict") == (VENDOR, NEW)


def test_check_records_nothing(recipe_copy, capsys):
    assert base_of(recipe_copy, FakeEngine({VENDOR: OLD}), "--check") == (VENDOR, OLD)
    assert lock_of(recipe_copy) == {}
    assert f"base: would record {VENDOR} as {OLD}" in capsys.readouterr().out
    with pytest.raises(chain.BaseRefused, match="without --check pulls it"):
        base_of(recipe_copy, FakeEngine(), "--check")
    with pytest.raises(chain.BaseRefused, match="BASE_LOCK=strict records none"):
        base_of(recipe_copy, FakeEngine(), "--check", "--base-lock", "strict")


def test_another_base_is_checked_once_accepted_and_never_recorded_on_its_own(recipe_copy):
    assert base_of(recipe_copy, FakeEngine({"site/base:1": OLD}), "--base", "site/base:1") == (
        "site/base:1", OLD)
    assert lock_of(recipe_copy) == {}
    with pytest.raises(chain.BaseRefused, match="base image site/base:2 not found"):
        base_of(recipe_copy, FakeEngine(), "--base", "site/base:2")


def test_main_exits_4_with_the_refusal_in_one_line(recipe_copy, monkeypatch, capsys):
    BaseLock.read(recipe_copy.with_suffix(".lock")).record(VENDOR, OLD, "", "first use")
    monkeypatch.setattr(chain, "Engine", lambda: FakeEngine({VENDOR: NEW}))
    monkeypatch.setattr(chain, "BUILD_DIR", recipe_copy.parent / "build")
    assert chain.main(["--recipe", str(recipe_copy)]) == 4
    assert capsys.readouterr().err.splitlines() == [
        f"build.sh: refused: {VENDOR}: {recipe_copy.with_suffix('.lock')} records {OLD}, but the tag "
        f"now names {NEW} (it moved); check what changed, then accept it with scripts/build.sh "
        "--accept-base"]


def test_pull_progress_says_each_quarter_of_a_layer_once():
    lines = []
    progress = PullProgress(lines.append)
    for event in EVENTS:
        progress(event)
    assert progress.summary() == "1 layers pulled (4.0 MB), 1 already here"
    # 12% says nothing; 25% a line; 97% one line for the 50% and 75% it crossed; 100% nothing.
    assert [line for line in lines if "downloading" in line] == [
        "layer 222222222222: downloading, 1.0 of 4.0 MB",
        "layer 222222222222: downloading, 3.9 of 4.0 MB"]


def test_check_never_writes_the_lock_even_with_accept_base(recipe_copy, capsys):
    """--check builds and tags nothing, so it records nothing either (issue 35, finding 7):
    with --accept-base it says what it would accept, and the lock stays as it was."""
    assert base_of(recipe_copy, FakeEngine({VENDOR: OLD}), "--check", "--accept-base") == (
        VENDOR, OLD)
    assert not recipe_copy.with_suffix(".lock").exists()
    assert f"base: would accept {VENDOR} as {OLD}" in capsys.readouterr().out
    BaseLock.read(recipe_copy.with_suffix(".lock")).record(VENDOR, OLD, "", "first use")
    before = recipe_copy.with_suffix(".lock").read_text()
    assert base_of(recipe_copy, FakeEngine({VENDOR: NEW}), "--check", "--accept-base") == (
        VENDOR, NEW)
    assert recipe_copy.with_suffix(".lock").read_text() == before
