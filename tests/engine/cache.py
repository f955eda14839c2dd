"""Directories in the recipe cache built once per content key: a lock, a `.complete`
marker, and either an atomic rename (build anywhere, publish at once) or an in-place build
(virtualenvs hold absolute paths and cannot move). Each use stamps the marker; an entry
nobody used for STALE_AFTER_S is removed when another of its group is built."""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from recipekit.pinned_wheels import exclusive
from recipekit.vllm_sources import cache_root

COMPLETE = ".complete"
# where the engine tier keeps its venvs, models and compile caches (default: the recipe
# cache); a fresh directory here measures a cold engine tier without touching other tiers
ENGINE_CACHE_ENV = "GLM53_ENGINE_CACHE"
# Keys change with the code that builds an entry, and an overlay or a venv is 0.4 to 2.5 GB:
# after a day of commits this machine's cache held 8 overlays (4.2 GB), 4 of them for keys
# no checkout used any more. Two weeks unused is stale; another checkout's (an older branch on
# the same machine) is kept as long as it is run now and then.
STALE_AFTER_S = 14 * 86400
# torch.compile's, vLLM's and Triton's caches of a venv or an overlay, under its entry's name
# (engine_env.EngineVenv.compile_cache, dflash2_env.Overlay.env): removed with the entry. Not
# imported from there: each file's bytes key its venv or overlays, and a venv is minutes to build
COMPILE_GROUP = "engine-compile"


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
    looks complete. With in_place the directory is built where it stays. After a build the
    group's stale entries are removed (prune_stale).
    """
    target = engine_cache_root() / group / name
    if _used(target):
        return target
    with exclusive(target.parent / f".{name}.lock"):
        if _used(target):
            return target
        if in_place:
            shutil.rmtree(target, ignore_errors=True)
            target.mkdir(parents=True)
            build(target)
            (target / COMPLETE).touch()
        else:
            staging = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=target.parent))
            try:
                build(staging)
                (staging / COMPLETE).touch()
                shutil.rmtree(target, ignore_errors=True)
                os.replace(staging, target)
            finally:
                shutil.rmtree(staging, ignore_errors=True)
    prune_stale(target.parent, keep=name)
    return target


def _used(entry: Path) -> bool:
    """True when ENTRY is complete, its marker stamped with this use (the stamp is what
    prune_stale reads); False when it is not, or was removed just now."""
    try:
        os.utime(entry / COMPLETE)
    except FileNotFoundError:
        return False
    return True


def _stale(entry: Path, now: float) -> bool:
    try:
        return now - (entry / COMPLETE).stat().st_mtime >= STALE_AFTER_S
    except FileNotFoundError:
        return False  # incomplete: being built, or a failed build's (rebuilt under its lock)


def prune_stale(group_dir: Path, keep: str, now: float | None = None) -> list[str]:
    """Remove GROUP_DIR's complete entries last used STALE_AFTER_S or more ago (but KEEP),
    each under its own lock and checked again there, with its compile caches; the names
    removed."""
    now = time.time() if now is None else now
    removed = []
    for entry in sorted(group_dir.iterdir()):
        if entry.name == keep or entry.name.startswith(".") or not _stale(entry, now):
            continue
        with exclusive(group_dir / f".{entry.name}.lock"):
            if not _stale(entry, now):
                continue
            shutil.rmtree(entry)
            shutil.rmtree(engine_cache_root() / COMPILE_GROUP / entry.name, ignore_errors=True)
        removed.append(entry.name)
    if removed:
        progress(f"engine cache: removed {len(removed)} of {group_dir} unused for "
                 f"{STALE_AFTER_S // 86400} days or more: {', '.join(removed)}")
    return removed
