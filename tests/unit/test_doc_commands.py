"""Every command README.md and docs/*.md show in a ```bash block runs as written: a command
that names a file of this repository (./run.sh, scripts/..., bench/...) names one that exists
and is executable. Environment assignments before it (DRY_RUN=1 ./run.sh) and `time` are
skipped; each part of a pipe or a && / ; list is a command of its own. The bench's venv
(.venv/bin/python SCRIPT) runs SCRIPT, which is checked, and a page that uses the venv shows
the line that makes it; no page installs with pip into the system's python3 (DGX OS's
refuses, PEP 668); and README's first request to the API carries the key ./run.sh wrote."""

from __future__ import annotations

import os
import re
import shlex
from pathlib import Path

import pytest

from recipekit import recipe

REPO = Path(__file__).resolve().parents[2]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
_BLOCK = re.compile(r"```bash\n(.*?)```", re.DOTALL)
_ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=")
_SEPARATORS = {"|", "||", "&&", ";", "&"}
_PREFIXES = {"time", "exec", "env", "sudo", "nohup"}
# the bench's venv in the checkout, as README makes it; its python runs a repository script
VENV_BIN = ".venv/bin/"
VENV_PYTHON = VENV_BIN + "python"
VENV_LINE = "python3 -m venv .venv"
_SYSTEM_PIP = re.compile(r"(?:^|[\s;&|(])(?:python3? -m pip|pip3?|sudo pip3?) install\b")
# the bench's install anywhere on a page, prose too, by any pip but the venv's
_BENCH_SYSTEM_PIP = re.compile(r"(?<!\.venv/bin/)pip install -r requirements/bench\.txt")


def bash_lines(text: str):
    """The lines of TEXT's bash blocks, continuations joined."""
    for block in _BLOCK.findall(text):
        yield from block.replace("\\\n", " ").splitlines()


def commands(page: Path):
    """(line, the command word) of each command in PAGE's bash blocks; for the venv's python,
    the script it runs; the venv's other tools (its pip) are no command of this repository."""
    for line in bash_lines(page.read_text()):
        try:
            words = shlex.split(line, comments=True)
        except ValueError:
            continue  # a line of a here-document or of a multi-line string
        expect, interpreted = True, False
        for word in words:
            if word in _SEPARATORS:
                expect, interpreted = True, False
            elif interpreted and not word.startswith("-"):
                yield line, word
                interpreted = False
            elif expect and not (_ASSIGNMENT.match(word) or word in _PREFIXES):
                interpreted = word == VENV_PYTHON
                if not word.startswith(VENV_BIN):
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


def test_the_venvs_python_runs_a_checked_script():
    page = REPO / "README.md"
    shown = [word for line, word in commands(page) if line.lstrip().startswith(VENV_PYTHON)]
    assert "bench/bench_decode.py" in shown and VENV_PYTHON not in {w for _, _, w in CASES}


def venv_problems(text: str) -> list[str]:
    """A page that runs the venv's tools without the line that makes it; a pip install into
    the system's python3."""
    lines = list(bash_lines(text))
    problems = [line for line in lines if _SYSTEM_PIP.search(line.split("#", 1)[0])]
    problems += [match[0] for match in _BENCH_SYSTEM_PIP.finditer(text)]
    if any(VENV_BIN in line for line in lines) and not any(VENV_LINE in line for line in lines):
        problems.append(f"uses {VENV_BIN} without `{VENV_LINE}`")
    return problems


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(REPO)) for p in PAGES])
def test_the_bench_installs_into_a_venv_the_page_makes(page):
    assert venv_problems(page.read_text()) == []


def test_the_venv_check_catches_a_system_pip_and_a_venv_never_made():
    readme = (REPO / "README.md").read_text()
    assert venv_problems(readme.replace(
        ".venv/bin/pip install", "python3 -m pip install")) != []
    assert venv_problems(readme.replace(VENV_LINE + " && ", "")) == [
        f"uses {VENV_BIN} without `{VENV_LINE}`"]
    assert venv_problems("```bash\npip3 install aiohttp\n```\n") != []
    assert venv_problems("install: `python3 -m pip install -r requirements/bench.txt`") != []


def unkeyed_requests(text: str, key_file: str) -> list[str]:
    """The bash lines that call the API's /v1 with curl without the key in KEY_FILE."""
    return [line for line in bash_lines(text) if "curl" in line and "/v1/" in line
            and not ("Authorization: Bearer" in line and f"$(cat {key_file})" in line)]


def test_readmes_first_request_carries_the_key():
    """API_AUTH=key is the default: a first curl without the key gets a 401."""
    key_file = recipe.load().knobs["API_KEY_FILE"].default
    readme = (REPO / "README.md").read_text()
    assert any("curl" in line and "/v1/" in line for line in bash_lines(readme))
    assert unkeyed_requests(readme, key_file) == []
    bare = "```bash\ncurl http://127.0.0.1:8000/v1/models\n```\n"
    assert unkeyed_requests(readme + bare, key_file) == ["curl http://127.0.0.1:8000/v1/models"]
