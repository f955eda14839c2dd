"""P of layer v8: the pinned packages, installed offline from a wheelhouse, then checked.

Standard library only: it runs on the image's own Python during ``docker build``, before
anything else of ours is importable there. ``install`` removes what must not stay
(``flashinfer-jit-cache``; a ``flashinfer-cubin`` of another version, which makes
``import flashinfer`` raise), then ``pip install --no-index --no-deps --require-hashes`` from
the wheelhouse: the pins are the whole set, so no resolver can move another package (a
FlashInfer nightly once downgraded NCCL that way). ``check`` reads what is installed with
``importlib.metadata`` and lists every way it differs from the pins.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

PACKAGES_DIR = Path(__file__).resolve().parent.parent / "patches" / "v8"
PACKAGES = PACKAGES_DIR / "packages.txt"  # the vendor fork's set, and any base without its own
VERSION_FILE = "vllm/_version.py"
FLASHINFER = "flashinfer-python"
JIT_CACHE = "flashinfer-jit-cache"  # FlashInfer's AOT kernels: stale ones must not load
CUBIN = "flashinfer-cubin"  # FlashInfer's prebuilt kernels; only on FlashInfer's own index
CUTLASS_FAMILY = "nvidia-cutlass-dsl"  # the meta package and every nvidia-cutlass-dsl-libs-*

_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;\\]+)")
# `-r FILE`: FILE's pins too (pip reads it relative to the including file); a release's set
# that is the fork's plus a package says so in one line
_INCLUDE = re.compile(r"^(?:-r|--requirement)[ =]\s*(\S+)$")
# A package v8 installs only under this licence (its wheel's License-Expression, else its
# License field), checked where it is installed: a release that changed it is refused.
LICENCES = {"b12x": "Apache-2.0"}
# The b12x release each base's vLLM names for its `b12x` extra (the wheel's Requires-Dist:
# `b12x==X; extra == "b12x"`), which v8's set for that release pins; a base not here (the
# vendor fork, whose vLLM has no b12x backend) gets none.
B12X_EXTRA = {"0.30.0": "1.3.0", "0.33.0": "1.5.1", "0.34.0": "1.5.1"}


def b12x_bases() -> str:
    """The releases B12X_EXTRA names, as prose."""
    names = list(B12X_EXTRA)
    return ", ".join(names[:-1]) + " and " + names[-1]
# `# base: NAME==VERSION`: a package the base image must already carry at that version; v8
# checks it and never installs it (pip reads the line as a comment)
_CARRIED = re.compile(r"^#\s*base:\s*(.+)$")
VERSION_PATTERN = re.compile(r"^__version__[^=\n]*= version = '([^']+)'", re.M)


class PackageError(RuntimeError):
    """The packages cannot be installed or read; the message says what to do."""


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def version_of(text: str | None) -> str | None:
    """The vLLM version a vllm/_version.py states (None if it states none)."""
    found = VERSION_PATTERN.search(text or "")
    return found.group(1) if found else None


def base_version(root: Path) -> str | None:
    """The vLLM version of the tree in ROOT (root/vllm/_version.py), None if unstated."""
    try:
        return version_of((Path(root) / VERSION_FILE).read_text(encoding="utf-8"))
    except OSError:
        return None


def packages_for(version: str | None) -> Path:
    """v8's package set for a base of vLLM VERSION: patches/v8/packages-vllm-VERSION.txt where
    that release needs packages of its own, else patches/v8/packages.txt."""
    own = PACKAGES_DIR / f"packages-vllm-{version}.txt"
    return own if version and own.is_file() else PACKAGES


def _pins(path: Path, carried: bool) -> dict[str, str]:
    pins: dict[str, str] = {}
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except OSError as error:
        raise PackageError(f"{path}: cannot read the pins: {error.strerror}") from None
    for line in lines:
        stripped = line.strip()
        include = _INCLUDE.match(stripped)
        if include:
            pins.update(_pins(Path(path).parent / include.group(1), carried))
            continue
        base = _CARRIED.match(stripped)
        if carried != bool(base) or not stripped or (not base and stripped.startswith(("#", "--hash"))):
            continue
        pin = base.group(1).strip() if base else stripped
        found = _PIN.match(pin)
        if not found:
            raise PackageError(f"{path}: `{stripped}` is not a `name==version` pin")
        pins[canonical(found.group(1))] = found.group(2)
    return pins


def read_carried(path: Path = PACKAGES) -> dict[str, str]:
    """The ``# base: name==version`` lines: what the base must carry, never installed."""
    return _pins(path, carried=True)


def read_pins(path: Path = PACKAGES) -> dict[str, str]:
    """``name==version`` lines of a requirements file (hash options ignored), by canonical name:
    what v8 installs."""
    pins = _pins(path, carried=False)
    if FLASHINFER not in pins and FLASHINFER not in read_carried(path):
        raise PackageError(f"{path}: no {FLASHINFER}==VERSION pin")
    return pins


def installed() -> dict[str, list[str]]:
    """Every distribution importable from sys.path: canonical name -> versions found."""
    importlib.invalidate_caches()
    found: dict[str, list[str]] = {}
    for dist in importlib.metadata.distributions():
        name = dist.metadata["Name"]
        if name:
            found.setdefault(canonical(name), []).append(dist.version)
    return found


def licences() -> dict[str, str]:
    """The licence each distribution importable from sys.path declares (License-Expression,
    else License), by canonical name."""
    found = {}
    for dist in importlib.metadata.distributions():
        name = dist.metadata["Name"]
        if name:
            found[canonical(name)] = (dist.metadata["License-Expression"]
                                      or dist.metadata["License"] or "")
    return found


def check(
    pins: dict[str, str], present: dict[str, list[str]], carried: dict[str, str] | None = None,
    declared: dict[str, str] | None = None,
) -> list[str]:
    """Every way ``present`` differs from ``pins`` and from what the base must carry
    (``carried``), and every pinned package of LICENCES whose ``declared`` licence is another,
    one line each (empty: all good)."""
    problems = []
    carried = carried or {}
    for name, wanted in LICENCES.items():
        if name in pins and present.get(name) and declared is not None \
                and declared.get(name) != wanted:
            problems.append(f"{name} declares the licence {declared.get(name) or 'none'!r}; v8 "
                            f"carries it under {wanted} only")
    for name, version in {**pins, **carried}.items():
        versions = present.get(name, [])
        pin = f"the pin is {version}" if name in pins else (
            f"the base must carry {version} (v8 does not install it)")
        if not versions:
            problems.append(f"{name} is not installed; {pin}")
        elif len(versions) > 1:
            problems.append(
                f"{name} is installed {len(versions)} times ({', '.join(versions)}); {pin}"
            )
        elif versions[0] != version:
            problems.append(f"{name} is {versions[0]}; {pin}")
    if present.get(JIT_CACHE):
        problems.append(
            f"{JIT_CACHE} {', '.join(present[JIT_CACHE])} is installed; its AOT kernels must not load"
        )
    flashinfer = pins.get(FLASHINFER) or carried[FLASHINFER]
    for version in present.get(CUBIN, []):
        if version != flashinfer:
            problems.append(
                f"{CUBIN} {version} is installed beside {FLASHINFER} {flashinfer}; import flashinfer raises"
            )
    family = pins.get(CUTLASS_FAMILY)
    if family:
        for name, versions in sorted(present.items()):
            if name.startswith(CUTLASS_FAMILY) and name not in pins:
                wrong = [v for v in versions if v != family]
                if wrong:
                    problems.append(
                        f"{name} is {', '.join(wrong)}; every {CUTLASS_FAMILY} package must be {family}"
                    )
    return problems


def notes(pins: dict[str, str], present: dict[str, list[str]]) -> list[str]:
    """What the user should know that is not a problem."""
    if present.get(CUBIN):
        return []
    return [
        f"{CUBIN} is not installed (it is on FlashInfer's own index only): FlashInfer JIT-compiles "
        "its kernels on the first boot, and the launcher's JIT cache keeps them for the next"
    ]


def _pip(python: str, *args: str) -> subprocess.CompletedProcess:
    # The base's pip configuration (indexes, constraints) has no say: only our arguments.
    env = {key: value for key, value in os.environ.items() if not key.startswith("PIP_")}
    env.update(
        PIP_CONFIG_FILE=os.devnull,
        PIP_DISABLE_PIP_VERSION_CHECK="1",
        PIP_ROOT_USER_ACTION="ignore",
        PIP_BREAK_SYSTEM_PACKAGES="1",
        PIP_NO_INPUT="1",
    )
    return subprocess.run(
        [python, "-m", "pip", *args], env=env, capture_output=True, text=True, check=False
    )


def install(
    wheelhouse: Path, packages: Path = PACKAGES, python: str = sys.executable, log=print
) -> list[str]:
    """Remove what must go, install the pins from ``wheelhouse``; returns what was removed."""
    pins = read_pins(packages)
    flashinfer = pins.get(FLASHINFER) or read_carried(packages)[FLASHINFER]
    present = installed()
    remove = [JIT_CACHE] if present.get(JIT_CACHE) else []
    if any(version != flashinfer for version in present.get(CUBIN, [])):
        remove.append(CUBIN)
    removed = [f"{name} {', '.join(present[name])}" for name in remove]
    if remove:
        log(f"removing {', '.join(removed)}")
        result = _pip(python, "uninstall", "--yes", *remove)
        if result.returncode:
            raise PackageError(f"pip uninstall {' '.join(remove)} failed: {_last_line(result)}")
    log(f"installing the {len(pins)} pinned packages of {packages} offline from {wheelhouse}")
    result = _pip(
        python,
        "install",
        "--no-index",
        "--no-deps",
        "--require-hashes",
        "--no-warn-script-location",
        "--find-links",
        str(wheelhouse),
        "-r",
        str(packages),
    )
    if result.returncode:
        raise PackageError(
            f"pip install -r {packages} from {wheelhouse} failed: {_last_line(result)}; the "
            "wheelhouse must hold the pinned wheels for this Python and platform (scripts/build.sh)"
        )
    return removed


def flashinfer_beside(root: Path) -> str | None:
    """Why the importable flashinfer is not the one beside ``root``/vllm, or None."""
    spec = importlib.util.find_spec("flashinfer")
    if spec is None or not spec.submodule_search_locations:
        return f"no flashinfer package is importable by {sys.executable}"
    where = Path(list(spec.submodule_search_locations)[0]).resolve().parent
    if where != Path(root).resolve():
        return f"flashinfer is installed in {where}, not beside vllm in {root}; v8 patches both in one root"
    return None


def _last_line(result: subprocess.CompletedProcess) -> str:
    lines = (result.stderr or result.stdout).strip().splitlines()
    return lines[-1] if lines else f"exit {result.returncode}"
