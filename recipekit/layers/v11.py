"""Layer v11: the drafter's sliding-window layers get their own KV-cache group on Glm5Next.

Wires our helper module ``glm5_next_draft_kv`` into the bespoke Glm5Next KV planning
of ``vllm/v1/core/kv_cache_utils.py``: the grouping sets the drafter's specs aside
and appends their group, the layout recogniser looks past that group, and the pool's
bytes per block, tensor layout and maximum-memory estimate count the drafter's pages.
"""

from __future__ import annotations

import ast
from collections.abc import Callable

import libcst as cst

from recipekit.codepatch import (
    PATCHES_DIR,
    StepLog,
    code_of,
    dotted,
    expression,
    statement,
)
from recipekit.exact_patch import PatchRefused
from recipekit.layers.glm5next import PACKAGE, Glm5NextPatchLayer
from recipekit.tree import TreeView

TARGET = "vllm/v1/core/kv_cache_utils.py"
HELPER = "vllm/v1/core/glm5_next_draft_kv.py"
PLANNING = "vllm/v1/core/kv_cache_planning.py"

POOL_BYTES = "len(mla_names) * mla_page + len(idx_names) * idx_page"
POOL_BYTES_WITH_DRAFT = f"{POOL_BYTES} + draft_bytes_per_block(kv_cache_groups)"
HELPER_IMPORT = (
    "from vllm.v1.core.glm5_next_draft_kv import (\n"
    "    draft_bytes_per_block,\n"
    "    draft_kv_cache_tensors,\n"
    "    draft_max_pages,\n"
    "    split_draft_specs,\n"
    "    with_draft_group,\n"
    "    without_draft_groups,\n"
    ")\n"
)


def _function(module: cst.Module, name: str) -> cst.FunctionDef:
    for node in module.body:
        if isinstance(node, cst.FunctionDef) and node.name.value == name:
            return node
    raise PatchRefused(f"{TARGET}: function {name} not found; the base drifted from what v11 patches")


def _without_parens(node: cst.BaseExpression) -> str:
    return code_of(node.with_changes(lpar=[], rpar=[])).strip()


class _ExtendExpression(cst.CSTTransformer):
    """Replace every occurrence of one expression (ignoring its parentheses)."""

    def __init__(self, old: str, new: str) -> None:
        self.old, self.new, self.count = old, new, 0

    def leave_BinaryOperation(self, original, updated):
        if _without_parens(updated) != self.old:
            return updated
        self.count += 1
        return expression(self.new).with_changes(lpar=updated.lpar, rpar=updated.rpar)


class _InsertBefore(cst.CSTTransformer):
    """Insert ``new`` before each statement of an indented block that ``match`` picks."""

    def __init__(self, match: Callable[[cst.BaseStatement], bool], new: cst.BaseStatement) -> None:
        self.match, self.new, self.count = match, new, 0

    def leave_IndentedBlock(self, original, updated):
        body = []
        for node in updated.body:
            if self.match(node):
                self.count += 1
                body.append(self.new)
            body.append(node)
        return updated.with_changes(body=body)


def _docstring_end(body: list[cst.BaseStatement]) -> int:
    first = body[0] if body else None
    if (
        isinstance(first, cst.SimpleStatementLine)
        and isinstance(first.body[0], cst.Expr)
        and isinstance(first.body[0].value, (cst.SimpleString, cst.ConcatenatedString))
    ):
        return 1
    return 0


def _ensure_first_statement(func: cst.FunctionDef, code: str, log: StepLog, step: str) -> cst.FunctionDef:
    wanted = statement(code)
    body = list(func.body.body)
    at = _docstring_end(body)
    present = at < len(body) and body[at].deep_equals(wanted)
    log.record(step, present)
    if not present:
        body.insert(at, wanted)
    return func.with_changes(body=func.body.with_changes(body=body))


def _ensure_pool_bytes(func: cst.FunctionDef, log: StepLog, step: str) -> cst.FunctionDef:
    source = code_of(func)
    present = POOL_BYTES_WITH_DRAFT in source
    log.record(step, present)
    if present:
        return func
    editor = _ExtendExpression(POOL_BYTES, POOL_BYTES_WITH_DRAFT)
    func = func.visit(editor)
    if editor.count != 1:
        raise PatchRefused(
            f"{TARGET}: {func.name.value}: expected `{POOL_BYTES}` once, found it {editor.count} times"
        )
    return func


def _ensure_before(
    func: cst.FunctionDef, match: Callable[[cst.BaseStatement], bool], code: str,
    log: StepLog, step: str, anchor: str,
) -> cst.FunctionDef:
    wanted = statement(code)
    present = code_of(wanted).strip() in code_of(func)
    log.record(step, present)
    if present:
        return func
    editor = _InsertBefore(match, wanted)
    branch = _glm5_branch(func)
    func = func.deep_replace(branch, branch.visit(editor))
    if editor.count != 1:
        raise PatchRefused(f"{TARGET}: {func.name.value}: expected one `{anchor}`, found {editor.count}")
    return func


def _glm5_branch(func: cst.FunctionDef) -> cst.If:
    """The ``if (glm5_layout := _glm5_next_tensor_layout(...)) is not None:`` block."""
    for node in func.body.body:
        if isinstance(node, cst.If) and "_glm5_next_tensor_layout(" in code_of(node.test):
            return node
    raise PatchRefused(f"{TARGET}: {func.name.value}: the Glm5Next layout branch not found")


def _returns(prefix: str) -> Callable[[cst.BaseStatement], bool]:
    def match(node: cst.BaseStatement) -> bool:
        return (
            isinstance(node, cst.SimpleStatementLine)
            and isinstance(node.body[0], cst.Return)
            and code_of(node).strip().startswith(prefix)
        )

    return match


def _rewrite_grouping(func: cst.FunctionDef, log: StepLog) -> cst.FunctionDef:
    func = _ensure_first_statement(
        func, "kv_cache_spec, draft_specs = split_draft_specs(kv_cache_spec)\n",
        log, "set the drafter's specs aside",
    )
    body = list(func.body.body)
    last = body[-1]
    if not (isinstance(last, cst.SimpleStatementLine) and isinstance(last.body[0], cst.Return)):
        raise PatchRefused(f"{TARGET}: _get_kv_cache_groups_glm5_next does not end with a return")
    value = last.body[0].value
    wrapped = isinstance(value, cst.Call) and dotted(value.func) == "with_draft_group"
    log.record("append the drafter's group", wrapped)
    if wrapped:
        return func
    if value is None or "KVCacheGroupSpec(list(attn_specs), uniform_spec)" not in code_of(value):
        raise PatchRefused(
            f"{TARGET}: _get_kv_cache_groups_glm5_next's last return no longer builds the "
            "attention group first; the base drifted"
        )
    assign = cst.SimpleStatementLine(
        body=[cst.Assign(targets=[cst.AssignTarget(cst.Name("groups"))], value=value)],
        leading_lines=last.leading_lines,
    )
    body[-1:] = [assign, statement("return with_draft_group(groups, draft_specs)\n")]
    return func.with_changes(body=func.body.with_changes(body=body))


class Glm5NextDraftKVGroup(Glm5NextPatchLayer):
    name = "v11"
    target = TARGET
    helper_source = PATCHES_DIR / "v11" / "glm5_next_draft_kv.py"
    helper_target = HELPER

    def rewrite(self, module: cst.Module, log: StepLog) -> cst.Module:
        module = self._ensure_helper_import(module, log)
        edits = {
            "_get_kv_cache_groups_glm5_next": lambda f: _rewrite_grouping(f, log),
            "_glm5_next_tensor_layout": lambda f: _ensure_first_statement(
                f, "kv_cache_groups = without_draft_groups(kv_cache_groups)\n",
                log, "layout looks past the drafter's group",
            ),
            "_get_kv_cache_bytes_per_block": lambda f: _ensure_pool_bytes(
                f, log, "bytes per block count the drafter",
            ),
            "get_kv_cache_config_from_groups": lambda f: _ensure_before(
                _ensure_pool_bytes(f, log, "pool size counts the drafter"),
                _returns("return KVCacheConfig("),
                "kv_cache_tensors += draft_kv_cache_tensors(kv_cache_groups, num_blocks, size, "
                "idx_base + len(idx_names) * idx_page * num_blocks)\n",
                log, "one tensor per drafter layer", "return KVCacheConfig(...) in the Glm5Next branch",
            ),
            "_max_memory_usage_bytes_from_groups": lambda f: _ensure_before(
                _ensure_pool_bytes(f, log, "max-memory bytes count the drafter"),
                _returns("return total_blocks * ("),
                "total_blocks += draft_max_pages(vllm_config, kv_cache_groups)\n",
                log, "max-memory pages count the drafter", "return total_blocks * (...)",
            ),
        }
        for name, edit in edits.items():
            original = _function(module, name)
            module = module.deep_replace(original, edit(original))
        return module

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
        source = view.read_text(TARGET)
        if source is None:
            return [f"{TARGET} is missing"]
        functions = {
            node.name: ast.unparse(node)
            for node in ast.parse(source).body
            if isinstance(node, ast.FunctionDef)
        }
        wanted = {
            "_get_kv_cache_groups_glm5_next": "with_draft_group(",
            "_glm5_next_tensor_layout": "without_draft_groups(",
            "_get_kv_cache_bytes_per_block": "draft_bytes_per_block(",
            "get_kv_cache_config_from_groups": "draft_kv_cache_tensors(",
            "_max_memory_usage_bytes_from_groups": "draft_max_pages(",
        }
        return [
            f"{TARGET}: {name} does not call {call[:-1]}"
            for name, call in wanted.items()
            if call not in functions.get(name, "")
        ]

    def provided_by_base(self, view: TreeView) -> str | None:
        utils = view.read_text(TARGET) or ""
        planning = view.read_text(PLANNING)
        if not view.exists(f"{PACKAGE}/__init__.py") or planning is None:
            return None
        if "_get_kv_cache_groups_glm5_next" in utils or "def _get_packed_kv_cache_groups" not in planning:
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
