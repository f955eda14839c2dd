"""Settings: the environment first, then cluster.env, then the profile, then recipe.toml.

Values are read literally (never sourced or evaluated), so JSON, quotes and spaces survive.
An empty value counts as unset. A bad line or an unknown name in cluster.env is refused.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable, Mapping
from pathlib import Path

from recipekit.recipe import Recipe

_BLANK_OR_COMMENT = re.compile(r"[ \t\n\r\f\v]*(#|$)")
_SETTING_LINE = re.compile(r"[ \t\n\r\f\v]*([A-Z_][A-Z0-9_]*)=(.*)", re.DOTALL)
_QUOTED = re.compile(r"\"(.*)\"|'(.*)'", re.DOTALL)


class Refused(Exception):
    """A setting the launcher will not run with: one line, exit 2."""

    def __init__(self, line: str):
        super().__init__(line)
        self.line = line


class RefusedAbove(Exception):
    """A refusal a tool the launcher ran has printed already, in its one line: exit 2."""


class Failed(Exception):
    """The launcher could not do what it was asked: `glm53: <message>`, exit 1."""


def ended(command: Callable[[], int]) -> int:
    """COMMAND's exit code, each way a command of the launcher's (or scripts/compare) can end
    told in its one line: a refusal 2, a refusal already printed 2, a failure 1 (`glm53: ...`),
    an interrupt 130, an OSError 1."""
    try:
        return command()
    except Refused as refused:
        print(refused.line, file=sys.stderr)
        return 2
    except RefusedAbove:
        return 2
    except Failed as failed:
        print(f"glm53: {failed}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except OSError as error:
        print(f"glm53: {error}", file=sys.stderr)
        return 1


def refusal(name: str, value: str, why: str) -> Refused:
    """`refused: NAME=value: why` (a newline in the value shown as \\n)."""
    return Refused(f"refused: {name}={value.replace(chr(10), chr(92) + 'n')}: {why}")


def unset_refusal(name: str, why: str) -> Refused:
    return Refused(f"refused: {name} is unset: {why}")


def content_lines(path: Path):
    """(number, line) of every line of a line-per-entry file (cluster.env, PINS_FILE) that is
    neither blank nor a # comment, in order; a final newline starts no line of its own."""
    lines = path.read_text().split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    for number, line in enumerate(lines, start=1):
        if not _BLANK_OR_COMMENT.match(line):
            yield number, line


def setting_lines(path: Path):
    """(name, value) of every NAME=VALUE line of a settings file, in order."""
    for number, line in content_lines(path):
        match = _SETTING_LINE.fullmatch(line)
        if not match:
            raise Refused(f"refused: {path} line {number}: {line}: accepted: NAME=VALUE lines "
                          "and # comments")
        yield match[1], match[2]


def strip_outer_quotes(value: str) -> str:
    """cluster.env may wrap a value in one pair of quotes out of habit; drop them."""
    match = _QUOTED.fullmatch(value)
    if not match:
        return value
    return match[1] if match[1] is not None else match[2]


def resolve(recipe: Recipe, environ: Mapping[str, str], cluster_file: Path) -> dict[str, str]:
    """Every knob's value: a non-empty environment value wins, then cluster.env, then the
    profile's overlay, then the knob's default."""
    values = {name: environ.get(name, "") for name in recipe.knobs}
    if cluster_file.is_file():
        for name, value in setting_lines(cluster_file):
            if name not in recipe.knobs:
                raise refusal(name, value, f"in {cluster_file}, not a launcher setting; "
                              "accepted: the names in recipe.toml")
            if not values[name]:
                values[name] = strip_outer_quotes(value)
    profile_knob = recipe.knobs["PROFILE"]
    profile = values["PROFILE"] or profile_knob.default
    if profile not in recipe.profiles:
        raise refusal("PROFILE", profile, "accepted: " + " | ".join(recipe.profiles))
    overlay = recipe.profiles[profile].values
    for name, knob in recipe.knobs.items():
        if not values[name]:
            values[name] = overlay.get(name, knob.default) if name != "PROFILE" else profile
    return values


def profile_default(recipe: Recipe, values: Mapping[str, str], name: str) -> str:
    """What NAME is under the chosen profile when nobody sets it."""
    return recipe.profiles[values["PROFILE"]].values.get(name, recipe.knobs[name].default)


def expand_path(path: str, home: str, root: Path | None = None) -> str:
    """A leading ~/ becomes HOME; with ROOT, a relative path is taken from ROOT."""
    if path.startswith("~/"):
        return f"{home}/{path[2:]}"
    if root is not None and not path.startswith("/"):
        return f"{root}/{path}"
    return path
