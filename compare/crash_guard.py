"""Runs a bench/ tool as `python3 TOOL ARGS` runs it, except that an exception escaping the
tool ends it with exit CRASHED (70, EX_SOFTWARE), not Python's 1, which the bench's tools
give for a result that failed. scripts/compare measures every boot through it, so a crash is
never taken for a result (docs/compare.md). The traceback goes to stderr and to stdout (the
measurement's log).

    python3 compare/crash_guard.py TOOL.py [ARGS...]

Standard library only; it imports nothing of the tool's before running it.
"""

from __future__ import annotations

import runpy
import sys
import traceback
from pathlib import Path

CRASHED = 70


def main() -> None:
    script = sys.argv[1]
    sys.argv = sys.argv[1:]
    sys.path[0] = str(Path(script).resolve().parent)  # as `python3 TOOL` sets it
    try:
        runpy.run_path(script, run_name="__main__")
    except (SystemExit, KeyboardInterrupt):
        raise
    except BaseException:  # noqa: BLE001 - whatever escaped the tool is its crash
        text = traceback.format_exc()
        sys.stdout.write(text)
        sys.stdout.flush()
        sys.stderr.write(text)
        sys.exit(CRASHED)


if __name__ == "__main__":
    main()
