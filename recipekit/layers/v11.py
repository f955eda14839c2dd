"""Layer v11: the drafter's sliding-window layers get their own KV-cache group on Glm5Next.

Hooks our helper module ``glm5_next_draft_kv`` into the bespoke Glm5Next KV planning
of ``vllm/v1/core/kv_cache_utils.py`` at the seams every planner of it shares (0.30.0
and the fork, whose statements differ): a decorator on the grouping
``_get_kv_cache_groups_glm5_next(vllm_config, kv_cache_spec)``, one on the layout
recogniser ``_glm5_next_tensor_layout(kv_cache_groups)``, and one on every function
that reads that layout, chosen by what the function is (the KV cache config, the
maximum-memory estimate, the pool's bytes per block). No statement of the base is
edited, so the patch is the same whatever the planner's bodies say; a function that
reads the layout and is none of the three is refused, since v11 cannot know how the
drafter's pages count there.
"""

from __future__ import annotations

import ast

import libcst as cst

from recipekit.codepatch import (
    PATCHES_DIR,
    StepLog,
    decorator_gaps,
    dotted,
    ensure_decorator,
    statement,
)
from recipekit.exact_patch import PatchRefused
from recipekit.layers.glm5next import PACKAGE, Glm5NextPatchLayer
from recipekit.tree import TreeView

TARGET = "vllm/v1/core/kv_cache_utils.py"
HELPER = "vllm/v1/core/glm5_next_draft_kv.py"
PLANNING = "vllm/v1/core/kv_cache_planning.py"
LAYOUT = "_glm5_next_tensor_layout"
GROUPING = "_get_kv_cache_groups_glm5_next"

# Seam -> (decorator, the parameters the seam must have).
SEAMS = {
    GROUPING: ("glm5_next_groups_with_draft", ("vllm_config", "kv_cache_spec")),
    LAYOUT: ("glm5_next_layout_past_draft", ("kv_cache_groups",)),
}
# Readers of the layout, by what they compute -> (decorator, parameters they must have).
READERS = {
    "get_kv_cache_config_from_groups": ("kv_cache_config_with_draft", ("vllm_config", "kv_cache_groups", "available_memory")),
    "_max_memory_usage_bytes_from_groups": ("max_memory_with_draft", ("vllm_config", "kv_cache_groups")),
}
BYTES_READER = ("bytes_per_block_with_draft", ("kv_cache_groups",))
DECORATORS = sorted({d for d, _ in [*SEAMS.values(), *READERS.values(), BYTES_READER]})
HELPER_IMPORT = (
    "from vllm.v1.core.glm5_next_draft_kv import (\n"
    + "".join(f"    {name},\n" for name in DECORATORS)
    + ")\n"
)
def _layout_readers(source: str) -> set[str]:
    """Module-level functions whose body calls ``_glm5_next_tensor_layout(...)`` (one ``ast`` pass)."""
    return {
        node.name
        for node in ast.parse(source).body
        if isinstance(node, ast.FunctionDef) and node.name != LAYOUT and any(
            isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id == LAYOUT
            for call in ast.walk(node)
        )
    }


def _role(name: str, readers: set[str]) -> tuple[str, tuple[str, ...]] | None:
    """(decorator, required parameters) for a seam or a reader of the layout, else None."""
    if name in SEAMS:
        return SEAMS[name]
    if name not in readers:
        return None
    if name in READERS:
        return READERS[name]
    if "bytes_per_block" in name:
        return BYTES_READER
    raise PatchRefused(
        f"{TARGET}: {name} reads {LAYOUT}(...) but is not a KV config, maximum-memory or "
        "bytes-per-block function; v11 cannot tell how the drafter's pages count there"
    )


def _wanted_decorators(source: str) -> dict[str, str]:
    """Every seam and layout reader of SOURCE -> the decorator v11 puts on it."""
    wanted = {name: decorator for name, (decorator, _) in {**SEAMS, **READERS}.items()}
    for name in _layout_readers(source):
        if name not in wanted and "bytes_per_block" in name:
            wanted[name] = BYTES_READER[0]
    return wanted


def _parameters(func: cst.FunctionDef) -> list[str]:
    return [param.name.value for param in func.params.params]


class Glm5NextDraftKVGroup(Glm5NextPatchLayer):
    name = "v11"
    target = TARGET
    helper_source = PATCHES_DIR / "v11" / "glm5_next_draft_kv.py"
    helper_target = HELPER

    def rewrite(self, module: cst.Module, log: StepLog) -> cst.Module:
        module = self._ensure_helper_import(module, log)
        functions = {n.name.value: n for n in module.body if isinstance(n, cst.FunctionDef)}
        for seam in SEAMS:
            if seam not in functions:
                raise PatchRefused(f"{TARGET}: function {seam} not found; the base drifted from what v11 patches")
        layout_readers = _layout_readers(self.source_text)
        roles = {name: role for name in functions if (role := _role(name, layout_readers))}
        readers = {name for name in roles if name not in SEAMS}
        for needed in READERS:
            if needed not in readers:
                raise PatchRefused(f"{TARGET}: {needed} does not read {LAYOUT}(...); the base drifted")
        if not any(roles[name] == BYTES_READER for name in readers):
            raise PatchRefused(f"{TARGET}: no bytes-per-block function reads {LAYOUT}(...); the base drifted")
        body = list(module.body)
        for index, node in enumerate(body):
            if isinstance(node, cst.FunctionDef) and node.name.value in roles:
                decorator, wanted = roles[node.name.value]
                have = _parameters(node)
                if [p for p in wanted if p not in have]:
                    raise PatchRefused(
                        f"{TARGET}: {node.name.value}({', '.join(have)}) lacks "
                        f"{', '.join(p for p in wanted if p not in have)}; the base drifted"
                    )
                body[index] = ensure_decorator(node, decorator, log)
        return module.with_changes(body=body)

    def _ensure_helper_import(self, module: cst.Module, log: StepLog) -> cst.Module:
        wanted = statement(HELPER_IMPORT)
        body = list(module.body)
        present = any(node.deep_equals(wanted) for node in body)
        log.record("import the drafter-group helper", present)
        if present:
            return module
        for index, node in enumerate(body):
            if (
                isinstance(node, cst.SimpleStatementLine)
                and isinstance(node.body[0], cst.ImportFrom)
                and dotted(node.body[0].module) == "vllm.v1.kv_cache_interface"
            ):
                body.insert(index + 1, wanted)
                return module.with_changes(body=body)
        raise PatchRefused(f"{TARGET}: `from vllm.v1.kv_cache_interface import ...` not found")

    def missing_capability(self, view: TreeView) -> list[str]:
        return decorator_gaps(view, TARGET, HELPER, _wanted_decorators)

    def provided_by_base(self, view: TreeView) -> str | None:
        utils = view.read_text(TARGET) or ""
        planning = view.read_text(PLANNING)
        if not view.exists(f"{PACKAGE}/__init__.py") or planning is None:
            return None
        if GROUPING in utils or "def _get_packed_kv_cache_groups" not in planning:
            return None
        return (
            f"this base has no bespoke Glm5Next KV grouping to patch: KV planning moved to "
            f"{PLANNING}, whose get_kv_cache_groups packs mixed page sizes block-outermost "
            "(_get_packed_kv_cache_groups), so the drafter's SlidingWindowSpec layers form a "
            "uniform-type group of their own beside MLA, indexer and Mamba pages, laid side "
            "by side in each block (at the attention block size, not v11's quarter block)"
        )


def build(**_: object) -> Glm5NextDraftKVGroup:
    return Glm5NextDraftKVGroup()
