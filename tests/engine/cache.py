"""Directories in the recipe cache built once per content key: a lock, a `.complete`
marker, and either an atomic rename (build anywhere, publish at once) or an in-place build
(virtualenvs hold absolute paths and cannot move)."""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path

from recipekit.pinned_wheels import exclusive
from recipekit.vllm_sources import cache_root

COMPLETE = ".complete"
# where the engine tier keeps its venvs, models and compile caches (default: the recipe
# cache); a fresh directory here measures a cold engine tier without touching other tiers
ENGINE_CACHE_ENV = "GLM53_ENGINE_CACHE"


def engine_cache_root() -> Path:
    override = os.environ.get(ENGINE_CACHE_ENV)
    return Path(override) if override else cache_root()


def content_key(*parts: str | bytes | Path, length: int = 12) -> str:
    """sha256 over the given strings, bytes and files' contents, in order."""
    digest = hashlib.sha256()
    for part in parts:
        if isinstance(part, Path):
            data = part.read_bytes()
        elif isinstance(part, str):
            data = part.encode()
        else:
            data = part
        digest.update(len(data).to_bytes(8, "big"))
        digest.update(data)
    return digest.hexdigest()[:length]


def files_key(paths: Iterable[Path], *extra: str) -> str:
    """Key of a generator: the bytes of its source files plus extra pins."""
    return content_key(*sorted(paths), *extra)


def progress(message: str) -> None:
    """One line on stderr (pytest shows it with -s and in the captured log on failure)."""
    print(message, file=sys.stderr, flush=True)


def cached_dir(group: str, name: str, build: Callable[[Path], None], *,
               in_place: bool = False) -> Path:
    """`<cache>/<group>/<name>`, made by `build(path)` unless already complete.

    Callers in other processes wait on the lock; a failed build leaves nothing that
    looks complete. With in_place the directory is built where it stays.
    """
    target = engine_cache_root() / group / name
    if (target / COMPLETE).is_file():
        return target
    with exclusive(target.parent / f".{name}.lock"):
        if (target / COMPLETE).is_file():
            return target
        if in_place:
            shutil.rmtree(target, ignore_errors=True)
            target.mkdir(parents=True)
            build(target)
            (target / COMPLETE).touch()
            return target
        staging = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=target.parent))
        try:
            build(staging)
            (staging / COMPLETE).touch()
            shutil.rmtree(target, ignore_errors=True)
            os.replace(staging, target)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return target
