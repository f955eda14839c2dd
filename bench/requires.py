"""The bench tools' third-party packages, pinned in requirements/bench.txt.

A tool run without them stops in one line naming what is missing and the command that
installs it (never a traceback); its --help prints the tool's docstring and that line, and
exits 0. Standard library only: it runs before any of them is imported.
"""

from __future__ import annotations

import importlib.util
import sys

# a venv in the checkout: a system python3 under PEP 668 (DGX OS's) refuses `pip install`
VENV_PYTHON = ".venv/bin/python"
INSTALL = "python3 -m venv .venv && .venv/bin/pip install -r requirements/bench.txt"
# What the streaming tools import (bench_decode, probes, quality, receipts, bench_cost).
CLIENT_MODULES = ("aiohttp", "prometheus_client", "rich")
# What bench/plot.py imports.
PLOT_MODULES = ("matplotlib",)
HELP_WORDS = ("-h", "--help")
EXIT_MISSING = 2


def missing_line(tool: str, missing: list[str]) -> str:
    return (f"{tool}: needs {', '.join(missing)}, which {sys.executable} lacks; install the "
            f"bench's packages in a venv, {INSTALL}, and run {VENV_PYTHON} {tool}")


def require(tool: str, modules: tuple[str, ...], doc: str | None) -> None:
    """Return when MODULES import; else print help (when asked) or refuse, in one line."""
    missing = [name for name in modules if importlib.util.find_spec(name) is None]
    if not missing:
        return
    if any(arg in HELP_WORDS for arg in sys.argv[1:]):
        print(f"usage: {tool} [options] (listed once the packages below are installed)\n\n"
              f"{(doc or '').strip()}\n\n{missing_line(tool, missing)}")
        sys.exit(0)
    print(missing_line(tool, missing), file=sys.stderr)
    sys.exit(EXIT_MISSING)
