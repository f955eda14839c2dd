"""Layer v8: sm_121 (GB10) enablement of the vendor image's vLLM and FlashInfer.

The seed's v8 (the seed's PR #1 deployment) made its changes as exact-text
edits; here the vLLM ones (D1, D2a-c, D4, V7a-c) and FlashInfer's Python one (F2) are
LibCST edits found by name and shape, and the CUDA header one (F1) is an exact-context
edit. The root holds ``vllm/`` and, in an image, ``flashinfer/`` beside it.

Every change is reported on its own: ``applied``, ``present`` (the tree has it),
``skipped`` (this base lacks the target and so does not need it; the reason says why) or
``refused`` (the target drifted). One refusal refuses the layer and nothing is written.
The packages v8 pins (P) are installed by the image build before this runs
(``recipekit.sm121_packages``).
"""

from __future__ import annotations

from pathlib import Path

import libcst as cst

from recipekit.exact_patch import FileEdit, PatchPlan, PatchRefused
from recipekit.layer import Layer
from recipekit.layers.sm121_edits import Change, Drift, Finding
from recipekit.layers.sm121_flashinfer import changes as flashinfer_changes
from recipekit.layers.sm121_vllm import CHANGES as VLLM_CHANGES
from recipekit.layers.sm121_vllm import CUDA, KPOOL_INDEXER_IMPORTERS
from recipekit.sm121_packages import VERSION_FILE, packages_for, read_carried, read_pins, version_of
from recipekit.tree import TreeView

# Requires-Dist of the releases' wheel METADATA that need FlashInfer 0.7.x: the fork set's
# 0.6.18 would downgrade them, so each has a package set of its own (patches/v8/).
BASE_REQUIRES = {
    "0.33.0": {"flashinfer-python": "0.7.2.post1", "nvidia-cutlass-dsl": "4.8.0"},
    "0.34.0": {"flashinfer-python": "0.7.3", "nvidia-cutlass-dsl": "4.8.0"},
}


def base_version(view: TreeView) -> str | None:
    """The tree's vLLM version as its vllm/_version.py states it (None if it does not)."""
    return version_of(view.read_text(VERSION_FILE))


def package_problem(view: TreeView) -> str | None:
    """One line when the base requires packages other than v8's set for it (patches/v8/)."""
    version = base_version(view)
    required = BASE_REQUIRES.get(version or "")
    if required is None:
        return None
    packages = packages_for(version)
    pins = {**read_pins(packages), **read_carried(packages)}
    differ = {name: wanted for name, wanted in required.items() if pins.get(name) != wanted}
    if not differ:
        return None
    needs = " and ".join(f"{name}=={wanted}" for name, wanted in differ.items())
    pinned = " and ".join(f"{name}=={pins.get(name, 'unpinned')}" for name in differ)
    own = f"patches/v8/packages-vllm-{version}.txt"
    todo = f"pin them in {own}" if packages.name == Path(own).name else f"add {own} with them"
    return f"vLLM {version} requires {needs}; v8 pins {pinned} (patches/v8/{packages.name}); {todo}"


class _Files:
    """The target files as edited so far: parsed modules for Python, text otherwise."""

    def __init__(self, view: TreeView) -> None:
        self.view = view
        self.original: dict[str, str] = {}
        self.current: dict[str, object] = {}

    def load(self, path: str):
        if path not in self.current:
            text = self.view.read_text(path)
            self.original[path] = text
            if path.endswith(".py"):
                try:
                    self.current[path] = cst.parse_module(text)
                except cst.ParserSyntaxError as error:
                    raise Drift(f"does not parse: {error.message}") from None
            else:
                self.current[path] = text
        return self.current[path]

    def text(self, path: str) -> str:
        value = self.current[path]
        return value.code if isinstance(value, cst.Module) else value


class Sm121Layer(Layer):
    name = "v8"

    def __init__(self, require_flashinfer: bool = False) -> None:
        self.changes: tuple[Change, ...] = VLLM_CHANGES + flashinfer_changes(require_flashinfer)
        self.findings: list[Finding] = []

    def survey(self, view: TreeView) -> tuple[list[Finding], dict[str, tuple[str, str]]]:
        """Every change run on ``view``: its findings, and each edited file's (before, after)."""
        files = _Files(view)
        findings: list[Finding] = []
        edited: set[str] = set()
        for change in self.changes:
            try:
                skip = change.skip_when(view) if change.skip_when else None
            except Drift as drift:
                findings.append(Finding(change.id, "refused", change.files[0], str(drift)))
                continue
            if skip:
                findings.append(Finding(change.id, "skipped", change.files[0], skip))
                continue
            where = (change.locate(view) if change.locate
                     else [path for path in change.files if view.exists(path)])
            if not where:
                missing = " and ".join(change.files)
                findings.append(
                    Finding(change.id, "refused", change.files[0], f"{missing} missing")
                )
                continue
            for path in where:
                try:
                    files.current[path], present, detail = change.edit(files.load(path))
                except Drift as drift:
                    findings.append(Finding(change.id, "refused", path, str(drift)))
                    continue
                if path != change.files[0] and not view.exists(change.files[0]):
                    detail += f" (this base keeps it here, not in {change.files[0]})"
                findings.append(
                    Finding(change.id, "present" if present else "applied", path, detail)
                )
                if not present:
                    edited.add(path)
        return findings, {path: (files.original[path], files.text(path)) for path in sorted(edited)}

    def plan(self, view: TreeView) -> PatchPlan:
        self.findings, edits = self.survey(view)
        refused = [f for f in self.findings if f.status == "refused"]
        packages = package_problem(view)
        if refused or packages:
            for finding in self.findings:
                if finding.status == "applied":  # planned, but the layer writes nothing
                    finding.status = "not-written"
            # The package mismatch comes first: it is why the FlashInfer edits cannot hold.
            raise PatchRefused(packages or "; ".join(f"{f.change} {f.file}: {f.detail}" for f in refused))
        if not edits:
            if any(f.status == "present" for f in self.findings):
                return PatchPlan("already-applied", [])
            raise PatchRefused("none of v8's targets is in this tree; is this a vLLM for CUDA?")
        return PatchPlan(
            "apply",
            [
                FileEdit(path, before.encode(), after.encode())
                for path, (before, after) in edits.items()
            ],
        )

    def missing_capability(self, view: TreeView) -> list[str]:
        findings, _ = self.survey(view)
        return [
            f"{f.change} {f.file}: {'still to apply' if f.status == 'applied' else f.detail}"
            for f in findings
            if f.status in ("applied", "refused")
        ]

    def provided_by_base(self, view: TreeView) -> str | None:
        return None  # a base with every change's shape is reported already-applied

    def change_report(self) -> list[dict]:
        return [finding.to_json() for finding in self.findings]

    def importable_modules(self, files: list[str]) -> list[str]:
        # cuda.py loads vLLM's compiled CUDA extension at import, which needs a driver that
        # an image build does not have (the vllm tier exercises it on CPU instead); the kpool
        # indexer is imported through the module vLLM itself imports it from (importing it
        # first is a circular import in stock vLLM).
        modules = []
        for path in files:
            if path.startswith("vllm/") and path.endswith(".py") and path != CUDA:
                module = KPOOL_INDEXER_IMPORTERS.get(path, path[:-3].replace("/", "."))
                if module not in modules:
                    modules.append(module)
        return modules


def build(require_flashinfer: bool = False, **_: object) -> Sm121Layer:
    return Sm121Layer(require_flashinfer=require_flashinfer)
