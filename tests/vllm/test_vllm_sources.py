"""Real release trees: pinned wheels, an offline second call served from the cache, a cache
safe for parallel workers."""

import subprocess
import sys

import pytest

from recipekit import vllm_sources
from recipekit.pinned_wheels import publish_tree
from recipekit.vllm_sources import SourceError, release_tree
from tests.vllm.conftest import REPO_ROOT, published_state, run_script


def test_second_call_is_offline_and_serves_the_cached_tree(release):
    tree = release("0.27.1")
    before = published_state(tree)
    result = run_script("scripts/vllm-src", "0.27.1", env={"PIP_INDEX_URL": "http://127.0.0.1:9/none"})
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == str(tree)
    assert (tree / "vllm" / "__init__.py").is_file()
    assert published_state(tree) == before


def test_unpinned_release_is_refused():
    result = run_script("scripts/vllm-src", "0.29.0")
    assert result.returncode == 2
    assert "vllm 0.29.0 has no pinned wheel hash" in result.stderr


def test_wheel_with_another_hash_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv(vllm_sources.CACHE_ENV, str(tmp_path))
    monkeypatch.setitem(vllm_sources.WHEEL_SHA256, "0.27.1", "f" * 64)
    with pytest.raises(SourceError, match="does not match the pin"):
        release_tree("0.27.1")
    assert not (tmp_path / "vllm-src" / "0.27.1").exists()


def test_parallel_workers_share_one_complete_tree(tmp_path):
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]);"
        "from recipekit.vllm_sources import release_tree;"
        "t = release_tree('0.27.1');"
        "print(t, sum(1 for _ in t.rglob('*.py')))"
    )
    env = {"GLM53_RECIPE_CACHE": str(tmp_path), "PATH": "/usr/bin:/bin"}
    workers = [
        subprocess.Popen([sys.executable, "-c", code, str(REPO_ROOT)], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(3)
    ]
    outputs = [worker.communicate(timeout=300)[0].split() for worker in workers]
    assert all(worker.returncode == 0 for worker in workers)
    assert len({tuple(out) for out in outputs}) == 1
    assert int(outputs[0][1]) == 2360
    assert not list((tmp_path / "vllm-src").glob(".0.27.1-*"))


def test_a_rebuilt_tree_changes_its_published_state(tmp_path):
    """The offline second calls above would fail had the script rebuilt the tree."""
    tree = tmp_path / "vllm-src" / "1.0"

    def build():
        staged = tmp_path / "vllm-src" / ".1.0-staged"
        (staged / "vllm").mkdir(parents=True)
        (staged / "vllm" / "__init__.py").write_text("")
        publish_tree(staged, tree, "1.0")

    build()
    before = published_state(tree)
    assert published_state(tree) == before
    build()
    assert published_state(tree) != before
