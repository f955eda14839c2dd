"""Real vLLM release trees: fetch a pinned wheel from PyPI, keep only its Python files.

Only the ``*.py`` files are used (patches are applied to them and they are parsed),
so one fixed platform's wheel is fetched whatever the host's architecture, and its
sha256 is checked against the pin before anything is extracted.
"""

from __future__ import annotations

from pathlib import Path

from recipekit.pinned_wheels import CACHE_ENV, PinnedWheel, SourceError, cache_root, unpacked_tree

__all__ = ["CACHE_ENV", "WHEEL_SHA256", "SourceError", "cache_root", "release_tree"]

# sha256 of vllm-VERSION-cp38-abi3-manylinux_2_28_x86_64.whl as served by PyPI.
WHEEL_SHA256 = {
    "0.27.1": "98e9fc2a1ed8549a733c9d1b242e2002b82367da9e29e37801761438cb3a2670",
    "0.28.0": "addb0ffdaafd8155d75e9b3f5ddb3da28fdee9e8a7097ede91f7db2e9e1a3889",
    "0.30.0": "ef52ee58c410ead0b8afb190838fa4cbcb52075596f67862a03859d984966ac4",
    "0.33.0": "4b6bdec4ab269990bf70d45a3c1e94c3760a27064513760193b26d6f0da883aa",
}
WHEEL_PLATFORM = "manylinux_2_28_x86_64"
WHEEL_PYTHON = "3.12"


def release_tree(version: str, log=lambda message: None) -> Path:
    """Return the directory that holds the ``vllm/`` package of ``version``.

    The first call downloads and checks the wheel; later calls only look at disk.
    """
    if version not in WHEEL_SHA256:
        known = ", ".join(sorted(WHEEL_SHA256))
        raise SourceError(f"vllm {version} has no pinned wheel hash; pinned releases: {known}")
    wheel = PinnedWheel(
        project="vllm", version=version, sha256=WHEEL_SHA256[version], package="vllm",
        cache_dir="vllm-src", platform=WHEEL_PLATFORM, python=WHEEL_PYTHON, suffixes=(".py",),
        pin_file="recipekit/vllm_sources.py",
    )
    return unpacked_tree(wheel, log)
