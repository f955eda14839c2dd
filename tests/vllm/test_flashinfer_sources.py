"""Real FlashInfer trees and wheels: pinned by sha256, fetched once, offline afterwards."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from recipekit import flashinfer_sources, pinned_wheels
from recipekit.flashinfer_sources import flashinfer_tree, flashinfer_wheel
from recipekit.pinned_wheels import SourceError, sha256_file
from tests.vllm.conftest import OWN_CACHES, published_state, run_script

OFFLINE = {
    "PIP_INDEX_URL": "http://127.0.0.1:9/none",
    "PIP_EXTRA_INDEX_URL": "",
    "PIP_FIND_LINKS": "",
}


def test_tree_holds_the_python_and_the_headers_v8_patches():
    tree = flashinfer_tree("0.6.18")
    assert (tree / "flashinfer/mla/_core.py").is_file()
    assert (tree / "flashinfer/data/include/flashinfer/attention/mla.cuh").is_file()
    assert "ckv_scale_arr" in (tree / "flashinfer/mla/_core.py").read_text()
    assert (
        "ckv_scale_arr" not in (flashinfer_tree("0.6.17") / "flashinfer/mla/_core.py").read_text()
    )


def test_second_call_is_offline_and_serves_the_cached_tree():
    tree = flashinfer_tree("0.6.18")
    before = published_state(tree)
    result = run_script("scripts/flashinfer-src", "0.6.18", env=OFFLINE)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == str(tree)
    assert published_state(tree) == before


def test_the_wheel_itself_is_kept_and_matches_its_pin():
    wheel = flashinfer_wheel("0.6.17")
    assert wheel.name == "flashinfer_python-0.6.17-py3-none-any.whl"
    assert sha256_file(wheel) == flashinfer_sources.WHEEL_SHA256["0.6.17"]
    result = run_script("scripts/flashinfer-src", "--wheel", "0.6.17", env=OFFLINE)
    assert (result.returncode, result.stdout.strip()) == (0, str(wheel))


def test_unpinned_version_and_wrong_hash_are_refused(tmp_path, monkeypatch):
    result = run_script("scripts/flashinfer-src", "0.6.16")
    assert result.returncode == 2
    assert "flashinfer-python 0.6.16 has no pinned wheel hash" in result.stderr
    monkeypatch.setenv(pinned_wheels.CACHE_ENV, str(tmp_path))
    monkeypatch.setitem(flashinfer_sources.WHEEL_SHA256, "0.6.17", "f" * 64)
    with pytest.raises(SourceError, match="does not match the pin"):
        flashinfer_tree("0.6.17")
    assert not (tmp_path / "flashinfer-src" / "0.6.17").exists()


def test_flashinfers_jit_log_lands_in_the_recipe_cache_not_home(tmp_path):
    """Importing FlashInfer writes its JIT log under $FLASHINFER_WORKSPACE_BASE, else under
    $HOME: the tier points it (and vLLM's cache) into the recipe cache, so a test run leaves
    a user's ~/.cache/flashinfer and ~/.cache/vllm as they were."""
    for name, subdir in OWN_CACHES.items():
        assert os.environ[name] == str(pinned_wheels.cache_root() / "vllm-tier" / subdir)
    home = tmp_path / "home"
    home.mkdir()

    def import_flashinfer(env):
        run = subprocess.run([sys.executable, "-c", "import flashinfer.jit.core"],
                             env={**env, "HOME": str(home)}, capture_output=True, text=True,
                             timeout=300, check=False)
        assert run.returncode == 0, run.stderr[-2000:]

    import_flashinfer(os.environ)
    assert not (home / ".cache").exists()
    base = os.environ["FLASHINFER_WORKSPACE_BASE"]
    assert list(Path(base).glob(".cache/flashinfer/*/flashinfer_jit.log"))
    # Without the tier's variable the same import writes into the home it is given.
    import_flashinfer({k: v for k, v in os.environ.items() if k != "FLASHINFER_WORKSPACE_BASE"})
    assert list(home.glob(".cache/flashinfer/*/flashinfer_jit.log"))
