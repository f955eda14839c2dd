"""Every shell script in the repository is shellcheck-clean; the Dockerfiles pass hadolint.

These need no Docker engine and run even when GLM53_SKIP_IMAGE_TIER=1.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.image.imagetools import REPO_ROOT

SHELL_SHEBANG = ("#!/bin/bash", "#!/usr/bin/env bash", "#!/bin/sh", "#!/usr/bin/env sh")


def tool(name: str) -> str:
    """The linter from the test venv (requirements/test.txt) or PATH."""
    beside = Path(sys.executable).parent / name
    found = str(beside) if beside.is_file() else shutil.which(name)
    if not found:
        pytest.fail(
            f"{name} is not installed; it comes with requirements/test.txt (scripts/test-env)"
        )
    return found


def repo_files() -> list[Path]:
    listing = subprocess.run(
        ["git", "-C", str(REPO_ROOT), "ls-files", "--cached", "--others", "--exclude-standard"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split("\n")
    return [
        REPO_ROOT / name for name in sorted(set(listing)) if name and (REPO_ROOT / name).is_file()
    ]


def shell_scripts() -> list[Path]:
    scripts = []
    for path in repo_files():
        if path.suffix == ".sh":
            scripts.append(path)
            continue
        with path.open("rb") as handle:
            first = handle.readline(64).decode("utf-8", "replace").strip()
        if first.startswith(SHELL_SHEBANG):
            scripts.append(path)
    return scripts


def test_every_shell_script_is_shellcheck_clean():
    scripts = shell_scripts()
    names = {str(path.relative_to(REPO_ROOT)) for path in scripts}
    for expected in ("scripts/build.sh", "tests/image/make-standin", ".ci/run", "run.sh"):
        assert expected in names, f"{expected} was not found as a shell script"
    result = subprocess.run(
        [tool("shellcheck"), "--external-sources", *map(str, scripts)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, f"shellcheck on {len(scripts)} scripts:\n{result.stdout}"


def test_dockerfiles_pass_hadolint():
    dockerfiles = sorted((REPO_ROOT / "docker").glob("Dockerfile.sm121-v*"))
    assert [path.name for path in dockerfiles] == [
        "Dockerfile.sm121-v10",
        "Dockerfile.sm121-v11",
        "Dockerfile.sm121-v13",
        "Dockerfile.sm121-v8",
        "Dockerfile.sm121-v9",
    ]
    result = subprocess.run(
        [tool("hadolint"), *map(str, dockerfiles)], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, f"hadolint:\n{result.stdout}{result.stderr}"


def test_dockerfiles_chain_each_layer_on_the_previous_tag():
    for layer, base in (("v9", "v8"), ("v10", "v9"), ("v11", "v10"), ("v13", "v11")):
        text = (REPO_ROOT / "docker" / f"Dockerfile.sm121-{layer}").read_text()
        assert f"ARG BASE_IMAGE=glm53-sm121-{base}\n" in text
        assert "FROM ${BASE_IMAGE}\n" in text
        assert (f'"/opt/glm53-recipe/.incoming/docker/apply-layer.py", "{layer}"]' in text
                or f'"/opt/glm53-recipe/.incoming/docker/apply-layer.py", "{layer}", "{layer}_' in text)
