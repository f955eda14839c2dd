"""Fixtures of the vllm tier: real release trees from PyPI, copied per test."""

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from recipekit.pinned_wheels import DONE_MARKER
from recipekit.vllm_sources import cache_root, release_tree
from tests.prewarmed import prewarmed

REPO_ROOT = Path(__file__).resolve().parents[2]
# vLLM's and FlashInfer's own caches, which the tier's engines and imports write (vLLM's
# model-info inspections, FlashInfer's JIT log): in the recipe cache, not the user's home.
OWN_CACHES = {"VLLM_CACHE_ROOT": "vllm", "FLASHINFER_WORKSPACE_BASE": "flashinfer"}


def pytest_configure(config):
    """Before any command or prewarmed interpreter starts, so every one inherits them."""
    for name, subdir in OWN_CACHES.items():
        os.environ[name] = str(cache_root() / "vllm-tier" / subdir)


@pytest.fixture(scope="session")
def release():
    """release("0.27.1") -> the cached, read-only release tree (fetched once)."""
    return release_tree


@pytest.fixture
def tree_copy(tmp_path, release):
    """tree_copy("0.27.1") -> a private copy of a release tree that a test may patch.

    Files are hard links: the applier replaces files through a rename, never in
    place, so the cache is never changed (and a test would notice if it were).
    """

    def make(version: str) -> Path:
        target = tmp_path / f"vllm-{version}"
        shutil.copytree(release(version), target, copy_function=os.link)
        return target

    return make


def tree_digest(root: Path) -> dict[str, str]:
    """sha256 of every file under root, by relative path."""
    return {
        str(path.relative_to(root)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(root.rglob("*"))
        if path.is_file()
    }


# What vLLM's API server imports besides vLLM, less what must stay out: transformers (and
# xgrammar, which imports it) decides at import which of torchvision, torchaudio and
# torchcodec it may use, and the probes hide those first (tests/vllm/test_launcher_vllm_args.py
# says why); opencv, grpc and OpenTelemetry start threads. About 5 CPU-seconds an import on
# the 2-core CI machine, paid once per worker instead of once per probe.
VLLM_DEPENDENCIES = (
    "torch", "torch._inductor", "openai", "fastapi", "pydantic", "zmq", "numpy", "aiohttp",
    "uvicorn", "triton", "sympy", "safetensors", "tokenizers", "huggingface_hub",
    "prometheus_client", "msgspec", "PIL", "tiktoken", "cbor2", "psutil", "cloudpickle",
    "llguidance",
)


def run_python(args, **options) -> subprocess.CompletedProcess:
    """subprocess.run for a command of this interpreter: forked from one that has imported
    vLLM's dependencies where the command would run the same alone (tests/prewarmed.py),
    else a fresh interpreter."""
    return prewarmed(VLLM_DEPENDENCIES).run(args, **options)


def run_script(*args: str, cwd: Path = REPO_ROOT, env: dict | None = None):
    """Run a repository script with this interpreter; returns the CompletedProcess."""
    return run_python(
        [sys.executable, *args], cwd=cwd, capture_output=True, text=True,
        env={**os.environ, **(env or {})}, timeout=900, check=False,
    )


def published_state(tree: Path) -> tuple:
    """What a rebuild of a cached tree would change: the tree's inode (a new tree is renamed
    into place), its completion marker's time, and its folder's entries (a rebuild stages
    beside it)."""
    return (tree.stat().st_ino, (tree / DONE_MARKER).stat().st_mtime_ns,
            sorted(entry.name for entry in tree.parent.iterdir()))


def patch_layer(layer: str, root: Path, *extra: str) -> tuple[int, dict, str]:
    """scripts/patch-layer LAYER --root ROOT --json EXTRA: (exit code, its report or {}, stderr)."""
    result = run_script("scripts/patch-layer", layer, "--root", str(root), "--json", *extra)
    return result.returncode, (json.loads(result.stdout) if result.stdout.strip() else {}), result.stderr


def run_probes(tree: Path, cases: dict[str, dict], preload: list[str], fresh: list[str],
               env: dict[str, str] | None = None) -> dict[str, subprocess.CompletedProcess]:
    """Run several probes (tests/vllm/probes/NAME) on one tree in one interpreter
    (tests/vllm/probes/runner.py): it imports `preload` once, then each case runs in a fork
    of it as if alone, `fresh` (the modules that read the cases' environment at import)
    imported by each case itself.

    cases: {name: {"script": NAME, "args": [...], "env": {...}}} -> {name: CompletedProcess}
    with the probe's exit code, stdout and stderr. `env` (default: this process's) is the
    environment every case starts from, with PYTHONPATH the tree.
    """
    with tempfile.TemporaryDirectory(prefix="probes-") as tmp:
        request, answer = Path(tmp) / "request.json", Path(tmp) / "answer.json"
        names = list(cases)
        request.write_text(json.dumps({"preload": preload, "fresh": fresh, "cases": [
            {**cases[name], "script": str(REPO_ROOT / "tests/vllm/probes" / cases[name]["script"])}
            for name in names]}))
        result = run_python(
            [sys.executable, str(REPO_ROOT / "tests/vllm/probes/runner.py"), str(request), str(answer)],
            capture_output=True, text=True, timeout=900 + 300 * len(cases), check=False,
            env={**(os.environ if env is None else env), "PYTHONPATH": str(tree),
                 "PYTHONDONTWRITEBYTECODE": "1"},
        )
        assert result.returncode == 0 and answer.is_file(), result.stderr[-3000:]
        answers = json.loads(answer.read_text())
    return {name: subprocess.CompletedProcess(cases[name]["script"], a["returncode"], a["stdout"], a["stderr"])
            for name, a in zip(names, answers)}


@pytest.fixture(scope="session")
def diff_dir(tmp_path_factory):
    """scripts/make-backport's diffs (v9's DFlash2 backport per shape and the salt), made once."""
    out = tmp_path_factory.mktemp("backports")
    result = run_script("scripts/make-backport", "--out-dir", str(out))
    assert result.returncode == 0, result.stderr
    return out


def package_digest(root: Path, packages: tuple[str, ...]) -> str:
    """One sha256 over every file under PACKAGES (paths below a tree's root), names included."""
    digest = hashlib.sha256()
    for package in packages:
        for path in sorted((root / package).rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts:
                digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def answered_by(trees: tuple[str, ...], packages: tuple[str, ...], release) -> dict[str, str]:
    """{tree: the tree whose probe answers for it}: a tree whose files under PACKAGES are
    byte-identical to an earlier tree's is answered by that one's probe (the fork-shaped
    stand-in differs from 0.27.1, its base, in 24 files, none under entrypoints/ or the MoE
    layers), so a probe of those packages runs once per distinct copy of them. Decided by
    the bytes on every run: a pin whose files part ways gets its own probe."""
    first_of: dict[str, str] = {}
    out = {}
    for tree in trees:
        out[tree] = first_of.setdefault(package_digest(release(tree), packages), tree)
    return out
