"""Layer v9: DFlash2 speculative decoding (vLLM PR #52816) backported as an exact-context diff.

The diff is a build artifact of ``scripts/make-backport``; this layer only takes it
from a file whose sha256 equals the manifest's pin, or generates it from the pinned
releases when no file is given.
"""

from __future__ import annotations

import ast
from pathlib import Path

from recipekit import exact_patch
from recipekit.backport import MANIFEST, generate, load_manifest, sha256_text
from recipekit.layers import Layer, LayerSetupError
from recipekit.tree import TreeView
from recipekit.verify import ImportChecker
from recipekit.vllm_sources import release_tree

REGISTRY = "vllm/model_executor/models/registry.py"
SPECULATOR_CHOICE = "vllm/v1/worker/gpu/spec_decode/__init__.py"
ARCHITECTURE = "DFlash2DraftModel"
SPECULATOR = "DFlash2Speculator"


def _registry_problem(view: TreeView) -> str | None:
    source = view.read_text(REGISTRY)
    if source is None:
        return f"{REGISTRY} is missing"
    checker = ImportChecker(view)
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Dict):
            continue
        for key, value in zip(node.keys, node.values):
            if not (isinstance(key, ast.Constant) and key.value == ARCHITECTURE):
                continue
            if not (isinstance(value, ast.Tuple) and len(value.elts) == 2):
                return f"{REGISTRY}: {ARCHITECTURE} maps to something other than (module, class)"
            module, cls = (getattr(e, "value", None) for e in value.elts)
            dotted = module if "." in module else f"vllm.model_executor.models.{module}"
            if not checker.defines(dotted, cls):
                return f"{REGISTRY}: {ARCHITECTURE} maps to {dotted}.{cls}, which the tree lacks"
            return None
    return f"{REGISTRY}: the registry does not map {ARCHITECTURE}"


def _speculator_problem(view: TreeView) -> str | None:
    source = view.read_text(SPECULATOR_CHOICE)
    if source is None:
        return f"{SPECULATOR_CHOICE} is missing"
    checker = ImportChecker(view)
    for branch in ast.walk(ast.parse(source)):
        if not (isinstance(branch, ast.If) and ARCHITECTURE in ast.unparse(branch.test)):
            continue
        for node in ast.walk(ast.Module(body=branch.body, type_ignores=[])):
            if isinstance(node, ast.ImportFrom) and any(a.name == SPECULATOR for a in node.names):
                if checker.defines(node.module, SPECULATOR):
                    return None
                return f"{SPECULATOR_CHOICE}: {node.module} defines no {SPECULATOR}"
    return f"{SPECULATOR_CHOICE}: the speculator choice never reaches {SPECULATOR}"


class DFlash2Backport(Layer):
    name = "v9"

    def __init__(self, diff_file: Path | None = None, manifest_file: Path = MANIFEST) -> None:
        self.manifest = load_manifest(manifest_file)
        self.diff_file = diff_file
        self._diff: str | None = None

    def diff_text(self) -> str:
        if self._diff is None:
            pinned = self.manifest.get("diff_sha256")
            if self.diff_file is not None:
                try:
                    text = Path(self.diff_file).read_text(encoding="utf-8")
                except OSError as error:
                    raise LayerSetupError(f"{self.diff_file}: cannot read the diff: {error.strerror}")
            else:
                text = generate(
                    release_tree(self.manifest["base"]),
                    release_tree(self.manifest["source"]),
                    self.manifest,
                )
            digest = sha256_text(text)
            if digest != pinned:
                origin = self.diff_file or "the generated diff"
                raise LayerSetupError(
                    f"{origin}: sha256 {digest} is not the pinned {pinned}; "
                    "regenerate it with scripts/make-backport"
                )
            self._diff = text
        return self._diff

    def plan(self, view: TreeView) -> exact_patch.PatchPlan:
        return exact_patch.plan(view.root, self.diff_text())

    def missing_capability(self, view: TreeView) -> list[str]:
        return [p for p in (_registry_problem(view), _speculator_problem(view)) if p]

    def provided_by_base(self, view: TreeView) -> str | None:
        if self.missing_capability(view):
            return None
        return (
            f"the base already maps {ARCHITECTURE} in its registry and its speculator "
            f"choice reaches {SPECULATOR}"
        )

    def importable_modules(self, files: list[str]) -> list[str]:
        wanted = (
            "vllm/model_executor/models/qwen3_dflash2.py",
            "vllm/v1/worker/gpu/spec_decode/dflash2/speculator.py",
        )
        return [f[:-3].replace("/", ".") for f in files if f in wanted]


def build(diff_file: Path | None = None, **_: object) -> Layer:
    return DFlash2Backport(diff_file=diff_file)
