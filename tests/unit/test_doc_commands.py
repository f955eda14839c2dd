"""Every command README.md and docs/*.md show in a ```bash block runs as written: a command
that names a file of this repository (./run.sh, scripts/..., bench/...) names one that exists
and is executable. Environment assignments before it (DRY_RUN=1 ./run.sh) and `time` are
skipped; each part of a pipe or a && / ; list is a command of its own."""

from __future__ import annotations

import os
import re
import shlex
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
_BLOCK = re.compile(r"```bash\n(.*?)```", re.DOTALL)
_ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=")
_SEPARATORS = {"|", "||", "&&", ";", "&"}
_PREFIXES = {"time", "exec", "env", "sudo", "nohup"}


def commands(page: Path):
    """(line, the command word) of each command in PAGE's bash blocks."""
    for block in _BLOCK.findall(page.read_text()):
        for line in block.replace("\\\n", " ").splitlines():
            try:
                words = shlex.split(line, comments=True)
            except ValueError:
                continue  # a line of a here-document or of a multi-line string
            expect = True
            for word in words:
                if word in _SEPARATORS:
                    expect = True
                elif expect and not (_ASSIGNMENT.match(word) or word in _PREFIXES):
                    yield line, word
                    expect = False


def repository_path(word: str) -> bool:
    """WORD names a file of this checkout (a relative path, not an option or a placeholder)."""
    return "/" in word and not word.startswith(("/", "~", "$", "<", "-", "http")) and "*" not in word


CASES = [(page.relative_to(REPO), line, word) for page in PAGES for line, word in commands(page)
         if repository_path(word)]


def test_the_pages_show_repository_commands():
    shown = {word for _, _, word in CASES}
    assert {"./run.sh", "scripts/doctor", "bench/quality.py"} <= shown


@pytest.mark.parametrize("page, line, word", CASES, ids=[f"{p}:{w}" for p, _, w in CASES])
def test_a_shown_command_exists_and_is_executable(page, line, word):
    path = REPO / word
    assert path.is_file(), f"{page}: `{line.strip()}` names {word}, which does not exist"
    assert os.access(path, os.X_OK), f"{page}: `{line.strip()}` runs {word}, which is not executable"
