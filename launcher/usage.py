"""`--help` of run.sh, stop.sh and scripts/doctor, their options, and the refusal of any
other argument.

Every setting is an environment variable or a cluster.env line, never an argument; the one
option is what scripts/doctor reports (OPTIONS: `--platform`, the platform probe on every
node, and `--json` with it). The help is the entry script's own header comment (one place
says what it does), printed before any setting is read, so it touches nothing: no Docker,
no SSH, no file.
"""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

from launcher.plan.settings import Refused

ROOT = Path(__file__).resolve().parent.parent
# The command launcher/entry.py is given -> the script a user runs.
SCRIPTS = {"run": "run.sh", "stop": "stop.sh", "doctor": "scripts/doctor"}
HELP_WORDS = ("-h", "--help")
# command -> the options it takes besides -h/--help (each at most once)
OPTIONS = {"doctor": ("--platform", "--json")}
# an option -> the option it needs beside it
NEEDS = {"--json": "--platform"}


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
    options = "".join(f" [{option}]" for option in OPTIONS.get(command, ()))
    return (f"usage: {shown(command)} [-h | --help]{options}\n\n"
            f"{header_comment(ROOT / SCRIPTS[command])}"
            f"\n\n{settings}\n")


def takes(command: str) -> str:
    """What COMMAND takes, as its refusal says it."""
    options = OPTIONS.get(command, ())
    if not options:
        return "takes no arguments but -h/--help"
    return f"takes no arguments but -h/--help, {', '.join(options)}"


def handled(command: str, args: list[str]) -> bool:
    """True when ARGS asked for help (printed); False when there are none or only COMMAND's
    OPTIONS (each once, with the option it needs); any other argument is refused in one
    line."""
    if not args:
        return False
    if len(args) == 1 and args[0] in HELP_WORDS:
        sys.stdout.write(text(command))
        return True
    options = OPTIONS.get(command, ())
    for at, word in enumerate(args):
        if word not in options or word in args[:at]:
            raise Refused(f"refused: {shown(command)} {word}: {takes(command)}; settings are "
                          f"environment variables (e.g. DRY_RUN=1 {shown(command)}); see "
                          f"{shown(command)} --help")
        if word in NEEDS and NEEDS[word] not in args:
            raise Refused(f"refused: {shown(command)} {word}: only with {NEEDS[word]}; see "
                          f"{shown(command)} --help")
    return False
