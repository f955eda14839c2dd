"""The bench's packages have their own requirements file, installable in one line; a bench
tool run without them stops in one line naming that file (exit 2, no traceback)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from bench import requires
from compare import boot
from tests.timing import HANG_GUARD_S

REPO = Path(__file__).resolve().parents[2]
BENCH_TXT = REPO / "requirements" / "bench.txt"


def pinned(path: Path) -> set[str]:
    """The distribution names PATH pins (NAME==VERSION lines), lower case."""
    return {match[1].lower().replace("-", "_") for match in
            re.finditer(r"^([A-Za-z0-9_.-]+)==", path.read_text(), re.MULTILINE)}


def test_bench_txt_pins_every_package_the_bench_checks_for():
    assert set(requires.CLIENT_MODULES) | set(requires.PLOT_MODULES) <= pinned(BENCH_TXT)
    # scripts/compare checks the same packages before it boots anything
    assert set(boot.TOOL_MODULES) == set(requires.CLIENT_MODULES)


def test_the_test_environment_installs_the_bench_file():
    assert "-r bench.txt" in (REPO / "requirements" / "test.txt").read_text().splitlines()
    assert requires.INSTALL == ("python3 -m venv .venv && .venv/bin/pip install -r "
                                "requirements/bench.txt")
    # scripts/compare names the same install and runs the bench on that venv's python
    assert boot.BENCH_INSTALL == requires.INSTALL
    assert boot.BENCH_VENV_PYTHON == REPO / requires.VENV_PYTHON


@pytest.mark.parametrize("tool, modules", [
    ("bench_decode.py", requires.CLIENT_MODULES), ("probes.py", requires.CLIENT_MODULES),
    ("quality.py", requires.CLIENT_MODULES), ("receipts.py", requires.CLIENT_MODULES),
    ("bench_cost.py", requires.CLIENT_MODULES), ("plot.py", requires.PLOT_MODULES),
])
def test_a_bench_tool_without_its_packages_is_refused_in_one_line(tmp_path, tool, modules):
    # -S: no site packages, as a python3 that never installed the bench's
    result = subprocess.run([sys.executable, "-S", str(REPO / "bench" / tool), "--url", "x"],
                            cwd=tmp_path, capture_output=True, text=True, timeout=HANG_GUARD_S,
                            check=False)
    assert (result.returncode, result.stdout) == (requires.EXIT_MISSING, "")
    assert result.stderr == (f"bench/{tool}: needs {', '.join(modules)}, which {sys.executable} "
                             "lacks; install the bench's packages in a venv, python3 -m venv "
                             ".venv && .venv/bin/pip install -r requirements/bench.txt, and run "
                             f".venv/bin/python bench/{tool}\n")
