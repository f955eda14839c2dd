"""Pinned wheels from PyPI unpacked once into the recipe cache: fetch, check sha256, extract.

A tree is published by one atomic rename after the wheel's sha256 matched its pin, so a
caller never sees a partial tree, and concurrent callers (parallel test workers) serialise
on a per-tree lock. ``recipekit.vllm_sources`` (vLLM release trees) and
``recipekit.flashinfer_sources`` (FlashInfer package trees) are the two users.
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
from dataclasses import dataclass
from pathlib import Path

from recipekit.bootstrap import CACHE_ENV, cache_root

DONE_MARKER = ".complete"  # written last into a published tree


class SourceError(RuntimeError):
    """A pinned tree cannot be provided; the message says why and what to do."""


@dataclass(frozen=True)
class PinnedWheel:
    """One wheel on PyPI, the package directory kept from it, and where its tree is cached."""

    project: str  # distribution name, e.g. "vllm", "flashinfer-python"
    version: str
    sha256: str
    package: str  # top-level directory kept from the wheel, e.g. "vllm"
    cache_dir: str  # under the cache root, e.g. "vllm-src"
    platform: str | None = None  # None: a pure-Python wheel (py3-none-any)
    python: str = "3.12"
    suffixes: tuple[str, ...] = ()  # keep only these file suffixes; empty: every file
    pin_file: str = ""  # where the pin lives, named when the hash differs

    @property
    def wheel_prefix(self) -> str:
        return f"{self.project.replace('-', '_')}-{self.version}-"


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


@contextlib.contextmanager
def exclusive(lock_path: Path):
    """Hold an exclusive lock on ``lock_path`` (created if missing) for the block."""
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with lock_path.open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _download(wheel: PinnedWheel, dest: Path, log) -> Path:
    where = (
        ["--platform", wheel.platform, "--python-version", wheel.python] if wheel.platform else []
    )
    command = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        *where,
        "--disable-pip-version-check",
        "--quiet",
        "-d",
        str(dest),
        f"{wheel.project}=={wheel.version}",
    ]
    log(
        f"fetching {wheel.project} {wheel.version} wheel ({wheel.platform or 'pure Python'}) from PyPI"
    )
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    found = sorted(dest.glob(f"{wheel.wheel_prefix}*.whl"))
    if result.returncode != 0 or len(found) != 1:
        tail = (result.stderr or result.stdout).strip().splitlines()[-1:] or ["no output"]
        raise SourceError(
            f"pip download {wheel.project}=={wheel.version} failed: {tail[0]}; check PyPI access"
        )
    return found[0]


def _extract(wheel: PinnedWheel, path: Path, dest: Path) -> int:
    count = 0
    with zipfile.ZipFile(path) as archive:
        for member in archive.infolist():
            name = member.filename
            if member.is_dir() or not name.startswith(f"{wheel.package}/"):
                continue
            if wheel.suffixes and not name.endswith(wheel.suffixes):
                continue
            if name.startswith("/") or ".." in Path(name).parts:
                raise SourceError(f"{path.name}: unsafe member path {name!r}; refusing the wheel")
            target = dest / name
            target.parent.mkdir(parents=True, exist_ok=True)
            with archive.open(member) as src, target.open("wb") as out:
                shutil.copyfileobj(src, out)
            count += 1
    return count


def wheel_file(wheel: PinnedWheel, log=lambda message: None) -> Path:
    """The pinned wheel itself, kept in ``wheels/`` of the cache after its sha256 matched."""
    directory = cache_root() / "wheels"
    found = sorted(directory.glob(f"{wheel.wheel_prefix}*.whl"))
    if len(found) == 1 and sha256_file(found[0]) == wheel.sha256:
        return found[0]
    with exclusive(directory / f".{wheel.wheel_prefix}lock"):
        staging = Path(tempfile.mkdtemp(prefix=".wheel-", dir=directory))
        try:
            path = _download(wheel, staging, log)
            actual = sha256_file(path)
            if actual != wheel.sha256:
                raise SourceError(
                    f"{path.name}: sha256 {actual} does not match the pin "
                    f"{wheel.sha256} in {wheel.pin_file or 'recipekit'}; refusing it"
                )
            for older in found:
                older.unlink()
            os.replace(path, directory / path.name)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return directory / path.name


def publish_tree(staged: Path, tree: Path, marker: str) -> None:
    """Puts the finished STAGED tree in TREE's place, marked complete with MARKER (inside it
    before the move, so a half-built tree never has the marker)."""
    (staged / DONE_MARKER).write_text(marker)
    if tree.exists():
        shutil.rmtree(tree)
    os.replace(staged, tree)


def unpacked_tree(wheel: PinnedWheel, log=lambda message: None) -> Path:
    """The directory holding ``wheel.package/`` of the pinned wheel, fetched on first use."""
    tree = cache_root() / wheel.cache_dir / wheel.version
    if (tree / DONE_MARKER).is_file():
        return tree
    with exclusive(tree.parent / f".{wheel.version}.lock"):
        if (tree / DONE_MARKER).is_file():
            return tree
        staging = Path(tempfile.mkdtemp(prefix=f".{wheel.version}-", dir=tree.parent))
        try:
            path = _download(wheel, staging / "wheel", log)
            actual = sha256_file(path)
            if actual != wheel.sha256:
                raise SourceError(
                    f"{path.name}: sha256 {actual} does not match the pin "
                    f"{wheel.sha256} in {wheel.pin_file or 'recipekit'}; refusing it"
                )
            count = _extract(wheel, path, staging / "tree")
            kind = "Python files" if wheel.suffixes == (".py",) else "files"
            log(f"extracted {count} {kind} of {wheel.project} {wheel.version}")
            publish_tree(staging / "tree", tree, f"{wheel.version} {actual}\n")
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return tree
