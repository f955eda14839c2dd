"""A copy of this checkout, as a fresh clone of it would be: the files git tracks plus the
untracked ones it does not ignore (so no build/, no recipe.lock, no cluster.env, no pins).

Tests that must run run.sh or scripts/build.sh on a host of their own (a recipe of their own,
a recipe.lock of their own) run them from such a copy, never from this checkout.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def copy_checkout(destination: Path) -> Path:
    """This checkout's files, modes included, under DESTINATION (created): its root."""
    names = subprocess.run(["git", "-C", str(REPO), "ls-files", "-z", "--cached", "--others",
                            "--exclude-standard"], capture_output=True, check=True).stdout
    for name in filter(None, names.decode().split("\0")):
        source = REPO / name
        if source.is_file():  # a file deleted but not yet staged is listed and absent
            target = destination / name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
    return destination


def rewrite(path: Path, *replacements: tuple[str, str]) -> None:
    """Each (old, new) replaced once in the file at PATH; an OLD not found there fails."""
    text = path.read_text()
    for old, new in replacements:
        assert text.count(old) == 1, f"{path}: {old!r} occurs {text.count(old)} times, not once"
        text = text.replace(old, new)
    path.write_text(text)
