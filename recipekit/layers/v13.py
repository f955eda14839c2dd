"""Layer v13: the seed's later runtime work on top of v11, as change groups gated at run time.

Groups (``v13_groups.GROUPS``): the sparse indexer's kpool tail-ring fix, and the opt-in
switches. Each group is reported on its own: ``applied``, ``present`` (already in the
tree), ``provided`` (the base already has the capability; the detail says what upstream
fixed and what it did not) or ``refused`` (an anchor is not found the expected number of
times). One refusal refuses the layer and nothing is written; a group partly in the tree
is refused too. Every group is off unless its ``GLM53_*`` variable is exactly "1".
"""

from __future__ import annotations

from recipekit.codepatch import PATCHES_DIR
from recipekit.exact_patch import FileEdit, PatchPlan, PatchRefused
from recipekit.layers import Layer
from recipekit.layers.glm5next import NO_GLM5NEXT, PACKAGE
from recipekit.layers.sm121_edits import Finding
from recipekit.layers.v13_groups import GROUPS, SWITCHES, Either, Group
from recipekit.tree import TreeView

HELPER_SOURCE = PATCHES_DIR / "v13" / "glm53_v13_switches.py"


class _Drift(Exception):
    pass


def _edit_file(text: str, edits, where: str) -> tuple[str, list[str]]:
    """``text`` with ``edits`` made, and the state of each edit (present or applied)."""
    states = []
    for change in edits:
        options = change.options if isinstance(change, Either) else (change,)
        present = next((e for e in options if text.count(e.evidence) == e.count), None)
        if present is not None:
            states.append("present")
            continue
        edit = next((e for e in options if text.count(e.anchor) == e.count), None)
        if edit is None:
            wanted = " or ".join(repr(e.anchor.strip().splitlines()[0]) for e in options)
            found = " and ".join(str(text.count(e.anchor)) for e in options)
            raise _Drift(f"{where}: expected {wanted} {options[0].count} time(s), found it {found}")
        text = text.replace(edit.anchor, edit.replacement)
        states.append("applied")
    return text, states


class V13Layer(Layer):
    name = "v13"

    def __init__(self, groups: tuple[Group, ...] = GROUPS, *, needs_glm5next: bool = True) -> None:
        self.groups = groups
        # the engine tier lays the adaptive-verify group alone onto a release without Glm5Next
        self.needs_glm5next = needs_glm5next
        self.findings: list[Finding] = []

    def survey(self, view: TreeView) -> tuple[list[Finding], dict[str, tuple[str, str]]]:
        current: dict[str, str] = {}
        original: dict[str, str] = {}
        findings: list[Finding] = []
        for group in self.groups:
            first = next(iter(group.edits))
            shown = first if isinstance(first, str) else first[0]
            provided = group.provided_by(view)
            if provided:
                findings.append(Finding(group.id, "provided", shown, provided))
                continue
            staged = dict(current)
            states: list[str] = []
            try:
                for index, (target, edits) in enumerate(group.edits.items()):
                    candidates = (target,) if isinstance(target, str) else target
                    path = next((p for p in candidates if view.exists(p)), None)
                    if path is None:
                        raise _Drift(f"{' and '.join(candidates)} missing")
                    shown = path if index == 0 else shown
                    if path not in staged:
                        original.setdefault(path, view.read_text(path))
                        staged[path] = original[path]
                    staged[path], file_states = _edit_file(staged[path], edits, path)
                    states += file_states
            except _Drift as drift:
                findings.append(Finding(group.id, "refused", shown, str(drift)))
                continue
            if "present" in states and "applied" in states:
                findings.append(Finding(group.id, "refused", shown, "partly in the tree; start from an unpatched base"))
                continue
            status = "applied" if "applied" in states else "present"
            findings.append(Finding(group.id, status, shown, f"{group.variable}=1 turns it on: {group.summary}"))
            current = staged
        edited = {p: (original[p], t) for p, t in current.items() if t != original[p]}
        return findings, edited

    def plan(self, view: TreeView) -> PatchPlan:
        if self.needs_glm5next and not view.exists(f"{PACKAGE}/__init__.py"):
            raise PatchRefused(NO_GLM5NEXT.replace("v10 and v11 need", "v13 needs"))
        self.findings, edits = self.survey(view)
        refused = [f for f in self.findings if f.status == "refused"]
        if refused:
            for finding in self.findings:
                if finding.status == "applied":
                    finding.status = "not-written"
            raise PatchRefused("; ".join(f"{f.change} {f.file}: {f.detail}" for f in refused))
        helper = HELPER_SOURCE.read_text(encoding="utf-8")
        installed = view.read_text(SWITCHES)
        needs_helper = any(f.status in ("applied", "present") for f in self.findings)
        if installed is not None and installed != helper:
            raise PatchRefused(f"{SWITCHES} exists with other content; start from an unpatched base")
        if not edits:
            if needs_helper and installed is None:
                raise PatchRefused(f"{SWITCHES} is missing though the groups are in the tree; start from an unpatched base")
            if needs_helper:
                return PatchPlan("already-applied", [])
            return PatchPlan("apply", [])  # every group provided: provided_by_base answers
        plan_edits = [FileEdit(p, b.encode(), a.encode()) for p, (b, a) in sorted(edits.items())]
        if installed is None:
            plan_edits.append(FileEdit(SWITCHES, None, helper.encode()))
        return PatchPlan("apply", plan_edits)

    def missing_capability(self, view: TreeView) -> list[str]:
        findings, _ = self.survey(view)
        problems = [f"{f.change} {f.file}: {'still to apply' if f.status == 'applied' else f.detail}"
                    for f in findings if f.status in ("applied", "refused")]
        if any(f.status == "present" for f in findings) and not view.exists(SWITCHES):
            problems.append(f"{SWITCHES} is missing")
        return problems

    def provided_by_base(self, view: TreeView) -> str | None:
        findings, _ = self.survey(view)
        if findings and all(f.status == "provided" for f in findings):
            return "; ".join(f"{f.change}: {f.detail}" for f in findings)
        return None

    def change_report(self) -> list[dict]:
        return [finding.to_json() for finding in self.findings]

    def importable_modules(self, files: list[str]) -> list[str]:
        # The kpool kernels and the tail cache import through Glm5Next's attention module.
        modules = []
        for path in files:
            module = path[:-3].replace("/", ".")
            if module not in modules:
                modules.append(module)
        return modules


def build(**_: object) -> V13Layer:
    return V13Layer()
