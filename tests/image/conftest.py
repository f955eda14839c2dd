"""Image tier: a real Docker engine, stand-in bases, the chain built by scripts/build.sh.

Every test that needs the engine takes the ``docker_engine`` fixture: it FAILS when no
engine answers (the tier must not pass by skipping), unless GLM53_SKIP_IMAGE_TIER=1 asks to
skip it. Chain images get a tag prefix unique to the session (removed at the end), so a
user's own glm53-sm121-* images are never touched; the stand-in bases are content-keyed and
kept, so a second run on the same machine reuses them.
"""

from __future__ import annotations

import os
import subprocess
import uuid

import pytest

from tests.image.imagetools import MAKE_STANDIN, docker, image_id, run_build

SKIP_VAR = "GLM53_SKIP_IMAGE_TIER"


@pytest.fixture(scope="session")
def docker_engine() -> None:
    if os.environ.get(SKIP_VAR) == "1":
        pytest.skip(f"{SKIP_VAR}=1: the image tier (a real Docker engine) was asked to be skipped")
    try:
        result = docker("info", "--format", "{{.ServerVersion}}", check=False)
    except FileNotFoundError:
        pytest.fail(f"no docker CLI on PATH; install docker.io (see .ci/run) or set {SKIP_VAR}=1")
    if result.returncode != 0 or not result.stdout.strip():
        pytest.fail(
            f"no Docker engine answers (docker info: {result.stderr.strip()[:200]}); start "
            f"dockerd as .ci/run does, or set {SKIP_VAR}=1 to skip the image tier"
        )


@pytest.fixture(scope="session")
def standin(docker_engine):
    """make_standin(version, drift=None, flashinfer=None) -> tag of a cached stand-in base image."""
    made: dict[tuple[str, str | None, str | None], str] = {}

    def make(version: str, drift: str | None = None, flashinfer: str | None = None) -> str:
        key = (version, drift, flashinfer)
        if key not in made:
            command = [
                str(MAKE_STANDIN), *(["--drift", drift] if drift else []),
                *(["--flashinfer", flashinfer] if flashinfer else []), version,
            ]
            result = subprocess.run(command, capture_output=True, text=True, check=False)
            assert result.returncode == 0, f"{command} failed:\n{result.stderr}"
            made[key] = result.stdout.strip().splitlines()[-1]
            assert image_id(made[key]), f"make-standin printed {made[key]!r}, not an image"
        return made[key]

    return make


@pytest.fixture(scope="session")
def session_prefix(docker_engine):
    """A tag-prefix factory unique to this session; every image under it is removed at the end.

    So are the untagged images the session's builds left (a failed build keeps its finished
    steps as cache; with vfs each is a full copy of the image), but none that existed before.
    """
    session = f"glm53t-{uuid.uuid4().hex[:8]}"
    before = set(docker("images", "-a", "-q", "--no-trunc", check=False).stdout.split())

    def prefix(name: str) -> str:
        return f"{session}-{name}-"

    yield prefix
    listing = docker("images", "--format", "{{.Repository}}:{{.Tag}}", check=False).stdout.split()
    ours = sorted((ref for ref in listing if ref.startswith(session)), reverse=True)
    if ours:
        docker("rmi", *ours, check=False)
    for _ in range(5):
        untagged = docker(
            "images", "-a", "-q", "--no-trunc", "--filter", "dangling=true", check=False
        ).stdout.split()
        leftovers = [image for image in untagged if image not in before]
        if not leftovers or docker("rmi", *leftovers, check=False).returncode == 0:
            break


@pytest.fixture(scope="session")
def chain_0300(standin, session_prefix):
    """The chain v9 -> v11 built on the vLLM 0.30.0 stand-in: (prefix, base tag, the build run).

    The stand-in plays an image v8 already made (it has no FlashInfer to patch), so the
    chain starts at v9; the fork-shaped chain below runs v8 as well.
    """
    base = standin("0.30.0")
    prefix = session_prefix("v0300")
    return prefix, base, run_build(prefix, "--from", "v9", "--base", base)


@pytest.fixture(scope="session")
def v8_on_0330(standin, session_prefix):
    """v8 alone on a vLLM 0.33.0 stand-in carrying FlashInfer 0.6.18 and a jit-cache (as a
    0.33.0 image patched by hand might): (prefix, base tag, the build run). v8 must pick
    0.33.0's own package set from the base's _version.py and install FlashInfer 0.7.x over it."""
    base = standin("0.33.0", flashinfer="0.6.18")
    prefix = session_prefix("v8-0330")
    return prefix, base, run_build(prefix, "--to", "v8", "--base", base)


@pytest.fixture(scope="session")
def chain_fork(standin, session_prefix):
    """The whole chain v8 -> v11 on the fork-shaped stand-in: (prefix, base tag, the build run).

    The stand-in carries the real flashinfer-python 0.6.17 and a flashinfer-jit-cache, as the
    vendor image does: v8 must install the pins over them and remove the cache.
    """
    base = standin("fork", flashinfer="0.6.17")
    prefix = session_prefix("fork")
    return prefix, base, run_build(prefix, "--base", base)
