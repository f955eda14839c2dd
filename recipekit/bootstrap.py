"""Every Python entry point in scripts/ runs from a fresh clone with nothing but python3.

Standard library only (it runs before any dependency exists). A script names the
modules it needs; when they import here, nothing happens (the test venv, the serving
image's /opt/glm53-recipe/pylib, a user's own environment). Otherwise the script is
re-run in the recipe's tool environment: a virtualenv built once from
requirements/tool.txt, drafter.txt and build.txt in the recipe cache, keyed by the
hash of those files, announced by one progress line. When that cannot be built the
script stops with one line naming the exact command that fixes it; never a traceback.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.util
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
REQUIREMENTS = tuple(REPO_ROOT / "requirements" / name for name in ("tool.txt", "drafter.txt", "build.txt"))
INSIDE = "GLM53_TOOL_ENV"  # set in the re-run, so a broken environment cannot loop
MIN_PYTHON = (3, 11)


CACHE_ENV = "GLM53_RECIPE_CACHE"  # where the recipe keeps its venvs, trees and wheels


def cache_root() -> Path:
    """The recipe cache: $GLM53_RECIPE_CACHE, else glm53-recipe under the user's cache."""
    override = os.environ.get(CACHE_ENV)
    if override:
        return Path(override)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "glm53-recipe"


def _install_command() -> str:
    files = " ".join(f"-r {p.relative_to(REPO_ROOT)}" for p in REQUIREMENTS)
    return f"python3 -m pip install {files}"


def _refuse(tool: str, message: str) -> None:
    print(f"{tool}: {message}", file=sys.stderr)
    sys.exit(2)


def tool_venv_dir() -> Path:
    digest = hashlib.sha256()
    for path in REQUIREMENTS:
        digest.update(path.read_bytes())
    return cache_root() / f"tool-venv-{digest.hexdigest()[:12]}"


@contextlib.contextmanager
def _locked(path: Path):
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def _build(tool: str, venv: Path) -> None:
    started = time.monotonic()
    print(f"{tool}: building the tool environment {venv} from requirements/tool.txt, "
          "drafter.txt and build.txt (once; a minute or two)", file=sys.stderr, flush=True)
    shutil.rmtree(venv, ignore_errors=True)
    made = subprocess.run([sys.executable, "-m", "venv", str(venv)], capture_output=True, text=True, check=False)
    if made.returncode != 0:
        shutil.rmtree(venv, ignore_errors=True)
        _refuse(tool, f"python3 -m venv failed ({(made.stderr.strip().splitlines() or ['?'])[-1]}); "
                f"install the venv module (apt-get install python3-venv) or run: {_install_command()}")
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    for path in REQUIREMENTS:
        pip += ["-r", str(path)]
    installed = subprocess.run(pip, capture_output=True, text=True, check=False)
    if installed.returncode != 0:
        shutil.rmtree(venv, ignore_errors=True)
        last = (installed.stderr.strip().splitlines() or ["no output"])[-1]
        _refuse(tool, f"pip could not install the tool environment ({last}); PyPI must be reachable "
                f"once, or run: {_install_command()}")
    (venv / ".complete").write_text("ok\n")
    print(f"{tool}: tool environment ready in {time.monotonic() - started:.0f} s", file=sys.stderr, flush=True)


HELP_WORDS = ("-h", "--help")


def help_asked(args: list[str]) -> bool:
    return any(arg in HELP_WORDS for arg in args)


def print_help_without(tool: str, missing: list[str]) -> None:
    """Help that builds nothing: the script's own docstring, and where its options come from."""
    main = sys.modules.get("__main__")
    doc = (getattr(main, "__doc__", None) or "").strip()
    print(f"usage: {tool} [options] (this python3 lacks what --help needs to list them)\n")
    print(f"{doc}\n\n" if doc else "", end="")
    print(f"{tool}: its full option list (--help) needs {', '.join(missing)}, which this python3 "
          "lacks; the first run without --help builds the recipe's tool environment once "
          f"(PyPI, a minute or two), or install them: {_install_command()}")


def require_tool_env(tool: str, modules: tuple[str, ...] = ("unidiff", "libcst")) -> None:
    """Return when ``modules`` import; else re-run this script in the tool environment."""
    if sys.version_info < MIN_PYTHON:
        _refuse(tool, f"needs Python >= 3.11; {sys.executable} is {sys.version.split()[0]}")
    missing = [name for name in modules if importlib.util.find_spec(name) is None]
    if not missing:
        return
    if help_asked(sys.argv[1:]):
        print_help_without(tool, missing)
        sys.exit(0)
    if os.environ.get(INSIDE):
        _refuse(tool, f"the tool environment {sys.prefix} lacks {', '.join(missing)}; "
                f"delete it and rerun, or run: {_install_command()}")
    venv = tool_venv_dir()
    try:
        with _locked(venv.with_name(f".{venv.name}.lock")):
            if not (venv / ".complete").is_file():
                _build(tool, venv)
    except OSError as error:
        _refuse(tool, f"cannot make the tool environment {venv} ({error.strerror or error}); "
                f"set GLM53_RECIPE_CACHE to a writable directory, or run: {_install_command()}")
    python = venv / "bin" / "python"
    os.environ[INSIDE] = "1"
    os.execv(str(python), [str(python), os.path.abspath(sys.argv[0]), *sys.argv[1:]])
