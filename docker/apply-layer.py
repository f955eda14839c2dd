#!/usr/bin/env python3
"""The one build step of every image layer: install the toolkit, then probe, apply, verify.

Run by the Dockerfiles as `python3 /opt/glm53-recipe/.incoming/docker/apply-layer.py LAYER`
after COPYing the build context (staged by scripts/build.sh) to /opt/glm53-recipe/.incoming/.

1. Moves the toolkit (scripts/, recipekit/, patches/, ...) from .incoming/ to
   /opt/glm53-recipe/, replacing what an earlier layer put there.
2. Installs the layer tool's dependencies (requirements/tool.txt) from the wheelhouse in the
   context, offline (pip --no-index), into /opt/glm53-recipe/pylib, so the base's own Python
   packages are left alone. A later layer with the same wheelhouse reuses the install.
3. Finds the installed vllm package without importing it (importlib.util.find_spec).
   v8 only: installs the pinned packages (patches/v8/packages*.txt, the set for the base's
   vLLM release) from the context's sm121-wheelhouse/ into the base's Python, offline (scripts/sm121-packages install), checks
   them in a fresh interpreter (versions equal the pins, flashinfer-jit-cache absent,
   flashinfer installed beside vllm), and deletes the wheelhouse again.
4. Runs scripts/patch-layer LAYER --root <dir holding vllm/> --json and writes its result to
   /opt/glm53-recipe/build-record/LAYER.json, which scripts/build.sh reads back from the
   built image before it labels and tags it. A refusal fails the build (exit 3) and prints
   the reason.

Standard library only; the base's python3 must be 3.10 or newer (what patch-layer needs).
"""

import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

RECIPE = Path("/opt/glm53-recipe")
INCOMING = RECIPE / ".incoming"
PYLIB = RECIPE / "pylib"
RECORDS = RECIPE / "build-record"
STAMP = PYLIB / ".glm53-wheelhouse-sha256"
# What the context brings (scripts/build.sh stages exactly these).
TOOLKIT = ("scripts", "recipekit", "patches", "requirements", "docker", "wheelhouse", "backport")
LAYERS = ("v8", "v9", "v10", "v11", "v13")
OK_OUTCOMES = ("applied", "already-applied", "provided-by-base")
BACKPORT_DIFFS = RECIPE / "backport"  # dflash2-SHAPE.diff; patch-layer v9 probes which applies
# v8's packages arrive in the context beside the toolkit and are installed from there.
SM121_WHEELHOUSE = INCOMING / "sm121-wheelhouse"


def say(message: str) -> None:
    print(f"glm53 layer: {message}", flush=True)


def fail(message: str, code: int = 2) -> None:
    print(f"glm53 layer: error: {message}", file=sys.stderr, flush=True)
    sys.exit(code)


def install_toolkit(layer: str) -> None:
    if not INCOMING.is_dir():
        fail(f"{INCOMING} is missing; build with scripts/build.sh (it stages the context)")
    wanted = TOOLKIT + (("sm121-wheelhouse",) if layer == "v8" else ())
    missing = [name for name in wanted if not (INCOMING / name).exists()]
    if missing:
        fail(f"the build context lacks {', '.join(missing)}; build with scripts/build.sh")
    for name in TOOLKIT:
        target = RECIPE / name
        if target.is_dir() and not target.is_symlink():
            shutil.rmtree(target)
        elif target.exists() or target.is_symlink():
            target.unlink()
        # a move, not a rename: on overlay2 a directory from an earlier image layer
        # cannot be renamed (EXDEV), so it is copied and the staged copy removed
        shutil.move(INCOMING / name, target)


def wheelhouse_digest() -> str:
    digest = hashlib.sha256()
    for path in sorted((RECIPE / "wheelhouse").glob("*.whl")):
        digest.update(path.name.encode() + b"\0" + hashlib.sha256(path.read_bytes()).digest())
    digest.update((RECIPE / "requirements" / "tool.txt").read_bytes())
    return digest.hexdigest()


def install_dependencies() -> None:
    wanted = wheelhouse_digest()
    if STAMP.is_file() and STAMP.read_text().strip() == wanted:
        say(f"tool dependencies already in {PYLIB} (same wheelhouse)")
        return
    if subprocess.run(
        [sys.executable, "-m", "pip", "--version"], capture_output=True, check=False
    ).returncode:
        fail(
            f"{sys.executable} -m pip is not available in this base; the layer tool's "
            f"dependencies are installed with pip from {RECIPE / 'wheelhouse'} (offline)"
        )
    shutil.rmtree(PYLIB, ignore_errors=True)
    command = [
        sys.executable,
        "-m",
        "pip",
        "install",
        "--quiet",
        "--no-index",
        "--no-compile",
        "--no-warn-script-location",
        "--find-links",
        str(RECIPE / "wheelhouse"),
        "--target",
        str(PYLIB),
        "-r",
        str(RECIPE / "requirements" / "tool.txt"),
    ]
    # The base's pip configuration (indexes, constraints) has no say: only the wheelhouse.
    env = {key: value for key, value in os.environ.items() if not key.startswith("PIP_")}
    env.update(
        PIP_CONFIG_FILE=os.devnull, PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_ROOT_USER_ACTION="ignore"
    )
    if subprocess.run(command, env=env, check=False).returncode:
        fail(
            f"pip could not install requirements/tool.txt from {RECIPE / 'wheelhouse'}; the "
            "wheelhouse must match this base's Python and platform (scripts/build.sh makes it)"
        )
    STAMP.write_text(wanted + "\n")
    say(f"tool dependencies installed offline into {PYLIB}")


def vllm_root() -> Path:
    """The directory holding the vllm/ package, found without importing vllm."""
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        fail(f"no vllm package is importable by {sys.executable} in this base")
    locations = list(spec.submodule_search_locations)
    if len(locations) != 1:
        fail(f"vllm is a namespace package spread over {locations}; expected one installed tree")
    package = Path(locations[0]).resolve()
    if not (package / "__init__.py").is_file():
        fail(f"{package} has no __init__.py; expected an installed vllm package")
    if not os.access(package, os.W_OK):
        fail(f"{package} is not writable by uid {os.getuid()}; build the layer as root")
    return package.parent


def install_packages(root: Path) -> dict:
    """v8's pinned packages, installed from the context's wheelhouse and checked afresh."""
    tool = str(RECIPE / "scripts" / "sm121-packages")
    # the base's vLLM release picks the set (patches/v8/packages-vllm-X.txt, else packages.txt)
    say("v8: installing the pinned packages of this base's set (offline)")
    if subprocess.run([sys.executable, tool, "install", "--wheelhouse", str(SM121_WHEELHOUSE),
                       "--root", str(root)]).returncode:
        fail("v8: the pinned packages could not be installed (output above)")
    result = subprocess.run(
        [sys.executable, tool, "check", "--root", str(root), "--json"],
        stdout=subprocess.PIPE, text=True, check=False,
    )
    try:
        report = json.loads(result.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        fail(f"v8: sm121-packages check exited {result.returncode} without a JSON result")
    for line in report.get("notes", []):
        say(f"v8: note: {line}")
    if not report.get("ok"):
        problems = "; ".join(report.get("problems", []))
        print(f"glm53 layer: v8: REFUSED: the installed packages are not the pins: {problems}",
              file=sys.stderr, flush=True)
        sys.exit(3)
    say(f"v8: packages checked: {' '.join(report['packages'])}")
    return report


def run_layer(layer: str, root: Path) -> dict:
    command = [
        sys.executable,
        str(RECIPE / "scripts" / "patch-layer"),
        layer,
        "--root",
        str(root),
        "--json",
    ]
    if layer == "v9":
        command += ["--diff", str(BACKPORT_DIFFS)]
    if layer == "v8":
        command += ["--require-flashinfer"]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(PYLIB), env.get("PYTHONPATH", "")]))
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    say(f"{layer}: scripts/patch-layer {layer} --root {root}")
    result = subprocess.run(command, stdout=subprocess.PIPE, text=True, env=env, check=False)
    try:
        record = json.loads(result.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        fail(
            f"{layer}: patch-layer exited {result.returncode} without a JSON result: {result.stdout!r}"
        )
    if record.get("layer") != layer or "outcome" not in record:
        fail(f"{layer}: patch-layer printed an unexpected result: {record}")
    outcome = record["outcome"]
    if outcome == "refused" or result.returncode == 3:
        print(
            f"glm53 layer: {layer}: REFUSED: {record.get('reason', '')}",
            file=sys.stderr,
            flush=True,
        )
        sys.exit(3)
    if result.returncode != 0 or outcome not in OK_OUTCOMES:
        fail(f"{layer}: patch-layer exited {result.returncode} with outcome {outcome!r}")
    return record


def main() -> None:
    # LAYER, then the layer's own extra patchers (named LAYER_*), each with its own record.
    if len(sys.argv) < 2 or sys.argv[1] not in LAYERS or any(
            not extra.startswith(f"{sys.argv[1]}_") for extra in sys.argv[2:]):
        fail(f"usage: apply-layer.py {{{'|'.join(LAYERS)}}} [LAYER_PATCHER ...]")
    layer, extras = sys.argv[1], sys.argv[2:]
    if sys.version_info < (3, 10):  # noqa: UP036 (runs on the base's python3, whatever it is)
        fail(f"the layer tool needs Python >= 3.10; {sys.executable} is {sys.version.split()[0]}")
    root = vllm_root()
    say(f"{layer}: vllm package at {root / 'vllm'} (python {sys.version.split()[0]})")
    install_toolkit(layer)
    install_dependencies()
    packages = install_packages(root) if layer == "v8" else None
    shutil.rmtree(INCOMING)
    for patcher in (layer, *extras):
        record = run_layer(patcher, root)
        if packages is not None and patcher == layer:
            record["packages"] = packages["packages"]
            record["package_notes"] = packages["notes"]
        record["vllm_root"] = str(root)
        record["python"] = ".".join(map(str, sys.version_info[:3]))
        RECORDS.mkdir(parents=True, exist_ok=True)
        (RECORDS / f"{patcher}.json").write_text(json.dumps(record, indent=2) + "\n")
        say(f"{patcher}: {record['outcome']}: {record.get('reason', '')}")
        for name in record.get("files", []):
            say(f"{patcher}:   {name}")


if __name__ == "__main__":
    main()
