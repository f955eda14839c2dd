"""A layer's contract and its runner: probe, apply, verify, the same way in tests and images.

Below every patcher (recipekit.codepatch, recipekit.layers): it imports only the patch
primitives (exact_patch, tree, verify), so no import runs back up.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path

from recipekit import exact_patch
from recipekit.exact_patch import PatchPlan, PatchRefused
from recipekit.tree import TreeView
from recipekit.verify import TorchDoesNotImport, import_problems, static_problems

EXIT_CODES = {"applied": 0, "already-applied": 0, "provided-by-base": 0, "refused": 3}


class LayerSetupError(RuntimeError):
    """The layer cannot run at all (missing input, bad root): exit 2, not a refusal."""


@dataclass
class LayerResult:
    layer: str
    outcome: str
    files: list[str] = field(default_factory=list)
    reason: str = ""
    changes: list[dict] = field(default_factory=list)  # per-change findings (v8)

    def to_json(self) -> dict:
        return asdict(self)


class Layer:
    """What every layer provides to the runner."""

    name = ""
    plan_note = ""  # what the probe chose (e.g. v9's base shape), added to the reason

    def plan(self, view: TreeView) -> PatchPlan:
        """The edits to make, or ``already-applied``; raises PatchRefused on drift."""
        raise NotImplementedError

    def provided_by_base(self, view: TreeView) -> str | None:
        """Why the base already has this layer's capability, or None."""
        raise NotImplementedError

    def missing_capability(self, view: TreeView) -> list[str]:
        """What the capability probe still lacks (empty when it holds)."""
        raise NotImplementedError

    def importable_modules(self, files: list[str]) -> list[str]:
        """Modules to import after applying, where torch is importable."""
        return []

    def change_report(self) -> list[dict]:
        """What each of the layer's changes found at the last plan (layers that report them)."""
        return []


def run_layer(
    layer: Layer, root: Path, check: bool = False, import_check: str = "auto"
) -> LayerResult:
    """Probe, apply and verify ``layer`` on the tree at ``root`` (``check``: write nothing)."""
    result = _run_layer(layer, Path(root), check, import_check)
    result.changes = layer.change_report()
    if result.changes:
        by_status: dict[str, list[str]] = {}
        for finding in result.changes:
            by_status.setdefault(finding["status"], []).append(finding["change"])
        counts = "; ".join(f"{status}: {' '.join(ids)}" for status, ids in by_status.items())
        result.reason = f"{result.reason} [{counts}]"
    return result


def _run_layer(layer: Layer, root: Path, check: bool, import_check: str) -> LayerResult:
    if not (root / "vllm" / "__init__.py").is_file():
        raise LayerSetupError(f"{root}: no vllm/__init__.py here; pass the directory holding vllm/")
    view = TreeView(root)
    refusal: PatchRefused | None = None
    patch_plan: PatchPlan | None = None
    try:
        patch_plan = layer.plan(view)
    except PatchRefused as error:
        refusal = error
    note = f"; {layer.plan_note}" if layer.plan_note else ""
    if patch_plan is not None and patch_plan.outcome == "already-applied":
        missing = layer.missing_capability(view)
        if missing:
            return LayerResult(layer.name, "refused", [], "already applied, yet " + "; ".join(missing))
        return LayerResult(layer.name, "already-applied", [], "every change is already in the tree" + note)
    provided = layer.provided_by_base(view)
    if provided:
        return LayerResult(layer.name, "provided-by-base", [], provided)
    if refusal is not None:
        return LayerResult(layer.name, "refused", [], str(refusal))
    assert patch_plan is not None
    files = patch_plan.files
    patched = view.with_overlay({edit.path: edit.after for edit in patch_plan.edits})
    problems = static_problems(patched, files, baseline=view) + layer.missing_capability(patched)
    if problems:
        return LayerResult(layer.name, "refused", files, "verify failed: " + "; ".join(problems))
    if check:
        return LayerResult(layer.name, "applied", files, "check only: would apply and verify; nothing written")
    exact_patch.write(root, patch_plan)
    notes = "compiled, vLLM imports resolve, capability probe holds" + note
    modules = layer.importable_modules(files)
    if not modules:
        pass
    elif import_check == "off":
        notes += "; module imports not checked (--import-check off)"
    else:
        try:
            failures = import_problems(root, modules,
                                       only_where_torch_imports=import_check != "on")
        except TorchDoesNotImport:
            return LayerResult(layer.name, "applied", files,
                               notes + "; module imports not checked (torch does not import here)")
        if failures:
            _restore(root, patch_plan)
            return LayerResult(layer.name, "refused", files, "verify failed: " + "; ".join(failures))
        notes += f"; {len(modules)} touched modules import"
    return LayerResult(layer.name, "applied", files, notes)


def _restore(root: Path, patch_plan: PatchPlan) -> None:
    reverse = PatchPlan(
        "apply",
        [exact_patch.FileEdit(e.path, e.after, e.before) for e in patch_plan.edits],
    )
    exact_patch.write(root, reverse)
