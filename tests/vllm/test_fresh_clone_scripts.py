"""The entry points in scripts/ from a fresh clone, with nothing but python3 (no test venv).

The scripts run with a PATH and environment that exclude the test venv, under a
`python3` that sees only its standard library (`-S`: no site-packages), as on a
machine where nothing was installed. They bring up the recipe's tool environment
(recipekit/bootstrap.py: a venv from requirements/tool.txt and drafter.txt, built once
in the recipe cache) or refuse in one line; never a traceback.
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from recipekit.backport import load_manifest, sha256_text
from tests.vllm.conftest import REPO_ROOT


@pytest.fixture(scope="module")
def bare_env(tmp_path_factory):
    """PATH and environment of a machine that has only python3 (standard library only)."""
    shim = tmp_path_factory.mktemp("bare-bin")
    base = Path(sys.base_prefix) / "bin" / "python3"
    (shim / "python3").write_text(f'#!/bin/sh\nexec {base} -S "$@"\n')
    (shim / "python3").chmod(0o755)
    env = {"PATH": f"{shim}:/usr/bin:/bin", "HOME": os.environ["HOME"], "LANG": "C.UTF-8"}
    for key in ("GLM53_RECIPE_CACHE", "XDG_CACHE_HOME"):
        if key in os.environ:
            env[key] = os.environ[key]
    probe = subprocess.run(["python3", "-c", "import sys; print(sys.prefix); import unidiff"],
                           env=env, capture_output=True, text=True, check=False)
    assert probe.returncode != 0 and "No module named 'unidiff'" in probe.stderr, "python3 must be bare"
    assert not probe.stdout.startswith(sys.prefix) or sys.prefix == sys.base_prefix
    return env


def run_bare(env, *argv, timeout=900):
    result = subprocess.run([str(REPO_ROOT / "scripts" / argv[0]), *argv[1:]], env=env, cwd="/",
                            capture_output=True, text=True, timeout=timeout, check=False)
    assert "Traceback" not in result.stderr, result.stderr[-2000:]
    return result


def test_patch_layer_v9_from_a_bare_python(bare_env, release, tmp_path):
    root = tmp_path / "tree"
    shutil.copytree(release("0.27.1"), root, copy_function=os.link)
    result = run_bare(bare_env, "patch-layer", "v9", "--root", str(root), "--json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["outcome"] == "applied"
    progress = [line for line in result.stderr.splitlines() if "tool environment" in line]
    assert all(line.startswith("patch-layer: ") for line in progress)


def test_make_backport_from_a_bare_python(bare_env, tmp_path):
    result = run_bare(bare_env, "make-backport", "--out-dir", str(tmp_path / "diffs"))
    assert result.returncode == 0, result.stderr
    pins = load_manifest()["diff_sha256"]
    for shape, pin in pins.items():
        assert sha256_text((tmp_path / "diffs" / f"dflash2-{shape}.diff").read_text()) == pin


def test_prepare_drafter_catalog_from_a_bare_python(bare_env):
    result = run_bare(bare_env, "prepare-drafter", "--catalog")
    assert result.returncode == 0, result.stderr
    assert [d["key"] for d in json.loads(result.stdout)] == ["incoai", "dflash2-g"]


def test_an_environment_that_cannot_be_built_is_one_line_naming_the_command(bare_env):
    env = {**bare_env, "GLM53_RECIPE_CACHE": "/dev/null/cache"}
    result = run_bare(env, "patch-layer", "v9", "--root", "/nowhere")
    assert result.returncode == 2
    assert len(result.stderr.splitlines()) == 1, result.stderr
    assert result.stderr.startswith("patch-layer: cannot make the tool environment /dev/null/cache/tool-venv-")
    assert result.stderr.rstrip().endswith(
        "run: python3 -m pip install -r requirements/tool.txt -r requirements/drafter.txt "
        "-r requirements/build.txt")
