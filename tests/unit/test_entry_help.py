"""`-h`/`--help` of every entry point prints its usage and exits 0 having touched nothing:
no docker, ssh, curl or pip call (each is a spy here that records its call), no virtualenv
built (the recipe cache stays absent), no file written in the checkout. Run twice: with the
test venv's python (every package present: the tool's own argparse help) and with the same
python under -S (no site packages, as a fresh clone's python3: the help that builds
nothing). An argument the launcher's entries do not take is refused in one line."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.timing import HANG_GUARD_S

REPO = Path(__file__).resolve().parents[2]
SPIES = ("docker", "ssh", "curl", "pip", "pip3")
LAUNCHER_ENTRIES = ("run.sh", "stop.sh", "scripts/doctor")
ENTRIES = (
    *LAUNCHER_ENTRIES, "scripts/compare", "scripts/build.sh", "scripts/render-docs",
    "scripts/patch-layer", "scripts/make-backport", "scripts/vllm-src", "scripts/flashinfer-src",
    "scripts/sm121-packages", "scripts/prepare-drafter", "scripts/scan-checkpoint", "scripts/test",
    "scripts/test-env",
    "bench/bench_decode.py", "bench/probes.py", "bench/quality.py", "bench/receipts.py",
    "bench/bench_cost.py", "bench/plot.py",
)


def sealed(tmp_path: Path, site: bool) -> dict[str, str]:
    """An environment whose docker, ssh, curl and pip record their call and fail, whose
    python3 is this interpreter (under -S without SITE), with its caches in TMP_PATH."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for spy in SPIES:
        path = bin_dir / spy
        path.write_text(f'#!/bin/sh\necho "{spy} $*" >> "{tmp_path}/calls"\nexit 1\n')
        path.chmod(0o755)
    python = bin_dir / "python3"
    python.write_text(f'#!/bin/sh\nexec {sys.executable} {"" if site else "-S "}"$@"\n')
    python.chmod(0o755)
    return {"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(tmp_path / "home"),
            "GLM53_RECIPE_CACHE": str(tmp_path / "cache"), "XDG_CACHE_HOME": str(tmp_path / "xdg"),
            "NODES": "192.0.2.1 192.0.2.2", "IFACE": "ifx0", "HCA": "hca0",
            "CLUSTER_ENV": str(tmp_path / "no-cluster.env"), "PYTHON": str(python),
            "DOCKER_HOST": "unix:///nonexistent",
            # matplotlib's font cache, which its import writes (bench/plot.py imports it at top)
            "MPLCONFIGDIR": str(tmp_path.parent / "matplotlib")}


def checkout_state() -> str:
    return subprocess.run(["git", "status", "--porcelain"], cwd=REPO, capture_output=True,
                          text=True, check=True).stdout


def test_every_executable_tool_is_listed():
    """A new tool in scripts/ or bench/ gets a help test by being listed above."""
    found = {str(path.relative_to(REPO)) for folder in ("scripts", "bench")
             for path in (REPO / folder).iterdir() if path.is_file() and os.access(path, os.X_OK)}
    assert found == {entry for entry in ENTRIES if entry.startswith(("scripts/", "bench/"))}


@pytest.mark.parametrize("site", [True, False], ids=["packages", "bare-python"])
@pytest.mark.parametrize("entry", ENTRIES)
def test_help_prints_usage_and_touches_nothing(tmp_path, entry, site):
    before = checkout_state()
    for word in ("--help", "-h"):
        (tmp_path / word).mkdir()
        result = subprocess.run([str(REPO / entry), word], env=sealed(tmp_path / word, site),
                                cwd=tmp_path, capture_output=True, text=True,
                                timeout=HANG_GUARD_S, check=False)
        assert result.returncode == 0, result.stderr
        assert result.stdout.lower().startswith("usage:"), result.stdout
        assert not (tmp_path / word / "calls").exists(), (tmp_path / word / "calls").read_text()
        for cache in ("cache", "xdg", "home"):
            assert not (tmp_path / word / cache).exists(), f"{entry} {word} made {cache}"
    assert checkout_state() == before


@pytest.mark.parametrize("entry", LAUNCHER_ENTRIES)
@pytest.mark.parametrize("argument", ["--dry-run", "--bogus", "stop"])
def test_an_argument_the_launcher_does_not_take_is_refused_in_one_line(tmp_path, entry, argument):
    (tmp_path / "run").mkdir()
    result = subprocess.run([str(REPO / entry), argument], env=sealed(tmp_path / "run", True),
                            cwd=tmp_path, capture_output=True, text=True, timeout=HANG_GUARD_S,
                            check=False)
    shown = entry if "/" in entry else f"./{entry}"
    takes = ("takes no arguments but -h/--help, --platform, --json" if entry == "scripts/doctor"
             else "takes no arguments but -h/--help")
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr == (f"refused: {shown} {argument}: {takes}; "
                             f"settings are environment variables (e.g. DRY_RUN=1 {shown}); see "
                             f"{shown} --help\n")
    assert not (tmp_path / "run" / "calls").exists()


@pytest.mark.parametrize("args, refused", [
    (["--json"], "refused: scripts/doctor --json: only with --platform; see scripts/doctor --help"),
    (["--platform", "--platform"], "refused: scripts/doctor --platform: takes no arguments but "
     "-h/--help, --platform, --json; settings are environment variables (e.g. DRY_RUN=1 "
     "scripts/doctor); see scripts/doctor --help"),
])
def test_the_doctors_options_are_refused_alone_or_twice(tmp_path, args, refused):
    (tmp_path / "run").mkdir()
    result = subprocess.run([str(REPO / "scripts/doctor"), *args],
                            env=sealed(tmp_path / "run", True), cwd=tmp_path,
                            capture_output=True, text=True, timeout=HANG_GUARD_S, check=False)
    assert (result.returncode, result.stdout, result.stderr) == (2, "", refused + "\n")
    assert not (tmp_path / "run" / "calls").exists()


# Every entry that reads options (scripts/test hands its arguments to pytest).
OPTION_ENTRIES = [entry for entry in ENTRIES if entry not in (*LAUNCHER_ENTRIES, "scripts/test")]


@pytest.mark.parametrize("entry", OPTION_ENTRIES)
def test_an_unknown_option_is_refused_in_one_line(tmp_path, entry):
    (tmp_path / "run").mkdir()
    result = subprocess.run([str(REPO / entry), "--no-such-option"],
                            env=sealed(tmp_path / "run", True), cwd=tmp_path, capture_output=True,
                            text=True, timeout=HANG_GUARD_S, check=False)
    assert result.returncode == 2
    assert len(result.stderr.splitlines()) == 1, result.stderr
    # the option named, or a required argument missing before it is read; either way a pointer
    assert "--no-such-option" in result.stderr or "required" in result.stderr
    assert "--help" in result.stderr
    assert not (tmp_path / "run" / "calls").exists()
