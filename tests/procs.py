"""The processes of this machine as /proc shows them, for tests that look for what a run
left behind."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path


def process_stats() -> Iterator[tuple[int, list[str]]]:
    """(pid, the fields of /proc/PID/stat after the command name: state, ppid, pgrp, ...)
    of every process still listed."""
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rpartition(")")[2].split()
            except OSError:
                continue  # gone while we looked
            yield int(entry.name), fields
