"""The engine tier's content-keyed cache (tests/engine/cache.py): each use stamps an entry, and
an entry unused for STALE_AFTER_S goes, with its compile caches, when another of its group is
built; what is in use, being built, or kept is never removed."""

from __future__ import annotations

import os
import time

import pytest

from tests.engine import cache
from tests.engine.cache import COMPILE_GROUP, COMPLETE, STALE_AFTER_S, cached_dir, prune_stale


@pytest.fixture
def root(tmp_path, monkeypatch):
    monkeypatch.setenv(cache.ENGINE_CACHE_ENV, str(tmp_path))
    return tmp_path


def entry(root, group: str, name: str, *, age_s: float | None, compiled: bool = False):
    """GROUP/NAME with a file, complete and last used AGE_S ago (None: incomplete)."""
    path = root / group / name
    path.mkdir(parents=True)
    (path / "weights").write_text(name)
    if age_s is not None:
        (path / COMPLETE).touch()
        stamp = time.time() - age_s
        os.utime(path / COMPLETE, (stamp, stamp))
    if compiled:
        (root / COMPILE_GROUP / name / "inductor").mkdir(parents=True)
    return path


def test_a_build_removes_the_groups_stale_entries_and_their_compile_caches(root):
    stale = entry(root, "engine-overlay", "old-key", age_s=STALE_AFTER_S + 60, compiled=True)
    recent = entry(root, "engine-overlay", "other-checkout", age_s=STALE_AFTER_S - 3600,
                   compiled=True)
    building = entry(root, "engine-overlay", "being-built", age_s=None)
    elsewhere = entry(root, "engine-models", "old-model", age_s=STALE_AFTER_S + 60)

    made = cached_dir("engine-overlay", "new-key", lambda out: (out / "weights").write_text("new"))

    assert (made / "weights").read_text() == "new" and (made / COMPLETE).is_file()
    assert not stale.exists() and not (root / COMPILE_GROUP / "old-key").exists()
    assert (recent / "weights").is_file() and (root / COMPILE_GROUP / "other-checkout").is_dir()
    assert (building / "weights").is_file()  # no marker: a build in progress is not judged
    assert (elsewhere / "weights").is_file()  # another group waits for a build of its own


def test_a_use_stamps_the_entry_so_it_is_not_stale(root):
    used = entry(root, "engine-venv", "in-use", age_s=STALE_AFTER_S + 60)
    built = []

    assert cached_dir("engine-venv", "in-use", built.append, in_place=True) == used
    assert built == []  # a hit builds nothing
    assert time.time() - (used / COMPLETE).stat().st_mtime < 60
    assert prune_stale(root / "engine-venv", keep="another") == []
    assert (used / "weights").is_file()


def test_prune_keeps_the_named_entry_and_says_what_it_removed(root, capsys):
    kept = entry(root, "engine-overlay", "keep-me", age_s=STALE_AFTER_S * 3)
    entry(root, "engine-overlay", "gone-a", age_s=STALE_AFTER_S)
    entry(root, "engine-overlay", "gone-b", age_s=STALE_AFTER_S * 2)

    assert prune_stale(root / "engine-overlay", keep="keep-me") == ["gone-a", "gone-b"]
    assert (kept / "weights").is_file()
    assert sorted(p.name for p in (root / "engine-overlay").iterdir()
                  if not p.name.startswith(".")) == ["keep-me"]
    said = capsys.readouterr().err
    assert "removed 2 of" in said and "gone-a, gone-b" in said and "14 days" in said


def test_a_stale_entry_used_again_before_the_prune_is_kept(root, monkeypatch):
    """The prune reads the stamp again under the entry's lock: a use in between wins."""
    revived = entry(root, "engine-overlay", "revived", age_s=STALE_AFTER_S + 60)
    real_exclusive = cache.exclusive

    def use_while_waiting(lock_path):
        os.utime(revived / COMPLETE)  # another process's hit, as the prune takes the lock
        return real_exclusive(lock_path)

    monkeypatch.setattr(cache, "exclusive", use_while_waiting)
    assert prune_stale(root / "engine-overlay", keep="new") == []
    assert (revived / "weights").is_file()
