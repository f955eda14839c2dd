"""Real FlashInfer trees and wheels: pinned by sha256, fetched once, offline afterwards."""

import time

import pytest

from recipekit import flashinfer_sources, pinned_wheels
from recipekit.flashinfer_sources import flashinfer_tree, flashinfer_wheel
from recipekit.pinned_wheels import SourceError, sha256_file
from tests.vllm.conftest import run_script

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


def test_second_call_is_offline_and_fast():
    tree = flashinfer_tree("0.6.18")
    started = time.monotonic()
    result = run_script("scripts/flashinfer-src", "0.6.18", env=OFFLINE)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == str(tree)
    assert time.monotonic() - started < 2.0


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
