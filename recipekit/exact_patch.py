"""Exact-context unified-diff application: no fuzz, no guessing, all files or none.

Every hunk's context and removed lines must appear verbatim at exactly one place in
the file. When they appear at several places, the hunk's own line number may pick
one only if it points exactly at one of them; otherwise the hunk is ambiguous and
refused. A diff whose every hunk matches in reverse is already applied. Nothing is
written until every file of the diff has been planned, and a failed write restores
what was there, so a refusal leaves the tree byte-identical.
"""

from __future__ import annotations

import difflib
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path

from unidiff import PatchSet
from unidiff.errors import UnidiffParseError

from recipekit.tree import TreeView

_REGULAR_MODES = {None, "100644", "100755"}


class PatchRefused(Exception):
    """The diff cannot be applied exactly; ``str()`` is a user-facing explanation."""

    def __init__(self, summary: str, detail: str = "") -> None:
        super().__init__(summary)
        self.summary = summary
        self.detail = detail

    def __str__(self) -> str:
        return self.summary + (("\n" + self.detail) if self.detail else "")


@dataclass(frozen=True)
class FileEdit:
    """The bytes one file has before and after the diff (None: absent)."""

    path: str
    before: bytes | None
    after: bytes | None
    mode: int | None = None


@dataclass
class PatchPlan:
    """What applying a diff to a tree would do."""

    outcome: str  # "apply" or "already-applied"
    edits: list[FileEdit] = field(default_factory=list)

    @property
    def files(self) -> list[str]:
        return [edit.path for edit in self.edits]


def _strip_prefix(name: str) -> str:
    return name[2:] if name[:2] in ("a/", "b/") else name


def _hunk_label(index: int, hunk) -> str:
    return (
        f"hunk #{index + 1} (@@ -{hunk.source_start},{hunk.source_length} "
        f"+{hunk.target_start},{hunk.target_length} @@)"
    )


def _block(hunk, reverse: bool) -> tuple[list[str], list[str], int]:
    """Lines the hunk expects, lines it leaves, and its 1-based start line."""
    source = [line.value for line in hunk if line.is_context or line.is_removed]
    target = [line.value for line in hunk if line.is_context or line.is_added]
    if reverse:
        return target, source, hunk.target_start
    return source, target, hunk.source_start


def _matches(lines: list[str], expected: list[str]) -> list[int]:
    if not expected:
        return []
    width = len(expected)
    first = expected[0]
    return [
        start
        for start in range(len(lines) - width + 1)
        if lines[start] == first and lines[start : start + width] == expected
    ]


def _closest(lines: list[str], expected: list[str]) -> str:
    """A short diff between what the hunk expects and the most similar place."""
    width = len(expected)
    if not lines or not expected:
        return "  (the file is empty)" if not lines else ""
    best_start, best_score = 0, -1
    for start in range(max(1, len(lines) - width + 1)):
        window = lines[start : start + width]
        score = sum(1 for a, b in zip(window, expected) if a == b)
        if score > best_score:
            best_start, best_score = start, score
    found = lines[best_start : best_start + width]
    diff = difflib.unified_diff(
        expected,
        found,
        fromfile="expected",
        tofile=f"found at line {best_start + 1}",
        lineterm="",
        n=1,
    )
    shown = [line.rstrip("\n") for line in diff][:24]
    return "\n".join("  " + line for line in shown)


def _apply_hunks(path: str, text: str, hunks, reverse: bool) -> str:
    lines = text.splitlines(keepends=True)
    offset = 0
    for index, hunk in enumerate(hunks):
        expected, replacement, start_line = _block(hunk, reverse)
        label = _hunk_label(index, hunk)
        if not expected:
            # Pure insertion without context: only the header line can place it.
            position = start_line + offset if start_line > 0 else 0
            if not 0 <= position <= len(lines):
                raise PatchRefused(f"{path}: {label} inserts at line {position}, past the end")
            places = [position]
        else:
            places = _matches(lines, expected)
        if not places:
            shown = "".join("  | " + line for line in expected[:12])
            more = f"  | ... ({len(expected) - 12} more lines)\n" if len(expected) > 12 else ""
            raise PatchRefused(
                f"{path}: {label} does not match: its {len(expected)} context/removed "
                f"lines are not in the file",
                f"expected:\n{shown}{more}closest place:\n{_closest(lines, expected)}",
            )
        if len(places) > 1:
            hinted = start_line - 1 + offset
            if hinted not in places:
                where = ", ".join(str(p + 1) for p in places[:8])
                raise PatchRefused(
                    f"{path}: {label} is ambiguous: its context matches at lines {where} "
                    f"and its header points at none of them",
                )
            places = [hinted]
        position = places[0]
        lines[position : position + len(expected)] = replacement
        offset += len(replacement) - len(expected)
    return "".join(lines)


def _read(path: Path) -> str | None:
    try:
        return path.read_bytes().decode("utf-8")
    except FileNotFoundError:
        return None
    except UnicodeDecodeError:
        raise PatchRefused(f"{path}: not UTF-8 text; refusing to patch it") from None


def _file_mode(patched_file) -> int | None:
    mode = patched_file.target_mode
    return int(mode, 8) & 0o777 if mode else None


def _plan_file(root: Path, patched_file, reverse: bool) -> FileEdit:
    if patched_file.is_binary_file:
        name = _strip_prefix(patched_file.target_file or patched_file.source_file)
        raise PatchRefused(f"{name}: binary stanza ('Binary files ... differ'); refusing it")
    source = _strip_prefix(patched_file.source_file)
    target = _strip_prefix(patched_file.target_file)
    if patched_file.is_rename:
        raise PatchRefused(f"{source} -> {target}: renames are not supported; refusing it")
    if patched_file.target_mode not in _REGULAR_MODES or patched_file.source_mode not in _REGULAR_MODES:
        raise PatchRefused(f"{target}: mode {patched_file.target_mode} is not a regular file")
    creates = patched_file.is_removed_file if reverse else patched_file.is_added_file
    deletes = patched_file.is_added_file if reverse else patched_file.is_removed_file
    path = source if patched_file.is_removed_file else target
    current = root.read_text(path) if isinstance(root, TreeView) else _read(root / path)
    if creates:
        if current is not None:
            raise PatchRefused(f"{path}: the diff creates this file but it already exists")
        after = _apply_hunks(path, "", patched_file, reverse)
        return FileEdit(path, None, after.encode("utf-8"), _file_mode(patched_file))
    if current is None:
        raise PatchRefused(f"{path}: the diff changes this file but it does not exist")
    after = _apply_hunks(path, current, patched_file, reverse)
    if deletes:
        if after:
            raise PatchRefused(f"{path}: the diff deletes this file but content would remain")
        return FileEdit(path, current.encode("utf-8"), None)
    return FileEdit(path, current.encode("utf-8"), after.encode("utf-8"))


def parse(diff_text: str) -> PatchSet:
    """Parse a unified diff, refusing one that unidiff cannot read or that is empty."""
    try:
        patch = PatchSet(diff_text)
    except UnidiffParseError as error:
        raise PatchRefused(f"the diff does not parse: {error}") from None
    if not patch:
        raise PatchRefused("the diff holds no file changes")
    return patch


def plan(root: Path | TreeView, diff_text: str) -> PatchPlan:
    """Decide, without writing, whether the diff applies, is applied, or is refused.

    ``root`` may be a TreeView: the diff is then planned on the files as it shows them.
    """
    patch = parse(diff_text)
    try:
        return PatchPlan("apply", [_plan_file(root, f, reverse=False) for f in patch])
    except PatchRefused as forward_error:
        if any(f.is_binary_file for f in patch):
            raise
        applied = [f.path for f in patch if _reverse_matches(root, f)]
        if len(applied) == len(patch):
            return PatchPlan("already-applied", [])
        if applied:
            forward_error.detail += (
                f"\nthe tree is partly patched: {len(applied)} of {len(patch)} files already "
                f"carry their change ({', '.join(applied[:4])})"
            )
        raise forward_error from None


def plan_text(path: str, text: str, diff_text: str) -> tuple[bool, str]:
    """A one-file diff on ``text``: (False, patched text), or (True, text) when already applied.

    The same rules as ``plan``: exact context at one place, never fuzz; a diff that
    matches neither forward nor in reverse raises PatchRefused.
    """
    patch = parse(diff_text)
    if len(patch) != 1 or patch[0].is_binary_file:
        raise PatchRefused(f"{path}: expected a diff of this one text file")
    try:
        return False, _apply_hunks(path, text, patch[0], reverse=False)
    except PatchRefused as forward_error:
        try:
            _apply_hunks(path, text, patch[0], reverse=True)
        except PatchRefused:
            raise forward_error from None
        return True, text


def _reverse_matches(root: Path, patched_file) -> bool:
    try:
        _plan_file(root, patched_file, reverse=True)
    except PatchRefused:
        return False
    return True


def write(root: Path, patch_plan: PatchPlan) -> None:
    """Write every planned file, or restore them all if any write fails."""
    done: list[FileEdit] = []
    created_dirs: list[Path] = []
    try:
        for edit in patch_plan.edits:
            target = root / edit.path
            if edit.after is None:
                target.unlink()
                done.append(edit)
                continue
            missing = [p for p in reversed(target.parents) if not p.exists()]
            target.parent.mkdir(parents=True, exist_ok=True)
            created_dirs.extend(missing)
            _replace(target, edit.after, edit.mode)
            done.append(edit)
    except OSError as error:
        for edit in reversed(done):
            target = root / edit.path
            if edit.before is None:
                target.unlink(missing_ok=True)
            else:
                _replace(target, edit.before, None)
        for directory in reversed(created_dirs):
            if directory.is_dir() and not any(directory.iterdir()):
                directory.rmdir()
        raise PatchRefused(f"writing {error.filename}: {error.strerror}; the tree was restored") from None


def _replace(target: Path, content: bytes, mode: int | None) -> None:
    """Write through a temporary file and a rename, never in place (hard links stay intact)."""
    previous_mode = stat.S_IMODE(target.stat().st_mode) if target.exists() else 0o644
    staging = target.with_name(f".{target.name}.patch-tmp")
    staging.write_bytes(content)
    os.chmod(staging, mode if mode is not None else previous_mode)
    os.replace(staging, target)
