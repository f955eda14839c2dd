"""Real vLLM release trees: fetch a pinned wheel from PyPI, keep only its Python files.

Only the ``*.py`` files are used (patches are applied to them and they are parsed),
so one fixed platform's wheel is fetched whatever the host's architecture, and its
sha256 is checked against the pin before anything is extracted. The fetching itself is
``recipekit.pinned_wheels``'s.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

from recipekit.pinned_wheels import (
    CACHE_ENV,
    DONE_MARKER,
    PinnedWheel,
    SourceError,
    cache_root,
    exclusive,
    publish_tree,
    unpacked_tree,
)

__all__ = ["CACHE_ENV", "FORK", "WHEEL_SHA256", "SourceError", "cache_root", "known_trees", "release_tree"]

# sha256 of vllm-VERSION-cp38-abi3-manylinux_2_28_x86_64.whl as served by PyPI.
WHEEL_SHA256 = {
    "0.27.1": "98e9fc2a1ed8549a733c9d1b242e2002b82367da9e29e37801761438cb3a2670",
    "0.28.0": "addb0ffdaafd8155d75e9b3f5ddb3da28fdee9e8a7097ede91f7db2e9e1a3889",
    "0.30.0": "ef52ee58c410ead0b8afb190838fa4cbcb52075596f67862a03859d984966ac4",
    "0.33.0": "4b6bdec4ab269990bf70d45a3c1e94c3760a27064513760193b26d6f0da883aa",
    "0.34.0": "79ca4b3cd74aec08c4bf476bdf0cb15735b605ae5368526a2faae1e30f044ca2",
}
WHEEL_PLATFORM = "manylinux_2_28_x86_64"
WHEEL_PYTHON = "3.12"
FORK = "fork"
STALE_STANDIN_S = 24 * 3600  # a fork-shaped stand-in of other inputs is removed after this


def known_trees() -> list[str]:
    """Every name ``release_tree`` accepts: the pinned releases and the fork-shaped stand-in."""
    return [*sorted(WHEEL_SHA256), FORK]


def fork_tree(log=lambda message: None) -> Path:
    """The fork-shaped stand-in tree (a reconstruction, see recipekit/forkshape.py), built once.

    It is cached beside the releases under ``fork-KEY``, KEY hashing the builder, its
    source files and the three pinned wheels it is made from.
    """
    from recipekit import forkshape  # libcst: only needed to build the stand-in

    key = forkshape.inputs_key(WHEEL_SHA256)
    tree = cache_root() / "vllm-src" / f"{FORK}-{key}"
    if (tree / DONE_MARKER).is_file():
        return tree
    sources = {r: release_tree(r, log) for r in (forkshape.BASE_RELEASE, forkshape.CACHE_RELEASE, forkshape.GLM5NEXT_RELEASE)}
    with exclusive(tree.parent / f".{FORK}-{key}.lock"):
        if (tree / DONE_MARKER).is_file():
            return tree
        staging = forkshape.staging_dir(tree.parent)
        try:
            try:
                forkshape.build(
                    staging / "tree", sources[forkshape.BASE_RELEASE],
                    sources[forkshape.CACHE_RELEASE], sources[forkshape.GLM5NEXT_RELEASE], log,
                )
            except forkshape.ForkShapeError as error:
                raise SourceError(f"cannot build the fork-shaped stand-in: {error}") from None
            publish_tree(staging / "tree", tree, f"{FORK} {key}\n")
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        for older in tree.parent.glob(f"{FORK}-*"):
            # A stand-in of other inputs goes only after a day: another checkout may use it now.
            if older != tree and (older / DONE_MARKER).is_file() and (
                    time.time() - (older / DONE_MARKER).stat().st_mtime > STALE_STANDIN_S):
                shutil.rmtree(older, ignore_errors=True)
                log(f"removed {older.name} (a fork-shaped stand-in of older inputs)")
    return tree


def release_tree(version: str, log=lambda message: None) -> Path:
    """Return the directory that holds the ``vllm/`` package of ``version``.

    ``version`` is a pinned release or ``"fork"`` (the fork-shaped stand-in, see
    ``fork_tree``). The first call downloads and checks the wheel; later calls only
    look at disk. Concurrent callers (parallel test workers) serialise on a per-tree
    lock and the tree is published by one atomic rename, so nobody sees a partial tree.
    """
    if version == FORK:
        return fork_tree(log)
    if version not in WHEEL_SHA256:
        known = ", ".join(known_trees())
        raise SourceError(f"vllm {version} has no pinned wheel hash; pinned releases: {known}")
    wheel = PinnedWheel(
        project="vllm", version=version, sha256=WHEEL_SHA256[version], package="vllm",
        cache_dir="vllm-src", platform=WHEEL_PLATFORM, python=WHEEL_PYTHON, suffixes=(".py",),
        pin_file="recipekit/vllm_sources.py",
    )
    return unpacked_tree(wheel, log)
