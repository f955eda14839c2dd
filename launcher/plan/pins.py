"""Pinned revisions: the model and the drafter are fetched at a commit, never at a branch.

The pin comes from the knob (MODEL_REVISION, DRAFTER_REVISION), else a known pin (the
recipe's [pins], the drafter catalog), else PINS_FILE (git-ignored, written by the first
run that resolved it).
"""

from __future__ import annotations

import re
from pathlib import Path

from launcher.plan.settings import content_lines, refusal

_PIN_LINE = re.compile(r"([^ \t\n\r\f\v]+)[ \t\n\r\f\v]+([0-9a-f]{40})")
HEX40 = re.compile(r"[0-9a-f]{40}")


def recorded(pins_file: str, repo: str) -> str:
    """The commit PINS_FILE records for REPO (the last line naming it), or ""."""
    path = Path(pins_file)
    if not path.is_file():
        return ""
    found = ""
    for number, line in content_lines(path):
        match = _PIN_LINE.fullmatch(line)
        if not match:
            raise refusal("PINS_FILE", pins_file, f"line {number} reads '{line}'; accepted: "
                          "lines '<repo id> <40-hex commit>'")
        if match[1] == repo:
            found = match[2]
    return found


def known(pins_file: str, repo: str, override: str, catalog_pin: str) -> str:
    """The pin of REPO from OVERRIDE, CATALOG_PIN or PINS_FILE; "" when unknown."""
    return override or catalog_pin or recorded(pins_file, repo)


def require_known(repo: str, commit: str, prefix: str, found_by: str, then: str) -> None:
    """Refuses COMMIT of REPO (FOUND_BY says where it came from) unless it starts with PREFIX,
    the latest revision the recipe knows ([checkpoints]); THEN is the way back besides
    MODEL_REVISION."""
    if prefix and not commit.startswith(prefix):
        raise refusal("MODEL", repo, f"{found_by} {commit}, not {prefix}, the latest revision "
                      "recipe.toml knows of it ([checkpoints]); a new revision is not served "
                      f"unasked; accepted: {then}, or MODEL_REVISION={commit} to serve it")


def line(repo: str, commit: str) -> str:
    """PINS_FILE's line recording COMMIT for REPO (launcher/apply/serve.py appends it)."""
    return f"{repo} {commit}\n"
