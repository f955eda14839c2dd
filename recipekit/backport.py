"""Generate the DFlash2 backport diff from two pinned vLLM releases and a manifest.

The manifest (patches/v9/manifest.json) names the new files, taken whole, and, for
each shared file, the change groups that belong to DFlash2. A change group is one
contiguous run of differing lines between the two releases (difflib's opcodes); a
selector picks it by a substring of its text that must occur in exactly one group,
so a drifting release cannot silently change what is selected. The selected groups
are applied to the older release and the result is diffed against it, so the output
is a genuine unified diff of the older release, byte-identical from run to run, and
pinned by its sha256 in the manifest.

Groups that depend on something a base may or may not have carry ``requires``: the
name of a base shape, decided by probing the tree to patch (``shape_of``), never by
its version. Shape ``logits-cache`` (vLLM's pre-temperature logits cache, in 0.28.0
and the fork image) takes DFlash2's ``draft_logits_spec`` hook, and its diff is
generated against the cache-carrying files of that shape (``recipekit.forkshape``);
shape ``no-logits-cache`` (0.27.1) takes the recipe's refusal of probabilistic
drafting instead. Each shape's diff has its own pin.
"""

from __future__ import annotations

import ast
import difflib
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
MANIFEST = REPO_ROOT / "patches" / "v9" / "manifest.json"
LOGITS_CACHE = "logits-cache"
NO_LOGITS_CACHE = "no-logits-cache"
SHAPES = (NO_LOGITS_CACHE, LOGITS_CACHE)
SALT_RELEASE = "release"  # salt shape: a base that ships DFlash2 without PR #54282
DRAFT_NOISE_SALT = "_DRAFT_NOISE_SALT"
GUMBEL = "vllm/v1/worker/gpu/sample/gumbel.py"


class BackportError(RuntimeError):
    """The manifest and the releases disagree; the message says where."""


@dataclass(frozen=True)
class ChangeGroup:
    """One contiguous difference between the old and the new file."""

    old_start: int
    old_end: int
    new_start: int
    new_end: int
    removed: tuple[str, ...]
    added: tuple[str, ...]

    @property
    def text(self) -> str:
        return "".join("-" + line for line in self.removed) + "".join(
            "+" + line for line in self.added
        )


def load_manifest(path: Path = MANIFEST) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise BackportError(f"{path}: cannot read the manifest: {error}") from None


def shape_of(read_text) -> str:
    """The base shape of a tree, given ``read_text(relative) -> str | None``.

    ``logits-cache`` when gumbel.py's ``gumbel_sample`` takes a ``logits_cache``
    argument (the pre-temperature logits cache), else ``no-logits-cache``.
    """
    source = read_text(GUMBEL)
    if source is None:
        return NO_LOGITS_CACHE
    for node in ast.parse(source).body:
        if isinstance(node, ast.FunctionDef) and node.name == "gumbel_sample":
            names = [a.arg for a in node.args.args + node.args.kwonlyargs]
            return LOGITS_CACHE if "logits_cache" in names else NO_LOGITS_CACHE
    return NO_LOGITS_CACHE


def pinned_sha256(manifest: dict, shape: str) -> str | None:
    return manifest.get("diff_sha256", {}).get(shape)


def diff_file_name(shape: str) -> str:
    return f"dflash2-{shape}.diff"


def change_groups(old: list[str], new: list[str]) -> list[ChangeGroup]:
    matcher = difflib.SequenceMatcher(None, old, new, autojunk=False)
    return [
        ChangeGroup(i1, i2, j1, j2, tuple(old[i1:i2]), tuple(new[j1:j2]))
        for tag, i1, i2, j1, j2 in matcher.get_opcodes()
        if tag != "equal"
    ]


def _for_shape(entries: list[dict], shape: str) -> list[dict]:
    return [entry for entry in entries if entry.get("requires", shape) == shape]


def _select(path: str, groups: list[ChangeGroup], selectors: list[dict]) -> list[ChangeGroup]:
    chosen: list[ChangeGroup] = []
    for selector in selectors:
        needle, expected = selector["contains"], selector.get("count", 1)
        hits = [group for group in groups if needle in group.text]
        if len(hits) != expected:
            raise BackportError(
                f"{path}: selector {needle!r} matches {len(hits)} change groups, "
                f"expected exactly {expected}; update patches/v9/manifest.json"
            )
        for group in hits:
            if group in chosen:
                raise BackportError(f"{path}: selector {needle!r} picks a group already selected")
            if "take_added" in selector:
                group = _take_added(path, group, selector)
            chosen.append(group)
    return sorted(chosen, key=lambda group: group.old_start)


def _take_added(path: str, group: ChangeGroup, selector: dict) -> ChangeGroup:
    """Keep a slice of a pure insertion that merged DFlash2 lines with a neighbour's."""
    start, end = selector["take_added"]
    if group.removed or not 0 <= start < end <= len(group.added):
        raise BackportError(
            f"{path}: take_added {selector['take_added']} does not fit the insertion "
            f"selected by {selector['contains']!r}; update patches/v9/manifest.json"
        )
    added = group.added[start:end]
    if selector["contains"] not in "".join(added):
        raise BackportError(f"{path}: take_added drops the line holding {selector['contains']!r}")
    return ChangeGroup(group.old_start, group.old_end, group.new_start + start,
                       group.new_start + end, (), added)


def _apply_groups(old: list[str], groups: list[ChangeGroup]) -> list[str]:
    result: list[str] = []
    cursor = 0
    for group in groups:
        result.extend(old[cursor : group.old_start])
        result.extend(group.added)
        cursor = group.old_end
    result.extend(old[cursor:])
    return result


def _read_lines(tree: Path, relative: str, release: str) -> list[str]:
    path = tree / "vllm" / relative
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise BackportError(f"vllm {release} has no vllm/{relative}") from None
    if text and not text.endswith("\n"):
        raise BackportError(f"vllm {release}: vllm/{relative} lacks a final newline")
    return text.splitlines(keepends=True)


def _file_diff(relative: str, old: list[str] | None, new: list[str]) -> str:
    name = f"vllm/{relative}"
    header = f"diff --git a/{name} b/{name}\n"
    if old is None:
        header += "new file mode 100644\n"
        body = difflib.unified_diff([], new, fromfile="/dev/null", tofile=f"b/{name}", n=3)
    else:
        body = difflib.unified_diff(old, new, fromfile=f"a/{name}", tofile=f"b/{name}", n=3)
    lines = list(body)
    # difflib writes "@@ -0,0 +1,N @@" for new files; git does the same, keep it.
    lines[0] = lines[0].rstrip() + "\n"
    lines[1] = lines[1].rstrip() + "\n"
    return header + "".join(lines)


def _insert(path: str, lines: list[str], insertions: list[dict]) -> list[str]:
    """The recipe's own lines, each block placed before an anchor line found exactly once."""
    for insertion in insertions:
        anchor = insertion["before"]
        places = [i for i, line in enumerate(lines) if line == anchor]
        if len(places) != 1:
            raise BackportError(
                f"{path}: recipe insertion anchor {anchor.strip()!r} found {len(places)} times, "
                "expected 1; update patches/v9/manifest.json"
            )
        lines = lines[: places[0]] + [line + "\n" for line in insertion["lines"]] + lines[places[0]:]
    return lines


def _base_overrides(old_tree: Path, new_tree: Path, shape: str) -> dict[str, list[str]]:
    """Files whose pre-DFlash2 text on ``shape`` is not the base release's."""
    if shape != LOGITS_CACHE:
        return {}
    from recipekit import forkshape  # the cache-carrying files, as the fork shape has them

    try:
        files = forkshape.logits_cache_files(old_tree, new_tree)
    except forkshape.ForkShapeError as error:
        raise BackportError(str(error)) from None
    return {name.removeprefix("vllm/"): text.splitlines(keepends=True) for name, text in files.items()}


def _dflash2_files(old_tree: Path, new_tree: Path, manifest: dict, shape: str) -> dict[str, tuple]:
    """Per file of the DFlash2 diff: (its lines before, its lines after, is it new)."""
    if shape not in SHAPES:
        raise BackportError(f"unknown base shape {shape!r}; shapes: {', '.join(SHAPES)}")
    files: dict[str, tuple] = {}
    sections = [manifest["shared_files"], manifest.get("companion_files", {})]
    selections: dict[str, list[dict]] = {}
    for section in sections:
        for relative, selectors in section.items():
            if relative in selections:
                raise BackportError(f"{relative}: listed twice in the manifest")
            selections[relative] = _for_shape(selectors, shape)
    insertions = {
        relative: _for_shape(entries, shape)
        for relative, entries in manifest.get("recipe_insertions", {}).items()
    }
    overrides = _base_overrides(old_tree, new_tree, shape)
    for relative in sorted(set(selections) | set(manifest["new_files"])):
        if relative in manifest["new_files"]:
            if (old_tree / "vllm" / relative).exists():
                raise BackportError(f"vllm {manifest['base']} already has vllm/{relative}")
            files[relative] = (None, _read_lines(new_tree, relative, manifest["source"]), True)
            continue
        old = overrides.get(relative) or _read_lines(old_tree, relative, manifest["base"])
        new = _read_lines(new_tree, relative, manifest["source"])
        chosen = _select(relative, change_groups(old, new), selections[relative])
        files[relative] = (old, _insert(relative, _apply_groups(old, chosen), insertions.get(relative, [])), False)
    return files


def _render(files: dict[str, tuple]) -> str:
    parts = []
    for relative, (old, patched, is_new) in sorted(files.items()):
        if is_new:
            parts.append(_file_diff(relative, None, patched))
        elif patched != old:
            parts.append(_file_diff(relative, old, patched))
    return "".join(parts)


def generate(old_tree: Path, new_tree: Path, manifest: dict, shape: str = NO_LOGITS_CACHE) -> str:
    """The backport diff text for ``manifest`` and base ``shape`` between the two release trees."""
    return _render(_dflash2_files(old_tree, new_tree, manifest, shape))


def salt_shapes(manifest: dict) -> tuple[str, ...]:
    return tuple(manifest["draft_noise_salt"]["shapes"])


def salt_pinned_sha256(manifest: dict, shape: str) -> str | None:
    return manifest["draft_noise_salt"].get("diff_sha256", {}).get(shape)


def salt_diff_file_name(shape: str) -> str:
    return f"draft-noise-salt-{shape}.diff"


def salt_base_lines(trees: dict[str, Path], manifest: dict, shape: str, relative: str) -> list[str]:
    """A salted file's lines once DFlash2 is in, on salt shape ``shape``."""
    if shape == SALT_RELEASE:
        return _read_lines(trees[manifest["source"]], relative, manifest["source"])
    dflash2 = _dflash2_files(trees[manifest["base"]], trees[manifest["source"]], manifest, LOGITS_CACHE)
    if relative in dflash2:
        return dflash2[relative][1]
    return _read_lines(trees[manifest["base"]], relative, manifest["base"])


def generate_salt(trees: dict[str, Path], manifest: dict, shape: str) -> str:
    """The draft-noise-salt diff (PR #54282) for salt shape ``shape``.

    ``trees`` maps the manifest's base, source and the salt's source release to their
    trees. The diff's "before" is the tree once DFlash2 is in: 0.28.0 as released
    (shape ``release``) or the fork shape with the logits-cache DFlash2 diff applied.
    """
    salt = manifest["draft_noise_salt"]
    if shape not in salt["shapes"]:
        raise BackportError(f"unknown salt shape {shape!r}; shapes: {', '.join(salt['shapes'])}")
    files: dict[str, tuple] = {}
    insertions = {r: _for_shape(e, shape) for r, e in salt.get("recipe_insertions", {}).items()}
    for relative in sorted(set(salt["shared_files"]) | set(insertions)):
        old = salt_base_lines(trees, manifest, shape, relative)
        selectors = _for_shape(salt["shared_files"].get(relative, []), shape)
        chosen = []
        if selectors:
            new = _read_lines(trees[salt["source"]], relative, salt["source"])
            chosen = _select(relative, change_groups(old, new), selectors)
        files[relative] = (old, _insert(relative, _apply_groups(old, chosen), insertions.get(relative, [])), False)
    return _render(files)


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()
