"""Real vLLM release trees: fetch a pinned wheel from PyPI, keep only its Python files.

Only the ``*.py`` files are used (patches are applied to them and they are parsed),
so one fixed platform's wheel is fetched whatever the host's architecture, and its
sha256 is checked against the pin before anything is extracted.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

# sha256 of vllm-VERSION-cp38-abi3-manylinux_2_28_x86_64.whl as served by PyPI.
WHEEL_SHA256 = {
    "0.27.1": "98e9fc2a1ed8549a733c9d1b242e2002b82367da9e29e37801761438cb3a2670",
    "0.28.0": "addb0ffdaafd8155d75e9b3f5ddb3da28fdee9e8a7097ede91f7db2e9e1a3889",
    "0.30.0": "ef52ee58c410ead0b8afb190838fa4cbcb52075596f67862a03859d984966ac4",
    "0.33.0": "4b6bdec4ab269990bf70d45a3c1e94c3760a27064513760193b26d6f0da883aa",
}
WHEEL_PLATFORM = "manylinux_2_28_x86_64"
WHEEL_PYTHON = "3.12"
CACHE_ENV = "GLM53_RECIPE_CACHE"
_DONE_MARKER = ".complete"


class SourceError(RuntimeError):
    """A release tree cannot be provided; the message says why and what to do."""


def cache_root() -> Path:
    """The directory holding every cached release tree."""
    override = os.environ.get(CACHE_ENV)
    if override:
        return Path(override)
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg) / "glm53-recipe"


def _tree_dir(version: str) -> Path:
    return cache_root() / "vllm-src" / version


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


@contextlib.contextmanager
def _exclusive(lock_path: Path):
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with lock_path.open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _download_wheel(version: str, dest: Path, log) -> Path:
    command = [
        sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
        "--platform", WHEEL_PLATFORM, "--python-version", WHEEL_PYTHON,
        "--disable-pip-version-check", "--quiet", "-d", str(dest), f"vllm=={version}",
    ]
    log(f"fetching vllm {version} wheel ({WHEEL_PLATFORM}) from PyPI")
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    wheels = sorted(dest.glob(f"vllm-{version}-*.whl"))
    if result.returncode != 0 or len(wheels) != 1:
        tail = (result.stderr or result.stdout).strip().splitlines()[-1:] or ["no output"]
        raise SourceError(f"pip download vllm=={version} failed: {tail[0]}; check PyPI access")
    return wheels[0]


def _extract_python(wheel: Path, dest: Path) -> int:
    count = 0
    with zipfile.ZipFile(wheel) as archive:
        for member in archive.infolist():
            name = member.filename
            if not (name.startswith("vllm/") and name.endswith(".py")):
                continue
            if name.startswith("/") or ".." in Path(name).parts:
                raise SourceError(f"{wheel.name}: unsafe member path {name!r}; refusing the wheel")
            target = dest / name
            target.parent.mkdir(parents=True, exist_ok=True)
            with archive.open(member) as src, target.open("wb") as out:
                shutil.copyfileobj(src, out)
            count += 1
    return count


FORK = "fork"


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
    if (tree / _DONE_MARKER).is_file():
        return tree
    sources = {r: release_tree(r, log) for r in (forkshape.BASE_RELEASE, forkshape.CACHE_RELEASE, forkshape.GLM5NEXT_RELEASE)}
    with _exclusive(tree.parent / f".{FORK}-{key}.lock"):
        if (tree / _DONE_MARKER).is_file():
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
            (staging / "tree" / _DONE_MARKER).write_text(f"{FORK} {key}\n")
            if tree.exists():
                shutil.rmtree(tree)
            os.replace(staging / "tree", tree)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        for older in tree.parent.glob(f"{FORK}-*"):
            if older != tree and (older / _DONE_MARKER).is_file():
                shutil.rmtree(older, ignore_errors=True)  # a stand-in of older inputs
                log(f"removed {older.name} (a fork-shaped stand-in of older inputs)")
    return tree


def release_tree(version: str, log=lambda message: None) -> Path:
    """Return the directory that holds the ``vllm/`` package of ``version``.

    ``version`` is a pinned release or ``"fork"`` (the fork-shaped stand-in, see
    ``fork_tree``). The first call downloads and checks the wheel; later calls only
    look at disk. Concurrent callers (parallel test workers) serialise on a
    per-version lock and the tree is published by one atomic rename, so nobody sees
    a partial tree.
    """
    if version == FORK:
        return fork_tree(log)
    if version not in WHEEL_SHA256:
        known = ", ".join(known_trees())
        raise SourceError(f"vllm {version} has no pinned wheel hash; pinned releases: {known}")
    tree = _tree_dir(version)
    if (tree / _DONE_MARKER).is_file():
        return tree
    with _exclusive(tree.parent / f".{version}.lock"):
        if (tree / _DONE_MARKER).is_file():
            return tree
        staging = Path(tempfile.mkdtemp(prefix=f".{version}-", dir=tree.parent))
        try:
            wheel = _download_wheel(version, staging / "wheel", log)
            actual = _sha256(wheel)
            if actual != WHEEL_SHA256[version]:
                raise SourceError(
                    f"{wheel.name}: sha256 {actual} does not match the pin "
                    f"{WHEEL_SHA256[version]} in recipekit/vllm_sources.py; refusing it"
                )
            count = _extract_python(wheel, staging / "tree")
            log(f"extracted {count} Python files of vllm {version}")
            (staging / "tree" / _DONE_MARKER).write_text(f"{version} {actual}\n")
            if tree.exists():
                shutil.rmtree(tree)
            os.replace(staging / "tree", tree)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return tree
