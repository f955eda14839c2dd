"""recipe.toml read into typed knobs, profiles, pins, checkpoints and fixed parts; nothing
else reads it.
The launcher and the image build (recipekit.imagebuild) both read it through here.

A malformed recipe is a bug of this repository, not a user's setting: it raises
RecipeError naming the knob and the field.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import tomllib

REPO = Path(__file__).resolve().parent.parent
RECIPE_PATH = REPO / "recipe.toml"

TYPES = ("choice", "flag", "int", "text", "path", "words")
WHEN = ("multi-node", "head")
_KNOB_FIELDS = {
    "type", "default", "choices", "choices_why", "min", "max", "range_why", "pattern",
    "accepted", "optional", "none", "safe_max", "safe", "force", "unsafe_why", "rule",
    "flag", "env", "when", "sets", "why", "source", "front", "mount", "prefixes", "required",
    "unset_why", "relative_to", "only_with",
}


class RecipeError(Exception):
    """recipe.toml does not say what the launcher or the build needs (a repository bug)."""


@dataclass(frozen=True)
class Source:
    key: str
    title: str
    url: str = ""


@dataclass(frozen=True)
class Knob:
    name: str
    type: str
    default: str
    sets: str
    why: str
    source: str
    choices: tuple[str, ...] = ()
    choices_why: str = ""
    min: int | None = None
    max: int | None = None
    range_why: str = ""
    pattern: str = ""
    accepted: str = ""
    optional: bool = False
    none: bool = False
    safe_max: int | None = None
    safe: tuple[str, ...] = ()  # the values accepted without `force`
    force: str = ""
    unsafe_why: str = ""
    # a value's own reason for its refusal (unsafe_why: the others')
    unsafe_why_by: dict[str, str] = field(default_factory=dict)
    rule: str = ""
    flags: tuple[str, ...] = ()
    env: tuple[str, ...] = ()
    when: str = ""
    front: bool = False
    mount: bool = False
    prefixes: tuple[str, ...] = ()
    required: str = ""
    unset_why: str = ""
    relative_to: str = ""
    only_with: str = ""  # a flag knob: this knob's variables are set only while it is 1


@dataclass(frozen=True)
class Fixed:
    """A part of every rank's command that is not a knob: a flag, a variable, docker options."""
    name: str
    value: str
    when: str
    why: str
    source: str


@dataclass(frozen=True)
class Profile:
    name: str
    about: str
    values: dict[str, str]


# A [checkpoints] entry's facts for the reader, in the order docs/checkpoints.md shows them.
CHECKPOINT_FACTS = ("format", "precisions", "size", "revisions", "moe_scales", "mtp")
_CHECKPOINT_FIELDS = {*CHECKPOINT_FACTS, "revision_prefix", "spec_refused", "sources"}


@dataclass(frozen=True)
class Checkpoint:
    """What is known of a published checkpoint (a MODEL repo id)."""
    repo: str
    facts: dict[str, str]  # CHECKPOINT_FACTS present, in that order
    sources: tuple[str, ...]
    revision_prefix: str = ""  # a recorded or resolved commit must start with it
    spec_refused: dict[str, str] = field(default_factory=dict)  # SPEC value -> why


@dataclass(frozen=True)
class Lever:
    """A lever the field measured (docs/levers.md): its gain as reported, and the
    scripts/compare sides that judge it here, or why the recipe does not carry it."""
    name: str
    title: str
    measured: str
    sources: tuple[str, ...]
    reference: str = ""
    candidate: str = ""
    not_carried: str = ""


_LEVER_FIELDS = {"title", "measured", "sources", "reference", "candidate", "not_carried"}


@dataclass(frozen=True)
class Recipe:
    name: str
    chain_prefix: str
    knobs: dict[str, Knob]
    profiles: dict[str, Profile]
    sources: dict[str, Source]
    pins: dict[str, tuple[str, str]]  # repo id -> (revision, source key)
    docker_options: tuple[str, ...]
    docker_why: str
    fixed_flags: dict[str, Fixed] = field(default_factory=dict)
    fixed_env: dict[str, Fixed] = field(default_factory=dict)
    checkpoints: dict[str, Checkpoint] = field(default_factory=dict)
    levers: dict[str, Lever] = field(default_factory=dict)

    def flag_owners(self) -> dict[str, str]:
        """Every `vllm serve` flag the launcher sets -> the knob names that set it, or ""
        for a fixed part of the seed's run."""
        return self._owners(lambda knob: knob.flags, self.fixed_flags)

    def env_owners(self) -> dict[str, str]:
        """Every container variable the launcher sets -> its knob names, or "" when fixed."""
        return self._owners(lambda knob: knob.env, self.fixed_env)

    def _owners(self, driven_by, fixed) -> dict[str, str]:
        """Each name a knob drives (DRIVEN_BY(knob)) -> the knobs that drive it, in recipe
        order; each name in FIXED that no knob drives -> ""."""
        owners: dict[str, list[str]] = {}
        for knob in self.knobs.values():
            for name in driven_by(knob):
                owners.setdefault(name, []).append(knob.name)
        result = {name: _names(names) for name, names in owners.items()}
        for name in fixed:
            result.setdefault(name, "")
        return result


def _names(names: list[str]) -> str:
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def _text(value, where: str) -> str:
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise RecipeError(f"recipe.toml: {where} = {value!r}: write a string or an integer")
    return str(value)


def _words(value, where: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise RecipeError(f"recipe.toml: {where} = {value!r}: write a list of strings")
    return tuple(value)


def _knob(name: str, table: dict, sources: dict) -> Knob:
    where = f"[knobs.{name}]"
    unknown = set(table) - _KNOB_FIELDS
    if unknown:
        raise RecipeError(f"recipe.toml: {where} has unknown fields {sorted(unknown)}")
    for required in ("type", "default", "sets", "why", "source"):
        if required not in table:
            raise RecipeError(f"recipe.toml: {where} lacks `{required}`")
    if table["type"] not in TYPES:
        raise RecipeError(f"recipe.toml: {where} type = {table['type']!r}: one of {TYPES}")
    if table["source"] not in sources:
        raise RecipeError(f"recipe.toml: {where} source = {table['source']!r}: not in [sources]")
    if table.get("when", "") not in ("", *WHEN):
        raise RecipeError(f"recipe.toml: {where} when = {table['when']!r}: one of {WHEN}")
    if table["type"] == "choice" and not table.get("choices"):
        raise RecipeError(f"recipe.toml: {where} is a choice without `choices`")
    if table["type"] == "int" and ("min" not in table or "max" not in table):
        raise RecipeError(f"recipe.toml: {where} is an int without `min` and `max`")
    if table.get("required", "") not in ("", "always", "multi-node"):
        raise RecipeError(f"recipe.toml: {where} required = {table['required']!r}")
    if table.get("required") and not table.get("unset_why"):
        raise RecipeError(f"recipe.toml: {where} is required without `unset_why`")
    if table.get("force") and table.get("safe_max") is None and not table.get("safe"):
        raise RecipeError(f"recipe.toml: {where} names `force` without `safe_max` or `safe`")
    safe = table.get("safe", [])
    safe = (safe,) if isinstance(safe, str) else _words(safe, f"{where} safe")
    unsafe = table.get("unsafe_why", "")
    if isinstance(unsafe, dict):
        by_value = {value: _text(why, f"{where} unsafe_why.{value}")
                    for value, why in unsafe.items()}
        if "*" not in by_value:
            raise RecipeError(f"recipe.toml: {where} unsafe_why is a table without \"*\" (the "
                              "reason of every value it does not name)")
        unsafe = by_value.pop("*")
    else:
        by_value = {}
    return Knob(
        name=name, type=table["type"], default=_text(table["default"], f"{where} default"),
        sets=table["sets"], why=table["why"], source=table["source"],
        choices=tuple(_text(choice, f"{where} choices") for choice in table.get("choices", ())),
        choices_why=table.get("choices_why", ""), min=table.get("min"), max=table.get("max"),
        range_why=table.get("range_why", ""), pattern=table.get("pattern", ""),
        accepted=table.get("accepted", ""), optional=bool(table.get("optional", False)),
        none=bool(table.get("none", False)), safe_max=table.get("safe_max"),
        safe=safe, force=table.get("force", ""),
        unsafe_why=unsafe, unsafe_why_by=by_value, rule=table.get("rule", ""),
        flags=_words(table.get("flag", []), f"{where} flag"),
        env=_words(table.get("env", []), f"{where} env"), when=table.get("when", ""),
        front=bool(table.get("front", False)), mount=bool(table.get("mount", False)),
        prefixes=_words(table.get("prefixes", []), f"{where} prefixes"),
        required=table.get("required", ""), unset_why=table.get("unset_why", ""),
        relative_to=table.get("relative_to", ""), only_with=table.get("only_with", ""),
    )


def _fixed(section: str, table: dict) -> dict[str, Fixed]:
    fixed = {}
    for name, entry in table.items():
        if entry.get("when", "") not in ("", *WHEN):
            raise RecipeError(f"recipe.toml: [fixed.{section}] {name} when = {entry['when']!r}")
        fixed[name] = Fixed(name, _text(entry.get("value", ""), f"[fixed.{section}] {name}"),
                            entry.get("when", ""), entry["why"], entry["source"])
    return fixed


def parse(data: dict) -> Recipe:
    """The recipe in DATA (recipe.toml as tomllib reads it), checked."""
    sources = {key: Source(key, entry["title"], entry.get("url", ""))
               for key, entry in data["sources"].items()}
    knobs = {name: _knob(name, table, sources) for name, table in data["knobs"].items()}
    for knob in knobs.values():
        if knob.force and (knob.force not in knobs or knobs[knob.force].type != "flag"):
            raise RecipeError(f"recipe.toml: [knobs.{knob.name}] force = {knob.force!r}: "
                              "not a flag knob")
        if knob.only_with and (knob.only_with not in knobs or knobs[knob.only_with].type != "flag"):
            raise RecipeError(f"recipe.toml: [knobs.{knob.name}] only_with = {knob.only_with!r}: "
                              "not a flag knob")
    profiles = {}
    for name, table in data["profiles"].items():
        values = {key: _text(value, f"[profiles.{name}] {key}")
                  for key, value in table.items() if key != "about"}
        for key in values:
            if key not in knobs or key == "PROFILE":
                raise RecipeError(f"recipe.toml: [profiles.{name}] sets {key}, not a knob")
        profiles[name] = Profile(name, table.get("about", ""), values)
    if knobs["PROFILE"].choices != tuple(profiles):
        raise RecipeError("recipe.toml: [knobs.PROFILE] choices must list every [profiles.*], "
                          f"in order: {list(profiles)}")
    fixed = data["fixed"]
    checkpoints = {repo: _checkpoint(repo, entry, sources, knobs["SPEC"].choices)
                   for repo, entry in data.get("checkpoints", {}).items()}
    levers = {name: _lever(name, entry, sources, knobs, profiles)
              for name, entry in data.get("levers", {}).items()}
    return Recipe(
        name=data["recipe"]["name"], chain_prefix=data["recipe"]["chain_prefix"],
        knobs=knobs, profiles=profiles, sources=sources,
        pins={repo: _pin(repo, entry) for repo, entry in data["pins"].items()},
        docker_options=_words(fixed["docker"]["options"], "[fixed.docker] options"),
        docker_why=fixed["docker"]["why"],
        fixed_flags=_fixed("flags", fixed["flags"]), fixed_env=_fixed("env", fixed["env"]),
        checkpoints=checkpoints, levers=levers,
    )


def _lever(name: str, entry: dict, sources: dict, knobs: dict, profiles: dict) -> Lever:
    where = f"[levers.{name}]"
    unknown = set(entry) - _LEVER_FIELDS
    if unknown:
        raise RecipeError(f"recipe.toml: {where} has unknown fields {sorted(unknown)}")
    cited = _words(entry.get("sources", []), f"{where} sources")
    if not cited or set(cited) - set(sources):
        raise RecipeError(f"recipe.toml: {where} sources = {list(cited)}: name keys of [sources]")
    for side in ("reference", "candidate"):
        for word in _text(entry.get(side, ""), f"{where} {side}").split():
            knob, equals, _ = word.partition("=")
            if (equals and knob not in knobs) or (not equals and word not in profiles):
                raise RecipeError(f"recipe.toml: {where} {side} word {word!r}: a profile or "
                                  "NAME=VALUE of a knob")
    sides = entry.get("reference", "") or entry.get("candidate", "")
    if bool(sides) == bool(entry.get("not_carried")):
        raise RecipeError(f"recipe.toml: {where}: give compare sides (reference, candidate) or "
                          "not_carried, one of them")
    return Lever(name, _text(entry["title"], f"{where} title"),
                 _text(entry["measured"], f"{where} measured"), cited,
                 entry.get("reference", ""), entry.get("candidate", ""),
                 entry.get("not_carried", ""))


def _checkpoint(repo: str, entry: dict, sources: dict, specs: tuple[str, ...]) -> Checkpoint:
    where = f'[checkpoints."{repo}"]'
    unknown = set(entry) - _CHECKPOINT_FIELDS
    if unknown:
        raise RecipeError(f"recipe.toml: {where} has unknown fields {sorted(unknown)}")
    cited = _words(entry.get("sources", []), f"{where} sources")
    if not cited or set(cited) - set(sources):
        raise RecipeError(f"recipe.toml: {where} sources = {list(cited)}: name keys of [sources]")
    prefix = entry.get("revision_prefix", "")
    if prefix and not (isinstance(prefix, str) and re.fullmatch(r"[0-9a-f]{4,40}", prefix)):
        raise RecipeError(f"recipe.toml: {where} revision_prefix = {prefix!r}: lowercase hex")
    refused = entry.get("spec_refused", {})
    if not isinstance(refused, dict) or set(refused) - set(specs):
        raise RecipeError(f"recipe.toml: {where} spec_refused = {refused!r}: SPEC values "
                          f"({', '.join(specs)}) and why")
    return Checkpoint(repo, {name: _text(entry[name], f"{where} {name}")
                             for name in CHECKPOINT_FACTS if name in entry},
                      cited, prefix, {spec: _text(why, f"{where} spec_refused.{spec}")
                                      for spec, why in refused.items()})


def _pin(repo: str, entry: dict) -> tuple[str, str]:
    if "revision" not in entry:
        raise RecipeError(f"recipe.toml: [pins] \"{repo}\" has no `revision`: [pins] holds checkpoint "
                          "commits; base images are trusted by image ID in recipe.lock (docs/images.md)")
    return entry["revision"], entry["source"]


_LOADED: dict[Path, Recipe] = {}


def load(path: Path = RECIPE_PATH) -> Recipe:
    """The recipe at PATH (recipe.toml at the repository root), read once."""
    if path not in _LOADED:
        try:
            with path.open("rb") as handle:
                data = tomllib.load(handle)
        except (OSError, tomllib.TOMLDecodeError) as error:
            raise RecipeError(f"{path}: {error}") from None
        _LOADED[path] = parse(data)
    return _LOADED[path]
