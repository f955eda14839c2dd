"""The two sides of a comparison: each a profile or NAME=VALUE words laid over the
environment, then resolved and checked exactly as run.sh resolves and checks its settings
(environment, cluster.env, profile, recipe.toml), so a side is refused as run.sh would
refuse it, in one line that names the side."""

from __future__ import annotations

import difflib
import os
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field

from launcher.plan.checks import Checked
from launcher.plan.load import cluster_file, load as load_checked
from launcher.plan.settings import Refused, resolve
from recipekit import recipe
from recipekit.recipe import Recipe

ROLES = ("reference", "candidate")
# FORCE_ knobs whose only reason is a failed quality gate: the candidate's gate is the check
# they stand in for, so compare sets them on the candidate (never on the reference).
GATE_JUDGED_FORCES = ("FORCE_UNSAFE_WEIGHTS",)
# Knobs that change how tokens are drafted and nothing the verifier computes: greedy tokens
# stay the target's (lossless), so a candidate differing only in these must follow the
# reference's greedy path.
DRAFTING_KNOBS = ("SPEC", "DRAFTER", "DRAFTER_REVISION", "DRAFTER_WINDOW",
                  "NUM_SPECULATIVE_TOKENS", "MTP_NUM_SPECULATIVE_TOKENS", "ADAPTIVE_VERIFY",
                  "ADAPTIVE_VERIFY_TAU", "ADAPTIVE_VERIFY_MAX", "DRAFT_WEIGHTS")


@dataclass
class Side:
    role: str
    text: str                      # the words as given
    assigned: dict[str, str]       # NAME -> VALUE of the words (a bare profile as PROFILE)
    checked: Checked
    lifted: list[str] = field(default_factory=list)  # GATE_JUDGED_FORCES set here

    @property
    def values(self) -> dict[str, str]:
        return self.checked.values

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.values['PORT']}"

    def describe(self) -> str:
        return self.text.strip() or "the environment's settings"


def refused(role: str, what: str, why: str) -> Refused:
    return Refused(f"refused: --{role} {what}: {why}")


def parse_words(role: str, text: str, recipe: Recipe) -> dict[str, str]:
    """NAME -> VALUE of a side's words; a word without '=' must be a profile's name."""
    assigned: dict[str, str] = {}
    profiles = " | ".join(recipe.profiles)
    try:
        words = shlex.split(text, comments=False, posix=True)
    except ValueError as error:
        raise refused(role, text, f"{error}; accepted: shell words (quote a value that holds "
                      "spaces or JSON)") from None
    for word in words:
        name, equals, value = word.partition("=")
        if not equals:
            if word not in recipe.profiles:
                raise refused(role, word, f"neither a profile nor NAME=VALUE; accepted: a profile "
                              f"({profiles}) or NAME=VALUE words naming recipe.toml's knobs")
            name, value = "PROFILE", word
        elif name not in recipe.knobs:
            close = difflib.get_close_matches(name, list(recipe.knobs), n=1)
            hint = f" (did you mean {close[0]}?)" if close else ""
            raise refused(role, word, f"{name} is not a launcher setting{hint}; accepted: the "
                          "names in recipe.toml (docs/launcher.md, settings and defaults)")
        if name == "DRY_RUN":
            raise refused(role, word, "DRY_RUN is the whole comparison's: set it in the "
                          "environment (DRY_RUN=1 scripts/compare ... prints every boot's "
                          "commands)")
        if name == "PROFILE" and value not in recipe.profiles:
            raise refused(role, word, f"no such profile; accepted: {profiles}")
        if assigned.get(name, value) != value:
            raise refused(role, word, f"{name} is given twice ({name}={assigned[name]} too); "
                          "accepted: each name once")
        assigned[name] = value
    return assigned


def _unsafe_gate_levers(recipe: Recipe, values: Mapping[str, str]) -> list[str]:
    """The GATE_JUDGED_FORCES a side's values need (a value past its safe one, force not 1)."""
    return sorted({knob.force for knob in recipe.knobs.values()
                   if knob.force in GATE_JUDGED_FORCES and knob.safe
                   and values.get(knob.name) not in ("", *knob.safe)
                   and values.get(knob.force) != "1"})


def load(role: str, text: str, environ: Mapping[str, str] | None = None,
         the_recipe: Recipe | None = None) -> Side:
    """The side's settings, checked as run.sh checks its own; a refusal names the side."""
    environ = dict(os.environ if environ is None else environ)
    the_recipe = the_recipe or recipe.load()
    assigned = parse_words(role, text, the_recipe)
    layered = {**environ, **assigned}
    lifted: list[str] = []
    if role == "candidate":
        try:
            resolved = resolve(the_recipe, layered, cluster_file(layered))
        except Refused as refusal:
            raise Refused(f"refused: --{role}: {refusal.line.removeprefix('refused: ')}") from None
        lifted = _unsafe_gate_levers(the_recipe, resolved)
        layered.update({force: "1" for force in lifted})
    try:
        checked = load_checked(layered, the_recipe=the_recipe)
    except Refused as refusal:
        raise Refused(f"refused: --{role}: {refusal.line.removeprefix('refused: ')}") from None
    return Side(role, text, assigned, checked, lifted)


def differing(reference: Side, candidate: Side) -> list[str]:
    """The knobs whose checked values differ (PROFILE itself left out: its overlay shows in
    the values it sets)."""
    return [name for name in reference.checked.recipe.knobs
            if name != "PROFILE" and reference.values[name] != candidate.values[name]]


def drafting_only(names: list[str]) -> bool:
    """Whether sides differing in NAMES must answer the same greedy tokens (none: A/A)."""
    return all(name in DRAFTING_KNOBS for name in names)
