"""Fixtures of the vllm tier: real release trees from PyPI, copied per test."""

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from recipekit.vllm_sources import release_tree

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def release():
    """release("0.27.1") -> the cached, read-only release tree (fetched once)."""
    return release_tree


@pytest.fixture
def tree_copy(tmp_path, release):
    """tree_copy("0.27.1") -> a private copy of a release tree that a test may patch.

    Files are hard links: the applier replaces files through a rename, never in
    place, so the cache is never changed (and a test would notice if it were).
    """

    def make(version: str) -> Path:
        target = tmp_path / f"vllm-{version}"
        shutil.copytree(release(version), target, copy_function=os.link)
        return target

    return make


def tree_digest(root: Path) -> dict[str, str]:
    """sha256 of every file under root, by relative path."""
    return {
        str(path.relative_to(root)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(root.rglob("*"))
        if path.is_file()
    }


def run_script(*args: str, cwd: Path = REPO_ROOT, env: dict | None = None):
    """Run a repository script with this interpreter; returns the CompletedProcess."""
    return subprocess.run(
        [sys.executable, *args], cwd=cwd, capture_output=True, text=True,
        env={**os.environ, **(env or {})}, timeout=900, check=False,
    )


def patch_layer(layer: str, root: Path, *extra: str) -> tuple[int, dict, str]:
    """scripts/patch-layer LAYER --root ROOT --json EXTRA: (exit code, its report or {}, stderr)."""
    result = run_script("scripts/patch-layer", layer, "--root", str(root), "--json", *extra)
    return result.returncode, (json.loads(result.stdout) if result.stdout.strip() else {}), result.stderr


@pytest.fixture(scope="session")
def diff_dir(tmp_path_factory):
    """scripts/make-backport's diffs (v9's DFlash2 backport per shape and the salt), made once."""
    out = tmp_path_factory.mktemp("backports")
    result = run_script("scripts/make-backport", "--out-dir", str(out))
    assert result.returncode == 0, result.stderr
    return out
