"""What the user set by name (the environment and cluster.env, not a profile or a default),
checked where a typo or a knob that does nothing would otherwise pass in silence:

- an environment variable one or two edits from a knob's name (NUM_SPECULATIVE_TOKEN) is
  refused with the knob it means; the environment holds many other names, so only a close
  one is taken for a typo;
- a name given twice in cluster.env is refused (the first would win unseen);
- a knob set but not read by the chosen SPEC or DRAFTER is refused, naming the one that is.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from launcher.plan.settings import Refused, content_lines, refusal, setting_lines
from recipekit.recipe import Recipe

# A knob name this long or longer takes one edit as a typo; this long or longer, two.
ONE_EDIT_FROM = 5
TWO_EDITS_FROM = 12


def edit_distance(a: str, b: str) -> int:
    """Insertions, deletions, substitutions and swaps of neighbours that turn A into B."""
    previous2: list[int] = []
    previous = list(range(len(b) + 1))
    for i in range(1, len(a) + 1):
        current = [i] + [0] * len(b)
        for j in range(1, len(b) + 1):
            cost = a[i - 1] != b[j - 1]
            current[j] = min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + cost)
            if i > 1 and j > 1 and a[i - 1] == b[j - 2] and a[i - 2] == b[j - 1]:
                current[j] = min(current[j], previous2[j - 2] + 1)
        previous2, previous = previous, current
    return previous[len(b)]


def meant_knob(name: str, knobs) -> str | None:
    """The knob NAME is a typo of, or None (NAME is a knob, or not close to one)."""
    if name in knobs:
        return None
    for knob in knobs:
        allowed = 2 if len(knob) >= TWO_EDITS_FROM else 1 if len(knob) >= ONE_EDIT_FROM else 0
        if allowed and abs(len(knob) - len(name)) <= allowed and edit_distance(name, knob) <= allowed:
            return knob
    return None


def check_environment(recipe: Recipe, environ: Mapping[str, str]) -> None:
    for name in sorted(environ):
        knob = meant_knob(name, recipe.knobs)
        if knob:
            raise Refused(f"refused: {name} (in the environment) is not a launcher setting: did "
                          f"you mean {knob}? Set {knob}, or unset {name}")


def cluster_names(cluster_file: Path) -> set[str]:
    """The names cluster.env sets; one set twice is refused, naming both lines."""
    if not cluster_file.is_file():
        return set()
    first_line: dict[str, int] = {}
    for (number, _), (name, _) in zip(content_lines(cluster_file), setting_lines(cluster_file)):
        if name in first_line:
            raise Refused(f"refused: {cluster_file} line {number}: {name} is set again (line "
                          f"{first_line[name]} set it first); accepted: one line per name")
        first_line[name] = number
    return set(first_line)


def set_by_name(recipe: Recipe, environ: Mapping[str, str], cluster_file: Path) -> set[str]:
    """The knobs the environment (non-empty) or cluster.env set."""
    from_env = {name for name in recipe.knobs if environ.get(name, "")}
    return from_env | (cluster_names(cluster_file) & set(recipe.knobs))


# knob -> the SPEC values that read it, and the knob that does its job under the other SPEC.
_BY_SPEC = {
    "NUM_SPECULATIVE_TOKENS": (("dflash2",), {"mtp": "MTP_NUM_SPECULATIVE_TOKENS"}),
    "MTP_NUM_SPECULATIVE_TOKENS": (("mtp",), {"dflash2": "NUM_SPECULATIVE_TOKENS"}),
    "DRAFTER": (("dflash2",), {}),
    "DRAFTER_WINDOW": (("dflash2",), {}),
    "DRAFT_WEIGHTS": (("dflash2",), {}),
    "ADAPTIVE_VERIFY_TAU": (("dflash2",), {}),
    "ADAPTIVE_VERIFY_MAX": (("dflash2",), {}),
}


def check_applicable(recipe: Recipe, values: Mapping[str, str], named: set[str]) -> None:
    """Each knob in NAMED must be read under the chosen SPEC. Checked before the knobs' own
    values (a k for the other SPEC is refused as that, not by the other's range); a SPEC
    that is not a choice is left to its own check."""
    spec = values["SPEC"]
    if spec not in recipe.knobs["SPEC"].choices:
        return
    for name, (specs, instead) in _BY_SPEC.items():
        if name not in named or spec in specs:
            continue
        other = instead.get(spec)
        why = (f"SPEC={spec} reads {other} instead; set that" if other else
               f"only SPEC={' | '.join(specs)} reads it; unset {name}, or set SPEC={specs[0]}")
        raise refusal(name, values[name], why)


def check_window(values: Mapping[str, str], named: set[str], sliding_drafter: bool) -> None:
    """DRAFTER_WINDOW set needs a full-attention drafter: a sliding one keeps its own window."""
    if "DRAFTER_WINDOW" in named and sliding_drafter:
        raise refusal("DRAFTER_WINDOW", values["DRAFTER_WINDOW"],
                      f"DRAFTER={values['DRAFTER']} has sliding-window layers and keeps its own "
                      "window; only a full-attention drafter (DRAFTER=dflash2-g, or a local one) "
                      "reads it; unset DRAFTER_WINDOW")
