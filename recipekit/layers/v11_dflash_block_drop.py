"""v11's second patcher: DFlash keeps the trailing prefix-cache block that EAGLE drops.

vLLM drops the last cached block of every hit for EAGLE-family drafters (their draft KV at a
position depends on the next token) and backs the KDA checkpoint off one block to match. Before
0.33.0 it does so for ``method: dflash`` too, whose draft KV comes from the target's hidden
states alone: with GLM-5.3-Flash's 2304-token blocks, turn 2 of a conversation loses one block
of its hit (docs/prefix-reuse.md). The helper ``patches/v11/dflash_block_drop.py`` (installed
as ``vllm/config/glm53_dflash_block_drop.py``) says no drop for DFlash; where it is called
depends on the base, found by shape:

- ``SpeculativeConfig.use_eagle_block_drop`` returns ``self.use_eagle() and not
  self.disable_eagle_block_drop`` (0.30.0): that method is decorated with
  ``without_dflash_block_drop``.
- no such method, and the scheduler drops the block whenever ``use_eagle()`` holds (the fork
  shape: ``KVCacheManager(use_eagle=self.use_eagle)`` and the KDA back-off ``if
  self.use_eagle:``): both read ``drops_trailing_block(self.use_eagle, <the speculative
  config>)`` instead.
- ``use_eagle_block_drop`` returns through ``needs_eagle_block_drop``, which leaves DFlash out
  (0.33.0): provided by the base.

Anything else is refused as drift.
"""

from __future__ import annotations

import ast

import libcst as cst

from recipekit.codepatch import (
    PATCHES_DIR,
    StepLog,
    code_of,
    ensure_decorator,
    expression,
    find_class,
    find_method,
    statement,
)
from recipekit.exact_patch import PatchRefused
from recipekit.layers.glm5next import Glm5NextPatchLayer
from recipekit.tree import TreeView

SPEC_FILE = "vllm/config/speculative.py"
SCHEDULER_FILE = "vllm/v1/core/sched/scheduler.py"
HELPER_SOURCE = PATCHES_DIR / "v11" / "dflash_block_drop.py"
HELPER = "vllm/config/glm53_dflash_block_drop.py"
HELPER_MODULE = "vllm.config.glm53_dflash_block_drop"
CONFIG_CLASS = "SpeculativeConfig"
DROP_METHOD = "use_eagle_block_drop"
UPSTREAM_METHOD = "needs_eagle_block_drop"  # 0.33.0's: EAGLE's drop without DFlash
DECORATOR = "without_dflash_block_drop"
STOCK_DROP = "self.use_eagle() and (not self.disable_eagle_block_drop)"  # 0.30.0's, unparsed
SCHEDULER_CLASS = "Scheduler"
SPLIT_METHOD = "_mamba_block_aligned_split"
GATE = "drops_trailing_block"
MANAGER_GATE = f"{GATE}(self.use_eagle, speculative_config)"
SPLIT_GATE = f"{GATE}(self.use_eagle, self.vllm_config.speculative_config)"
# the fork's KDA back-off
BACK_OFF = "last_cache_position = max(last_cache_position - block_size, 0)"


def _parsed_class(view: TreeView, path: str, name: str) -> ast.ClassDef | None:
    text = view.read_text(path)
    if text is None:
        return None
    return next((n for n in ast.parse(text).body
                 if isinstance(n, ast.ClassDef) and n.name == name), None)


def _method(cls: ast.ClassDef | None, name: str) -> ast.FunctionDef | None:
    if cls is None:
        return None
    return next((n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == name), None)


def _returned(method: ast.FunctionDef) -> str | None:
    """The method's one return expression, unparsed (docstring aside), or None."""
    body = [n for n in method.body
            if not (isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant))]
    if len(body) == 1 and isinstance(body[0], ast.Return) and body[0].value is not None:
        return ast.unparse(body[0].value)
    return None


def _is_call_of(node: cst.BaseExpression, wanted: str) -> bool:
    return code_of(node) == wanted


class _SchedulerGates(cst.CSTTransformer):
    """The fork shape's two drop sites in Scheduler: KVCacheManager(use_eagle=...) in __init__ and
    ``if self.use_eagle:`` over the KDA back-off in _mamba_block_aligned_split."""

    def __init__(self) -> None:
        self.method: list[str] = []
        self.manager_sites: list[bool] = []  # per site found: already gated
        self.split_sites: list[bool] = []

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        self.method.append(node.name.value)

    def leave_FunctionDef(self, original: cst.FunctionDef,
                          updated: cst.FunctionDef) -> cst.FunctionDef:
        self.method.pop()
        return updated

    def leave_Call(self, original: cst.Call, updated: cst.Call) -> cst.Call:
        if self.method[-1:] != ["__init__"] or code_of(updated.func) != "KVCacheManager":
            return updated
        args = list(updated.args)
        for index, arg in enumerate(args):
            if arg.keyword is None or arg.keyword.value != "use_eagle":
                continue
            if _is_call_of(arg.value, MANAGER_GATE):
                self.manager_sites.append(True)
            elif code_of(arg.value) == "self.use_eagle":
                self.manager_sites.append(False)
                args[index] = arg.with_changes(value=expression(MANAGER_GATE))
        return updated.with_changes(args=args)

    def leave_If(self, original: cst.If, updated: cst.If) -> cst.If:
        if self.method[-1:] != [SPLIT_METHOD]:
            return updated
        body = updated.body.body
        if not (len(body) == 1 and code_of(body[0]).strip() == BACK_OFF):
            return updated
        if _is_call_of(updated.test, SPLIT_GATE):
            self.split_sites.append(True)
        elif code_of(updated.test) == "self.use_eagle":
            self.split_sites.append(False)
            return updated.with_changes(test=expression(SPLIT_GATE))
        return updated


class DflashBlockDrop(Glm5NextPatchLayer):
    name = "v11_dflash_block_drop"
    helper_source = HELPER_SOURCE
    helper_target = HELPER
    target = SPEC_FILE  # the fork shape's is SCHEDULER_FILE (chosen in base_problem)

    def _shape(self, view: TreeView) -> str:
        """'provided', 'config' (decorate use_eagle_block_drop) or 'scheduler' (the fork shape);
        raises PatchRefused on anything else."""
        cls = _parsed_class(view, SPEC_FILE, CONFIG_CLASS)
        if cls is None:
            raise PatchRefused(f"{SPEC_FILE}: class {CONFIG_CLASS} not found; the base drifted, "
                               "check where vLLM decides EAGLE's trailing-block drop")
        drop = _method(cls, DROP_METHOD)
        if drop is not None:
            returned = _returned(drop) or ""
            upstream = _method(cls, UPSTREAM_METHOD)
            if upstream is not None and f"self.{UPSTREAM_METHOD}()" in returned:
                return "provided"
            decorators = {ast.unparse(d) for d in drop.decorator_list}
            if returned == STOCK_DROP or (DECORATOR in decorators and view.exists(HELPER)):
                return "config"
            raise PatchRefused(
                f"{SPEC_FILE}: {CONFIG_CLASS}.{DROP_METHOD} returns "
                f"{returned or 'something else'!r}, not {STOCK_DROP!r} nor through "
                f"{UPSTREAM_METHOD}(); the base drifted, check whether it still drops DFlash's "
                "trailing block")
        source = view.read_text(SCHEDULER_FILE)
        if source is None:
            raise PatchRefused(f"{SCHEDULER_FILE} is missing; the base drifted")
        gates = _SchedulerGates()
        cst.parse_module(source).visit(gates)
        if len(gates.manager_sites) == 1 and len(gates.split_sites) == 1:
            return "scheduler"
        raise PatchRefused(
            f"{SPEC_FILE}: no {CONFIG_CLASS}.{DROP_METHOD}, and {SCHEDULER_FILE} has "
            f"{len(gates.manager_sites)} KVCacheManager(use_eagle=self.use_eagle) in __init__ and "
            f"{len(gates.split_sites)} 'if self.use_eagle:' KDA back-offs in {SPLIT_METHOD} "
            "(want 1 each); the base drifted, check where it drops EAGLE's trailing block")

    def base_problem(self, view: TreeView) -> str | None:
        problem = super().base_problem(view)
        if problem:
            return problem
        shape = self._shape(view)
        self.target = SCHEDULER_FILE if shape == "scheduler" else SPEC_FILE
        self.plan_note = {"config": f"decorated {CONFIG_CLASS}.{DROP_METHOD}",
                          "scheduler": "gated the scheduler's two EAGLE drop sites "
                                       f"(no {DROP_METHOD} here)",
                          "provided": ""}[shape]
        return None

    def rewrite(self, module: cst.Module, log: StepLog) -> cst.Module:
        if self.target == SCHEDULER_FILE:
            gates = _SchedulerGates()
            module = module.visit(gates)
            log.record("KVCacheManager's use_eagle asks drops_trailing_block",
                       gates.manager_sites == [True])
            log.record("the KDA back-off asks drops_trailing_block", gates.split_sites == [True])
            return _with_import(module, GATE, log)
        cls = find_class(module, CONFIG_CLASS, SPEC_FILE)
        method = find_method(cls, DROP_METHOD, SPEC_FILE)
        decorated = ensure_decorator(method, DECORATOR, log)
        new_cls = cls.with_changes(body=cls.body.with_changes(
            body=[decorated if node is method else node for node in cls.body.body]))
        module = module.with_changes(
            body=[new_cls if node is cls else node for node in module.body])
        return _with_import(module, DECORATOR, log)

    def provided_by_base(self, view: TreeView) -> str | None:
        try:
            shape = self._shape(view)
        except PatchRefused:
            return None
        if shape != "provided":
            return None
        return (f"{SPEC_FILE}: {CONFIG_CLASS}.{DROP_METHOD} returns through {UPSTREAM_METHOD}(), "
                "which gives DFlash no trailing-block drop (vLLM 0.33.0's shape)")

    def missing_capability(self, view: TreeView) -> list[str]:
        if self.provided_by_base(view):
            return []
        problems = [] if view.exists(HELPER) else [f"{HELPER} is missing"]
        drop = _method(_parsed_class(view, SPEC_FILE, CONFIG_CLASS), DROP_METHOD)
        if drop is not None:
            if DECORATOR not in {ast.unparse(d) for d in drop.decorator_list}:
                problems.append(f"{SPEC_FILE}: {CONFIG_CLASS}.{DROP_METHOD} is not decorated "
                                f"with {DECORATOR}")
            return problems
        gates = _SchedulerGates()
        cst.parse_module(view.read_text(SCHEDULER_FILE) or "").visit(gates)
        if gates.manager_sites != [True] or gates.split_sites != [True]:
            problems.append(f"{SCHEDULER_FILE}: the EAGLE drop sites do not both ask {GATE}")
        return problems


def _with_import(module: cst.Module, name: str, log: StepLog) -> cst.Module:
    """MODULE with ``from <helper> import NAME`` after its last top-level import above its first
    class or function (a decorator must be imported before the class body runs)."""
    wanted = statement(f"from {HELPER_MODULE} import {name}\n")
    body = list(module.body)
    present = any(node.deep_equals(wanted) for node in body)
    log.record(f"import {name}", present)
    if present:
        return module
    first_definition = next((i for i, n in enumerate(body)
                             if isinstance(n, (cst.ClassDef, cst.FunctionDef))), len(body))
    last_import = max(i for i, n in enumerate(body[:first_definition])
                      if isinstance(n, cst.SimpleStatementLine)
                      and isinstance(n.body[0], (cst.Import, cst.ImportFrom)))
    body.insert(last_import + 1, wanted)
    return module.with_changes(body=body)


def build(**_: object) -> DflashBlockDrop:
    return DflashBlockDrop()
