"""recipe.toml as Markdown: the knob, profile and fixed-part tables of README.md and
docs/launcher.md (with its list of the engine settings a base vLLM release retired, from
launcher/plan/image_base.py), the known checkpoints of docs/checkpoints.md, and docs/images.md's
per-layer, per-tree outcomes from patches/layer-outcomes.json (the vllm tier's
tests/vllm/test_layer_outcomes.py checks that file against its run). scripts/render-docs writes them between `<!-- recipe:NAME -->` and
`<!-- /recipe:NAME -->`; tests/unit/test_recipe_docs.py fails while a render is stale.
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

from launcher.plan import image_base
from recipekit.recipe import CHECKPOINT_FACTS, Knob, Recipe

EMPTY = "—"
# file -> the regions rendered into it
REGIONS = {
    "README.md": ("front-knobs", "profiles"),
    "docs/launcher.md": ("knobs", "profiles", "fixed", "retired-env"),
    "docs/checkpoints.md": ("checkpoints",),
    "docs/images.md": ("layer-outcomes",),
    "docs/levers.md": ("levers",),
}
LAYER_OUTCOMES = Path(__file__).resolve().parents[2] / "patches" / "layer-outcomes.json"
TREE_TITLES = {"fork": "fork shape"}
# The rows of the checkpoints table, one a [checkpoints] fact, in CHECKPOINT_FACTS' order.
FACT_ROWS = {"format": "format", "precisions": "precisions", "size": "size",
             "revisions": "revisions", "moe_scales": "MoE gate/up global scales", "mtp": "MTP head"}


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _code(value: str) -> str:
    return f"`{value}`" if value else EMPTY


def source(recipe: Recipe, key: str) -> str:
    entry = recipe.sources[key]
    return f"[{entry.title}]({entry.url})" if entry.url else entry.title


def drives(knob: Knob) -> str:
    """What the knob drives: its `vllm serve` flags, its container variables, or the launcher."""
    parts = [f"`{flag}`" for flag in knob.flags] + [f"`{name}`" for name in knob.env]
    if not parts:
        return "launcher"
    return ", ".join(parts) + (" (2+ nodes)" if knob.when == "multi-node" else "")


def accepted(knob: Knob) -> str:
    """The values a knob takes, as its check says; an optional choice, flag or integer also
    takes empty (unset)."""
    values = _values(knob)
    if knob.optional and knob.type in ("choice", "flag", "int"):
        return f"{values}, or empty"
    return values


def _values(knob: Knob) -> str:
    if knob.type == "choice":
        return " \\| ".join(f"`{choice}`" for choice in knob.choices)
    if knob.type == "flag":
        return "`0` \\| `1`"
    if knob.type == "int":
        return f"{knob.min}..{knob.max}"
    if knob.type == "words":
        return "shell words"
    if knob.type == "path":
        return "absolute path (`~/` allowed)" if knob.mount else "path"
    return _cell(knob.accepted) if knob.accepted else "text"


def knobs_table(recipe: Recipe) -> str:
    rows = ["| Variable | Default | Accepts | Drives | What it sets | Why this default (source) |",
            "|---|---|---|---|---|---|"]
    for knob in recipe.knobs.values():
        rows.append(f"| `{knob.name}` | {_code(knob.default)} | {accepted(knob)} | "
                    f"{drives(knob)} | {_cell(knob.sets)} | {_cell(knob.why)} "
                    f"({source(recipe, knob.source)}) |")
    return "\n".join(rows)


def front_table(recipe: Recipe) -> str:
    rows = ["| Variable | Default | What it sets |", "|---|---|---|"]
    for knob in recipe.knobs.values():
        if knob.front:
            rows.append(f"| `{knob.name}` | {_code(knob.default)} | {_cell(knob.sets)} |")
    return "\n".join(rows)


def profiles_table(recipe: Recipe) -> str:
    rows = ["| `PROFILE=` | what it is | sets |", "|---|---|---|"]
    for profile in recipe.profiles.values():
        values = ", ".join(f"`{name}={value}`" if value else f"`{name}` empty"
                           for name, value in profile.values.items())
        rows.append(f"| `{profile.name}` | {_cell(profile.about)} | {values or EMPTY} |")
    return "\n".join(rows)


def fixed_table(recipe: Recipe) -> str:
    rows = ["| part | value | when | why (source) |", "|---|---|---|---|"]
    rows.append(f"| `docker run` | `{' '.join(recipe.docker_options)}` | every rank | "
                f"{_cell(recipe.docker_why)} |")
    for kind, entries in (("flag", recipe.fixed_flags), ("variable", recipe.fixed_env)):
        for entry in entries.values():
            value = f"`{entry.value}`" if entry.value else EMPTY
            when = {"multi-node": "2+ nodes", "head": "rank 0"}.get(entry.when, "every rank")
            rows.append(f"| {kind} `{entry.name}` | {value} | {when} | {_cell(entry.why)} "
                        f"({source(recipe, entry.source)}) |")
    return "\n".join(rows)


def checkpoints_table(recipe: Recipe) -> str:
    """The known checkpoints side by side: a column each, a row per fact, then what the
    launcher does with them and the sources."""
    known = list(recipe.checkpoints.values())
    rows = ["| | " + " | ".join(f"`{entry.repo}`" for entry in known) + " |",
            "|---|" + "---|" * len(known)]
    for name in CHECKPOINT_FACTS:
        cells = []
        for entry in known:
            text = entry.facts.get(name, "")
            if name == "mtp" and "mtp" in entry.spec_refused:
                text = f"`SPEC=mtp` refused: {entry.spec_refused['mtp']}"
            cells.append(_cell(text) if text else EMPTY)
        rows.append(f"| {FACT_ROWS[name]} | " + " | ".join(cells) + " |")
    rows.append("| the launcher | " + " | ".join(_launcher_cell(recipe, entry) for entry in known)
                + " |")
    rows.append("| sources | " + " | ".join(", ".join(source(recipe, key) for key in entry.sources)
                                            for entry in known) + " |")
    return "\n".join(rows)


def _launcher_cell(recipe: Recipe, entry) -> str:
    parts = []
    if entry.repo in recipe.pins:
        parts.append(f"pinned at `{recipe.pins[entry.repo][0]}` ([pins])")
    if entry.revision_prefix:
        parts.append("resolved on first use and recorded in `PINS_FILE`; a commit not starting "
                     f"with `{entry.revision_prefix}` is refused unless `MODEL_REVISION` names it")
    parts += [f"`SPEC={spec}` refused" for spec in entry.spec_refused]
    if entry.repo == recipe.knobs["MODEL"].default:
        parts.append("the default `MODEL`")
    return "; ".join(parts) or EMPTY


def layer_outcomes_table(_: Recipe) -> str:
    """Each patcher (rows, the images' order) on each tested tree (columns), as the vllm tier
    last recorded it; the recipe plays no part."""
    data = json.loads(LAYER_OUTCOMES.read_text())
    trees = data["trees"]
    rows = ["| patcher | " + " | ".join(TREE_TITLES.get(t, t) for t in trees) + " |",
            "|---|" + "---|" * len(trees)]
    for name in data["chain"]:
        rows.append(f"| {name} | " + " | ".join(_cell(data["cells"][name][t]) for t in trees) + " |")
    return "\n".join(rows)


# The profile of the field's fastest levers this recipe carries (docs/levers.md).
FASTEST_PROFILE = "field-fastest"


def compare_line(reference: str, candidate: str) -> str:
    """The scripts/compare command that judges CANDIDATE against REFERENCE (shell words)."""
    return (f"scripts/compare --reference {shlex.quote(reference)} "
            f"--candidate {shlex.quote(candidate)}")


def _lever_knobs(recipe: Recipe, lever) -> str:
    names = list(dict.fromkeys(word.partition("=")[0] for side in (lever.reference,
                                                                     lever.candidate)
                               for word in side.split() if "=" in word))
    return ", ".join(f"`{name}` (default {_code(recipe.knobs[name].default)})" for name in names)


def levers_table(recipe: Recipe) -> str:
    """docs/levers.md: every lever the field measured, its gain and sources, the knob here and
    the compare line that judges it; then the fastest profile and its line."""
    rows = ["| Lever | Measured in the field (source) | This recipe's knob | What judges it here |",
            "|---|---|---|---|"]
    for lever in recipe.levers.values():
        cited = ", ".join(source(recipe, key) for key in lever.sources)
        if lever.not_carried:
            knob, judge = "not carried", _cell(lever.not_carried)
        else:
            knob = _lever_knobs(recipe, lever)
            judge = f"`{compare_line(lever.reference, lever.candidate)}`"
        rows.append(f"| {_cell(lever.title)} | {_cell(lever.measured)} ({cited}) | {knob} | "
                    f"{judge} |")
    profile = recipe.profiles[FASTEST_PROFILE]
    sets = ", ".join(f"`{name}={value}`" for name, value in profile.values.items())
    rows += ["", f"`PROFILE={profile.name}` sets {sets}: {_cell(profile.about)}.", "",
             "The one line that judges it against the defaults on an owner's cluster:", "",
             "```bash", compare_line("", f"PROFILE={profile.name}"), "```"]
    return "\n".join(rows)


def retired_env_list(_: Recipe) -> str:
    """EXTRA_ENV settings refused on a base vLLM release that no longer honours them."""
    return image_base.retired_list()


RENDERERS = {"front-knobs": front_table, "knobs": knobs_table, "profiles": profiles_table,
             "fixed": fixed_table, "checkpoints": checkpoints_table, "layer-outcomes": layer_outcomes_table,
             "retired-env": retired_env_list, "levers": levers_table}


def region_pattern(name: str) -> re.Pattern:
    return re.compile(rf"(<!-- recipe:{name} -->\n)(.*?)(<!-- /recipe:{name} -->)", re.DOTALL)


def rendered(text: str, recipe: Recipe, names) -> str:
    """TEXT with every region in NAMES rendered afresh from RECIPE; a missing region raises
    ValueError."""
    for name in names:
        pattern = region_pattern(name)
        if not pattern.search(text):
            raise ValueError(f"no <!-- recipe:{name} --> ... <!-- /recipe:{name} --> region")
        body = RENDERERS[name](recipe)
        text = pattern.sub(lambda match: f"{match[1]}{body}\n{match[3]}", text, count=1)
    return text
