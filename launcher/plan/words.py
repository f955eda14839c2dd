"""Shell words in and out: splitting a setting without evaluating it, quoting an argv.

ssh hands the remote login shell one string, so every word of a worker's command is quoted
here; the quoting is POSIX single-quoting (as shlex.quote), which bash, dash and zsh read
back byte for byte, newlines included.
"""

from __future__ import annotations

import re
import shlex

from launcher.plan.settings import Refused

_SAFE_WORD = re.compile(r"[A-Za-z0-9_@%+=:,./-]+")


def split(name: str, value: str) -> list[str]:
    """VALUE as shell words: quotes group, backslashes escape, nothing expands or runs."""
    try:
        return shlex.split(value, comments=False, posix=True)
    except ValueError as error:
        raise Refused(f"refused: {name}={value}: {error}; accepted: shell words "
                      "(quote a word that holds spaces or JSON)") from None


def quote(words: list[str]) -> str:
    """The words as one shell line: safe words bare, every other one single-quoted."""
    return " ".join(word if _SAFE_WORD.fullmatch(word) else "'" + word.replace("'", "'\\''") + "'"
                    for word in words)
