"""What the image layers are built from: the v9 backport, the wheelhouses, the staged build
context, and the hashes that say when an image is up to date. No docker here."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from recipekit.bootstrap import cache_root
from recipekit.sm121_packages import packages_for

REPO_ROOT = Path(__file__).resolve().parents[2]
BUILD_DIR = REPO_ROOT / "build"
# Bump when what an image is built from, or how it is labelled, changes outside the hashed
# inputs (build context, Dockerfile, base image ID); it is part of the inputs hash.
SCHEME = "glm53-build-3"
TOOL_REQUIREMENTS = REPO_ROOT / "requirements" / "tool.txt"
# What the Dockerfiles COPY: docker/apply-layer.py moves these into /opt/glm53-recipe.
TOOLKIT_DIRS = ("scripts", "recipekit", "patches")


class BuildError(Exception):
    """A build that cannot go on: one line, printed as `build.sh: error: ...` (exit 1)."""


def relative(path: Path) -> str:
    return str(path.relative_to(REPO_ROOT)) if path.is_relative_to(REPO_ROOT) else str(path)


def sha256_file(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def tree_hash(directory: Path) -> str:
    """A hash of every file under DIRECTORY: paths, contents and the executable bit."""
    digest = hashlib.sha256()
    for path in sorted(directory.rglob("*")):
        if path.is_symlink():
            raise BuildError(f"{path} is a symlink; the build context must be plain files")
        if path.is_file():
            executable = "x" if os.access(path, os.X_OK) else "-"
            digest.update(f"{path.relative_to(directory)}\0{executable}\0{sha256_file(path)}\n".encode())
    return digest.hexdigest()


def packages_file(layer: str) -> Path:  # where a layer that installs packages pins them (v8)
    return REPO_ROOT / "patches" / layer / "packages.txt"


@dataclass(frozen=True)
class BaseFacts:
    """What the base image's probe found: its Python, machine, glibc and vLLM release ("-"
    when its vllm/_version.py states none)."""
    python: str
    machine: str
    glibc: str
    vllm: str

    def packages(self, layer: str) -> Path:
        """The package set LAYER installs on this base: v8's is the one for its vLLM release."""
        if layer == "v8":
            return packages_for(None if self.vllm == "-" else self.vllm)
        return packages_file(layer)

    def pip_platforms(self) -> list[str]:
        """pip's --platform flags for every manylinux tag this glibc runs."""
        tags = [f"manylinux_2_{n}" for n in range(5, int(self.glibc.split(".")[1]) + 1)]
        return [flag for tag in tags + ["manylinux2014", "manylinux2010", "manylinux1"]
                for flag in ("--platform", f"{tag}_{self.machine}")]


def prepare_backport(python: str) -> tuple[Path, str, str]:
    """The v9 diffs (DFlash2 per base shape, the draft-noise salt per salt shape; the layer's
    probe picks them in the image), generated from the pinned vLLM releases once and checked
    against patches/v9/manifest.json: (directory, the pins' sha256, what happened)."""
    manifest = REPO_ROOT / "patches" / "v9" / "manifest.json"
    try:
        recorded = json.loads(manifest.read_text())
        pins = {f"dflash2-{shape}": pin for shape, pin in recorded["diff_sha256"].items()}
        pins |= {f"draft-noise-salt-{shape}": pin
                 for shape, pin in recorded["draft_noise_salt"]["diff_sha256"].items()}
    except (OSError, ValueError, KeyError):
        raise BuildError(f"{relative(manifest)}: no diff_sha256; see scripts/make-backport") from None
    sha = hashlib.sha256("".join(f"{shape} {pin}\n" for shape, pin in sorted(pins.items())).encode()).hexdigest()
    out = BUILD_DIR / "backport" / sha[:16]

    def matches(directory: Path) -> bool:
        diffs = {name: directory / f"{name}.diff" for name in pins}
        return all(diff.is_file() and sha256_file(diff) == pins[name] for name, diff in diffs.items())

    if matches(out):
        return out, sha, f"cached, {len(pins)} diffs"
    staging = out.with_name(out.name + ".tmp")
    shutil.rmtree(staging, ignore_errors=True)
    made = subprocess.run([python, str(REPO_ROOT / "scripts" / "make-backport"), "--out-dir",
                           str(staging)], stdout=sys.stderr, check=False)
    if made.returncode != 0 or not matches(staging):
        raise BuildError("scripts/make-backport failed (output above) or wrote a diff whose sha256 "
                         f"differs from {relative(manifest)}'s pin; nothing was built")
    return _swap_in(staging, out), sha, f"generated, {len(pins)} diffs"


def wheelhouse(python: str, facts: BaseFacts, requirements: Path, kind: str, *extra: str) -> tuple[Path, str]:
    """REQUIREMENTS as wheels for the base's Python and platform, downloaded on the host once
    into the cache's KIND/ (the containers reach no registry); (directory, what happened)."""
    pinned = requirements.read_bytes() + (f"{extra[-1]}\n".encode() if extra else b"")
    key = f"cp{facts.python.replace('.', '')}-{facts.machine}-glibc{facts.glibc}-{hashlib.sha256(pinned).hexdigest()[:12]}"
    directory = cache_root() / kind / key
    if (directory / ".complete").is_file():
        return directory, "cached"
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(parents=True)
    pip = [python, "-m", "pip", "download", "--quiet", "--disable-pip-version-check",
           "--only-binary=:all:", "--implementation", "cp", "--python-version", facts.python,
           *facts.pip_platforms(), *[flag for flag in extra if flag], "-d", str(directory), "-r", str(requirements)]
    if subprocess.run(pip, stdout=sys.stderr, check=False).returncode != 0:
        raise BuildError(f"pip download of {relative(requirements)} for Python {facts.python} "
                         f"{facts.machine} failed (above); PyPI must be reachable from this host")
    (directory / ".complete").touch()
    return directory, "downloaded"


def tool_wheelhouse(python: str, facts: BaseFacts) -> tuple[Path, str]:
    """requirements/tool.txt's wheels (GLM53_WHEELHOUSE names a ready-made directory)."""
    if not (given := os.environ.get("GLM53_WHEELHOUSE")):
        return wheelhouse(python, facts, TOOL_REQUIREMENTS, "wheelhouse")
    if not list(Path(given).glob("*.whl")):
        raise BuildError(f"GLM53_WHEELHOUSE={given} holds no .whl files")
    return Path(given), "GLM53_WHEELHOUSE"


def packages_wheelhouse(python: str, facts: BaseFacts, layer: str) -> tuple[Path, str]:
    """LAYER's pinned packages, sha256-checked; the documented alternative pins (FlashInfer's
    nightly) live on GLM53_SM121_EXTRA_INDEX."""
    index = os.environ.get("GLM53_SM121_EXTRA_INDEX", "")
    return wheelhouse(python, facts, facts.packages(layer), "sm121-wheelhouse", "--no-deps",
                      "--require-hashes", "--extra-index-url" if index else "", index)


@dataclass
class Context:  # a staged build context and the hashes its labels carry
    path: Path
    sha256: str
    wheelhouse_sha256: str
    packages_sha256: str = ""  # the packages wheelhouse, in a packages layer's context


def _link(source: str, target: str) -> None:
    try:
        os.link(source, target)
    except OSError:  # another file system
        shutil.copy2(source, target)


def _swap_in(staging: Path, final: Path) -> Path:
    shutil.rmtree(final, ignore_errors=True)
    return staging.rename(final)


def stage_context(wheelhouse: Path, backport: Path) -> Context:
    """build/context: exactly what the Dockerfiles COPY, so that its hash is the build's input."""
    staging = BUILD_DIR / "context.new"
    shutil.rmtree(staging, ignore_errors=True)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name in TOOLKIT_DIRS:
        shutil.copytree(REPO_ROOT / name, staging / name, ignore=ignore)
    for name, files in (("requirements", [TOOL_REQUIREMENTS]), ("docker", [REPO_ROOT / "docker" / "apply-layer.py"]),
                        ("wheelhouse", wheelhouse.glob("*.whl")), ("backport", backport.glob("*.diff"))):
        (staging / name).mkdir()
        for path in sorted(files):
            shutil.copy2(path, staging / name)
    (staging / ".dockerignore").write_text(".dockerfile.*\n")  # the Dockerfile the SDK adds
    final = _swap_in(staging, BUILD_DIR / "context")
    return Context(final, tree_hash(final), tree_hash(final / "wheelhouse"))


def stage_packages_context(base: Context, layer: str, wheels: Path) -> Context:
    """build/context-LAYER: the shared context plus the packages wheelhouse (hard links)."""
    staging = BUILD_DIR / f"context-{layer}.new"
    shutil.rmtree(staging, ignore_errors=True)
    shutil.copytree(base.path, staging, copy_function=_link)
    shutil.copytree(wheels, staging / "sm121-wheelhouse", copy_function=_link,
                    ignore=shutil.ignore_patterns(".complete"))
    final = _swap_in(staging, BUILD_DIR / f"context-{layer}")
    return Context(final, tree_hash(final), base.wheelhouse_sha256, tree_hash(final / "sm121-wheelhouse"))


def dockerfile_of(layer: str) -> Path:
    return REPO_ROOT / "docker" / f"Dockerfile.sm121-{layer}"


def inputs_hash(layer: str, base_id: str, context: Context) -> str:
    text = f"{SCHEME} {layer} {base_id} {sha256_file(dockerfile_of(layer))} {context.sha256}"
    return hashlib.sha256(text.encode()).hexdigest()


def patch_hash(layer: str) -> str:
    """The layer's own patch material: its patcher modules (LAYER and LAYER_*, e.g. v13's
    groups and weight groups), the recipekit.layers modules they import (v8's sm121_*, v10's
    glm5next), and its patches/ directory."""
    layers_dir = REPO_ROOT / "recipekit" / "layers"
    modules, todo = set(), [layer, *(path.stem for path in layers_dir.glob(f"{layer}_*.py"))]
    while todo:
        if (name := todo.pop()) not in modules and (layers_dir / f"{name}.py").is_file():
            modules.add(name)
            todo += re.findall(r"^from recipekit\.layers\.(\w+) import", (layers_dir / f"{name}.py").read_text(), re.M)
    digest = hashlib.sha256()
    for name in sorted(modules):
        digest.update(f"{name} {sha256_file(layers_dir / f'{name}.py')}\n".encode())
    patches = REPO_ROOT / "patches" / layer
    digest.update(f"patches {tree_hash(patches) if patches.is_dir() else 'none'}\n".encode())
    return digest.hexdigest()


def recipe_commit() -> str:
    """HEAD, with -dirty when what the images are built from has uncommitted changes."""
    def git(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["git", "-C", str(REPO_ROOT), *args], capture_output=True, text=True, check=False)
    head, status = git("rev-parse", "HEAD"), git("status", "--porcelain", "--", *TOOLKIT_DIRS, "requirements/tool.txt", "docker")
    return head.stdout.strip() + ("-dirty" if status.stdout.strip() else "") if head.returncode == 0 else "unknown"
