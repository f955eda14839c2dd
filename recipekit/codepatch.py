"""Syntax-tree patch layers: find targets by qualified name and statement shape.

A code-patch layer rewrites one vLLM file with LibCST and installs a helper module of
ours beside it. Every change is an "ensure" step that reports ``present`` (the tree
already has it) or ``applied`` (the rewrite adds it); a missing anchor raises
PatchRefused with one line. All steps present means already applied; a mix of present
and applied means a partly patched tree, which is refused rather than completed.
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from pathlib import Path

import libcst as cst

from recipekit.exact_patch import FileEdit, PatchPlan, PatchRefused
from recipekit.layer import Layer
from recipekit.tree import TreeView

PATCHES_DIR = Path(__file__).resolve().parent.parent / "patches"


class StepLog:
    """Records what each ensure-step found, by step name."""

    def __init__(self) -> None:
        self.steps: dict[str, str] = {}

    def record(self, name: str, present: bool) -> None:
        self.steps[name] = "present" if present else "applied"


def statement(code: str) -> cst.BaseStatement:
    return cst.parse_statement(code)


def expression(code: str) -> cst.BaseExpression:
    return cst.parse_expression(code)


def dotted(node: cst.BaseExpression | None) -> str:
    """``a.b.c`` for a Name/Attribute chain, else an empty string."""
    if isinstance(node, cst.Name):
        return node.value
    if isinstance(node, cst.Attribute):
        left = dotted(node.value)
        return f"{left}.{node.attr.value}" if left else ""
    return ""


def replace_top_level(module: cst.Module, old: cst.CSTNode, new: cst.CSTNode) -> cst.Module:
    """``module`` with its top-level statement ``old`` (by identity) replaced by ``new``.

    The same result as ``module.deep_replace(old, new)`` for a top-level node, without a
    walk over the whole tree (each such walk of a large vLLM file costs about 0.4 s).
    """
    if not any(node is old for node in module.body):
        raise ValueError("replace_top_level: the node is not a top-level statement of the module")
    return module.with_changes(body=[new if node is old else node for node in module.body])


def code_of(node: cst.CSTNode) -> str:
    return cst.Module(body=[]).code_for_node(node)


def find_class(module: cst.Module, name: str, target: str) -> cst.ClassDef:
    for node in module.body:
        if isinstance(node, cst.ClassDef) and node.name.value == name:
            return node
    raise PatchRefused(f"{target}: class {name} not found; the base drifted from what this layer patches")


def find_method(cls: cst.ClassDef, name: str, target: str) -> cst.FunctionDef:
    for node in cls.body.body:
        if isinstance(node, cst.FunctionDef) and node.name.value == name:
            return node
    raise PatchRefused(f"{target}: method {cls.name.value}.{name} not found; the base drifted")


def ensure_base(cls: cst.ClassDef, base: str, log: StepLog, step: str) -> cst.ClassDef:
    """``cls`` with ``base`` among its bases (appended last)."""
    present = any(dotted(arg.value) == base for arg in cls.bases)
    log.record(step, present)
    if present:
        return cls
    bases = list(cls.bases)
    if bases:
        bases[-1] = bases[-1].with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
    bases.append(cst.Arg(value=cst.Name(base)))
    return cls.with_changes(bases=bases)


def ensure_decorator(func: cst.FunctionDef, decorator: str, log: StepLog) -> cst.FunctionDef:
    """``func`` with ``@decorator`` (appended last)."""
    present = any(dotted(d.decorator) == decorator for d in func.decorators)
    log.record(f"{func.name.value} is decorated with {decorator}", present)
    if present:
        return func
    return func.with_changes(decorators=[*func.decorators, cst.Decorator(decorator=cst.Name(decorator))])


def decorator_gaps(view: TreeView, target: str, helper: str,
                   wanted: Callable[[str], dict[str, str]]) -> list[str]:
    """What a patch made of decorators on TARGET's top-level functions, and of a HELPER module,
    lacks in VIEW: TARGET itself, each function WANTED(TARGET's source) maps to a decorator
    that it does not carry, then HELPER."""
    source = view.read_text(target)
    if source is None:
        return [f"{target} is missing"]
    functions = {n.name: n for n in ast.parse(source).body if isinstance(n, ast.FunctionDef)}
    problems = [f"{target}: {name} is not decorated with {decorator}"
                for name, decorator in wanted(source).items()
                if name not in functions
                or decorator not in {ast.unparse(d) for d in functions[name].decorator_list}]
    if not view.exists(helper):
        problems.append(f"{helper} is missing")
    return problems


def ensure_import_names(
    module: cst.Module, from_module: str, names: list[str], log: StepLog, step: str, target: str
) -> cst.Module:
    """Add ``names`` to the existing ``from from_module import ...`` statement."""
    for line in module.body:
        if not isinstance(line, cst.SimpleStatementLine):
            continue
        for small in line.body:
            if isinstance(small, cst.ImportFrom) and dotted(small.module) == from_module and not small.relative:
                if isinstance(small.names, cst.ImportStar):
                    continue
                have = {alias.name.value for alias in small.names}
                missing = [name for name in names if name not in have]
                log.record(step, not missing)
                if not missing:
                    return module
                aliases = list(small.names) + [cst.ImportAlias(name=cst.Name(n)) for n in missing]
                aliases = sorted(aliases, key=lambda alias: alias.name.value)
                fixed = [a.with_changes(comma=cst.MaybeSentinel.DEFAULT) for a in aliases]
                new_import = small.with_changes(
                    names=fixed,
                    lpar=cst.LeftParen(),
                    rpar=cst.RightParen(),
                )
                new_line = line.with_changes(body=[new_import])
                return replace_top_level(module, line, cst.parse_statement(code_of_formatted(new_line)))
    raise PatchRefused(f"{target}: `from {from_module} import ...` not found; the base drifted")


def code_of_formatted(line: cst.SimpleStatementLine) -> str:
    """One ``from x import (a, b)`` line laid out one name per line, as vLLM writes them."""
    small = line.body[0]
    assert isinstance(small, cst.ImportFrom)
    names = ",\n".join(f"    {alias.name.value}" for alias in small.names)
    return f"from {dotted(small.module)} import (\n{names},\n)\n"


def ensure_relative_import(
    module: cst.Module, after_module: str, new_line: str, log: StepLog, step: str, target: str
) -> cst.Module:
    """Insert ``new_line`` after the ``from .after_module import ...`` statement."""
    wanted = cst.parse_statement(new_line)
    body = list(module.body)
    if any(node.deep_equals(wanted) for node in body):
        log.record(step, True)
        return module
    for index, node in enumerate(body):
        if isinstance(node, cst.SimpleStatementLine):
            small = node.body[0]
            if (
                isinstance(small, cst.ImportFrom)
                and len(small.relative) == 1
                and dotted(small.module) == after_module
            ):
                log.record(step, False)
                body.insert(index + 1, wanted)
                return module.with_changes(body=body)
    raise PatchRefused(f"{target}: `from .{after_module} import ...` not found; the base drifted")


class CodePatchLayer(Layer):
    """A layer that rewrites one file and installs one helper module beside it."""

    target = ""
    helper_source: Path = PATCHES_DIR
    helper_target = ""
    source_text = ""

    def base_problem(self, view: TreeView) -> str | None:
        """Why this base cannot take the layer at all (refusal reason), or None."""
        raise NotImplementedError

    def rewrite(self, module: cst.Module, log: StepLog) -> cst.Module:
        raise NotImplementedError

    def plan(self, view: TreeView) -> PatchPlan:
        problem = self.base_problem(view)
        if problem:
            raise PatchRefused(problem)
        source = view.read_text(self.target)
        if source is None:
            raise PatchRefused(f"{self.target} is missing; this base does not have the expected layout")
        log = StepLog()
        self.source_text = source  # what rewrite() sees, for patchers that also read it with ast
        try:
            module = cst.parse_module(source)
        except cst.ParserSyntaxError as error:
            raise PatchRefused(f"{self.target}: does not parse: {error.message}") from None
        new_source = self.rewrite(module, log).code
        helper = self.helper_source.read_text(encoding="utf-8")
        installed = view.read_text(self.helper_target)
        if installed is not None and installed != helper:
            raise PatchRefused(
                f"{self.helper_target} exists with other content; start from an unpatched base"
            )
        log.record("install helper", installed is not None)
        applied = sorted(name for name, state in log.steps.items() if state == "applied")
        present = sorted(name for name, state in log.steps.items() if state == "present")
        if not applied:
            return PatchPlan("already-applied", [])
        if present:
            raise PatchRefused(
                f"{self.target}: partly patched (present: {', '.join(present)}; "
                f"missing: {', '.join(applied)}); start from an unpatched base"
            )
        return PatchPlan(
            "apply",
            [
                FileEdit(self.target, source.encode(), new_source.encode()),
                FileEdit(self.helper_target, None, helper.encode()),
            ],
        )

    def importable_modules(self, files: list[str]) -> list[str]:
        return [f[:-3].replace("/", ".") for f in files if f.endswith(".py")]
