"""`--help` of run.sh, stop.sh and scripts/doctor, and the refusal of any other argument.

These entries take no arguments: every setting is an environment variable or a cluster.env
line. The help is the entry script's own header comment (one place says what it does),
printed before any setting is read, so it touches nothing: no Docker, no SSH, no file.
"""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

from launcher.settings import Refused

ROOT = Path(__file__).resolve().parent.parent
# The command launcher/entry.py is given -> the script a user runs.
SCRIPTS = {"run": "run.sh", "stop": "stop.sh", "doctor": "scripts/doctor"}
HELP_WORDS = ("-h", "--help")


def shown(command: str) -> str:
    """How a user calls COMMAND's script from the repository root."""
    script = SCRIPTS[command]
    return script if "/" in script else f"./{script}"


def header_comment(path: Path) -> str:
    """The comment lines right after SCRIPT's shebang, without their `# `."""
    lines = []
    for line in path.read_text().splitlines()[1:]:
        if not line.startswith("#"):
            break
        lines.append(line[2:] if line.startswith("# ") else line[1:])
    return "\n".join(lines)


def text(command: str) -> str:
    settings = textwrap.fill(
        "Settings are environment variables or cluster.env lines (NAME=VALUE), never "
        f"arguments: e.g. DRY_RUN=1 {shown(command)}. Every setting, its default and what is "
        "refused: docs/launcher.md (Settings and defaults), from recipe.toml.", width=92)
    return (f"usage: {shown(command)} [-h | --help]\n\n{header_comment(ROOT / SCRIPTS[command])}"
            f"\n\n{settings}\n")


def handled(command: str, args: list[str]) -> bool:
    """True when ARGS asked for help (printed); False when there are none; any other
    argument is refused in one line."""
    if not args:
        return False
    if len(args) == 1 and args[0] in HELP_WORDS:
        sys.stdout.write(text(command))
        return True
    raise Refused(f"refused: {shown(command)} {args[0]}: takes no arguments but -h/--help; "
                  f"settings are environment variables (e.g. DRY_RUN=1 {shown(command)}); "
                  f"see {shown(command)} --help")
