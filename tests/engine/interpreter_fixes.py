"""Three fixes that let vLLM's V2 model runner (which DFlash2 needs) run on CPU with PyPI's
`triton` in interpreter mode (TRITON_INTERPRET=1), and a fourth that makes the interpreter
cheaper, each found by shape with LibCST.

- `vllm/triton_utils/importing.py`: vLLM on CPU turns Triton off unless Triton has a CPU
  backend (triton-cpu, which is not on PyPI); the interpreter runs the kernels on numpy,
  so when TRITON_INTERPRET=1 the module's HAS_TRITON is set from triton being importable.
- `triton/runtime/interpreter.py` (Triton 3.9): a mask made by `&` of a block of bools and
  a scalar bool reaches the interpreter's masked load and store as an integer array, which
  they refuse ("mask has unsupported dtype"; DFlash2's selector walk does `mask & valid`);
  the mask is cast to bool there.
- `triton/runtime/interpreter.py` (Triton 3.9): `triton.language.extra.libdevice`'s
  functions are stubs returning None that a compiler backend replaces, and the interpreter
  patches only `triton.language` and its `math` module, so a kernel calling one (vLLM's
  Gumbel sampling: `-tl.log(-tldevice.log1p(-u))`, any temperature > 0 request) fails
  ("bad operand type for unary -: 'NoneType'"); `_patch_lang` then also maps the libdevice
  functions vLLM's kernels call to numpy.
- `triton/runtime/interpreter.py` (Triton 3.9), for speed alone: every call of a
  `@triton.jit` function from inside a running kernel patches `triton.language` again
  (`InterpretedFunction.__call__`), listing every member of its modules with
  `inspect.getmembers` (15% of a DFlash2 sampling engine's CPU, py-spy). While a grid runs
  its modules are patched already, and patching them again sets only fresh copies of the same
  stateless functions (the builtins were swapped the first time), so the call skips it when
  every language module the function sees carries the running grid's mark (set through the
  grid's patch scope, so it goes when the scope is restored); otherwise it patches as before.

Each fix is an "ensure": `present` when the file already has it, `applied` when written
(through a temporary file and a rename, so a hard-linked original is never changed), and
FixRefused with one line when the shape it expects is not found exactly once (a file with a
fix half there is refused too).
"""

from __future__ import annotations

import os
from pathlib import Path

import libcst as cst
import libcst.matchers as m

INTERPRET_GUARD = 'os.environ.get("TRITON_INTERPRET") == "1"'


class FixRefused(RuntimeError):
    """The file does not have the shape the fix was written for; the message says what."""


def _write(path: Path, code: str) -> None:
    staging = path.with_name(f".{path.name}.fix")
    staging.write_text(code)
    os.replace(staging, path)


def _has_import(module: cst.Module, matcher: m.BaseMatcherNode) -> bool:
    return any(m.matches(stmt, m.SimpleStatementLine(body=[matcher])) for stmt in module.body)


def _function(body, name: str) -> list[int]:
    """The indexes of BODY's module-level `def NAME`."""
    return [i for i, node in enumerate(body) if isinstance(node, cst.FunctionDef)
            and node.name.value == name]


def _require_imports(path: Path, module: cst.Module, needs: dict[str, m.BaseMatcherNode]) -> None:
    """FixRefused naming the first of NEEDS ({import line: its matcher}) the module lacks."""
    for what, matcher in needs.items():
        if not _has_import(module, matcher):
            raise FixRefused(f"{path}: no module-level `{what}`; the file moved, re-check the fix")


# `import triton.language as tl`, which the libdevice and patch-once fixes' code calls
_TL_IMPORT = m.Import(names=[m.ImportAlias(
    name=m.Attribute(value=m.Name("triton"), attr=m.Name("language")),
    asname=m.AsName(name=m.Name("tl")))])


def ensure_has_triton_under_interpreter(path: Path) -> str:
    """After the module-level `if HAS_TRITON:` block, let TRITON_INTERPRET=1 turn it on."""
    module = cst.parse_module(path.read_text())
    guard = cst.parse_expression(INTERPRET_GUARD)
    if any(isinstance(stmt, cst.If) and stmt.test.deep_equals(guard) for stmt in module.body):
        return "present"
    needs = {
        "import os": m.Import(names=[m.ImportAlias(name=m.Name("os"))]),
        "from importlib.util import find_spec": m.ImportFrom(
            module=m.Attribute(value=m.Name("importlib"), attr=m.Name("util")),
            names=[m.ZeroOrMore(), m.ImportAlias(name=m.Name("find_spec")), m.ZeroOrMore()]),
    }
    _require_imports(path, module, needs)
    assigned = [stmt for stmt in module.body if m.matches(stmt, m.SimpleStatementLine(
        body=[m.Assign(targets=[m.AssignTarget(target=m.Name("HAS_TRITON"))])]))]
    gates = [i for i, stmt in enumerate(module.body)
             if m.matches(stmt, m.If(test=m.Name("HAS_TRITON")))]
    if len(assigned) != 1 or len(gates) != 1:
        raise FixRefused(f"{path}: expected one module-level `HAS_TRITON = ...` and one "
                         f"`if HAS_TRITON:`, found {len(assigned)} and {len(gates)}; the file "
                         f"moved, re-check the fix")
    fix = cst.parse_statement(
        "\n# TRITON_INTERPRET=1 runs Triton kernels on numpy: no GPU or triton-cpu needed\n"
        f"if {INTERPRET_GUARD}:\n"
        '    HAS_TRITON = find_spec("triton") is not None\n')
    body = list(module.body)
    body.insert(gates[0] + 1, fix)
    _write(path, module.with_changes(body=body).code)
    return "applied"


_MASKED_OPS = {
    # method of InterpreterBuilder -> (callee, index of the mask argument)
    "create_masked_load": ("load", 1),
    "create_masked_store": ("store", 2),
}


class _CastMask(cst.CSTTransformer):
    def __init__(self, method: str, callee: str, index: int) -> None:
        self.method, self.callee, self.index = method, callee, index
        self.inside = 0
        self.found: list[str] = []

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        if node.name.value == self.method:
            self.inside += 1

    def leave_FunctionDef(self, original: cst.FunctionDef, updated: cst.FunctionDef):
        if original.name.value == self.method:
            self.inside -= 1
        return updated

    def leave_Call(self, original: cst.Call, updated: cst.Call) -> cst.Call:
        if not self.inside or not m.matches(updated.func, m.Attribute(
                value=m.Name("_interpreter"), attr=m.Name(self.callee))):
            return updated
        if len(updated.args) <= self.index:
            self.found.append("short")
            return updated
        arg = updated.args[self.index].value
        plain = m.Attribute(value=m.Name("mask"), attr=m.Name("data"))
        cast = m.Call(func=m.Attribute(value=plain, attr=m.Name("astype")),
                      args=[m.Arg(value=m.Name("bool"))])
        if m.matches(arg, cast):
            self.found.append("present")
            return updated
        if not m.matches(arg, plain):
            self.found.append("other")
            return updated
        self.found.append("applied")
        args = list(updated.args)
        args[self.index] = args[self.index].with_changes(
            value=cst.parse_expression("mask.data.astype(bool)"))
        return updated.with_changes(args=args)


def ensure_interpreter_bool_masks(path: Path) -> str:
    """In InterpreterBuilder.create_masked_load/store, pass `mask.data.astype(bool)`."""
    module = cst.parse_module(path.read_text())
    builders = [node for node in module.body if m.matches(node, m.ClassDef(
        name=m.Name("InterpreterBuilder")))]
    if len(builders) != 1:
        raise FixRefused(f"{path}: expected one class InterpreterBuilder, found "
                         f"{len(builders)}; the file moved, re-check the fix")
    builder = builders[0]
    outcomes = []
    for method, (callee, index) in _MASKED_OPS.items():
        cast = _CastMask(method, callee, index)
        builder = builder.visit(cast)
        if cast.found not in (["applied"], ["present"]):
            raise FixRefused(f"{path}: InterpreterBuilder.{method} should call "
                             f"_interpreter.{callee}(..., mask.data, ...) once, found "
                             f"{cast.found or 'no call'}; the file moved, re-check the fix")
        outcomes.extend(cast.found)
    if set(outcomes) == {"present"}:
        return "present"
    if "present" in outcomes:
        raise FixRefused(f"{path}: one masked op is cast and the other not; a partly fixed "
                         f"file is refused, reinstall triton")
    body = [builder if node is builders[0] else node for node in module.body]
    _write(path, module.with_changes(body=body).code)
    return "applied"



# What _patch_libdevice maps (the libdevice functions vLLM 0.27.1 and 0.28.0 call), each as
# libdevice defines it: round is half away from zero (C's round), fast_ ones the plain ones.
_LIBDEVICE_FIX = """
_LIBDEVICE_ON_NUMPY = {
    "log1p": np.log1p,
    "exp": np.exp,
    "fast_expf": np.exp,
    "fast_logf": np.log,
    "fast_log2f": np.log2,
    "erf": lambda x: np.vectorize(math.erf, otypes=[x.dtype])(x),
    "round": lambda x: np.copysign(np.floor(np.abs(x) + 0.5), x),
    "isnan": np.isnan,
}


def _patch_libdevice(scope):
    \"\"\"libdevice's functions are stubs a compiler backend replaces: here, numpy.\"\"\"
    from triton.language.extra import libdevice

    def on_numpy(function):
        def call(arg0, **_):
            data = function(arg0.handle.data)
            dtype = tl.int1 if data.dtype == np.bool_ else arg0.handle.dtype
            ty = arg0.type.with_element_ty(dtype) if arg0.type.is_block() else dtype
            return tl.tensor(TensorHandle(data, dtype), ty)
        return call

    for name, function in _LIBDEVICE_ON_NUMPY.items():
        scope.set_attr(libdevice, name, on_numpy(function))
"""

def ensure_interpreter_libdevice(path: Path) -> str:
    """A module-level `_patch_libdevice(scope)` before `_patch_lang`, which calls it last."""
    module = cst.parse_module(path.read_text())
    names = [node.name.value for node in module.body if isinstance(node, cst.FunctionDef)]
    patch_langs = _function(module.body, "_patch_lang")
    if len(patch_langs) != 1:
        raise FixRefused(f"{path}: expected one module-level def _patch_lang, found "
                         f"{len(patch_langs)}; the file moved, re-check the fix")
    at = patch_langs[0]
    patch_lang = module.body[at]
    body = list(patch_lang.body.body)
    call = m.SimpleStatementLine(body=[m.Expr(value=m.Call(func=m.Name("_patch_libdevice")))])
    calls = sum(m.matches(stmt, call) for stmt in body)
    if "_patch_libdevice" in names or calls:
        if names.count("_patch_libdevice") == 1 and calls == 1:
            return "present"
        raise FixRefused(f"{path}: _patch_libdevice partly there ({names.count('_patch_libdevice')}"
                         f" defs, {calls} calls in _patch_lang); reinstall triton")
    returns_scope = m.SimpleStatementLine(body=[m.Return(value=m.Name("scope"))])
    if not body or not m.matches(body[-1], returns_scope):
        raise FixRefused(f"{path}: _patch_lang does not end in `return scope`; the file moved, "
                         f"re-check the fix")
    needs = {
        "import math": m.Import(names=[m.ImportAlias(name=m.Name("math"))]),
        "import numpy as np": m.Import(names=[m.ImportAlias(
            name=m.Name("numpy"), asname=m.AsName(name=m.Name("np")))]),
        "import triton.language as tl": _TL_IMPORT,
    }
    _require_imports(path, module, needs)
    if not any(m.matches(node, m.ClassDef(name=m.Name("TensorHandle"))) for node in module.body):
        raise FixRefused(f"{path}: no class TensorHandle; the file moved, re-check the fix")
    body.insert(len(body) - 1, cst.parse_statement("_patch_libdevice(scope)\n"))
    patched = patch_lang.with_changes(body=patch_lang.body.with_changes(body=body))
    added = list(cst.parse_module(_LIBDEVICE_FIX).body)
    new_body = [*module.body[:at], *added, patched, *module.body[at + 1:]]
    _write(path, module.with_changes(body=new_body).code)
    return "applied"


# The mark _patch_lang leaves on each language module it patched, through its scope.
PATCHED_MARK = "_glm53_patched_for_interpreter"
_PATCH_ONCE_FIX = f"""
def _lang_patched(fn):
    \"\"\"Whether every triton.language module FN sees is patched already (a device function
    called while its grid runs): patching again lists every module member to change nothing.\"\"\"
    langs = [value for _, value in fn.__globals__.items() if inspect.ismodule(value) and value in [tl, tl.core]]
    return bool(langs) and all(getattr(lang, "{PATCHED_MARK}", False) for lang in langs)
"""
_MARK_LINE = f'scope.set_attr(lang, "{PATCHED_MARK}", True)\n'


def ensure_interpreter_patch_once(path: Path) -> str:
    """`_patch_lang` marks each language module it patches (in its scope), and
    `InterpretedFunction.__call__` calls it only when `_lang_patched(self.fn)` is false."""
    module = cst.parse_module(path.read_text())
    body = list(module.body)
    patch_langs, helpers = _function(body, "_patch_lang"), _function(body, "_lang_patched")
    classes = [i for i, node in enumerate(body)
               if m.matches(node, m.ClassDef(name=m.Name("InterpretedFunction")))]
    if len(patch_langs) != 1 or len(classes) != 1:
        raise FixRefused(f"{path}: expected one def _patch_lang and one class "
                         f"InterpretedFunction, found {len(patch_langs)} and {len(classes)}; "
                         f"the file moved, re-check the fix")
    patch_lang = body[patch_langs[0]]
    loops = [node for node in patch_lang.body.body if m.matches(node, m.For(
        target=m.Name("lang"), iter=m.Name("langs")))]
    calls = [node for node in body[classes[0]].body.body if m.matches(node, m.FunctionDef(
        name=m.Name("__call__")))]
    if len(loops) != 1 or len(calls) != 1:
        raise FixRefused(f"{path}: expected _patch_lang's one `for lang in langs:` and "
                         f"InterpretedFunction's one __call__, found {len(loops)} and "
                         f"{len(calls)}; the file moved, re-check the fix")
    mark = cst.parse_statement(_MARK_LINE)
    marked = any(stmt.with_changes(leading_lines=()).deep_equals(mark)
                 for stmt in loops[0].body.body)
    plain = m.SimpleStatementLine(body=[m.Expr(value=m.Call(
        func=m.Name("_patch_lang"), args=[m.Arg(value=m.Attribute(
            value=m.Name("self"), attr=m.Name("fn")))]))])
    guarded = cst.parse_statement("if not _lang_patched(self.fn):\n    _patch_lang(self.fn)\n")
    call_body = list(calls[0].body.body)
    plains = [i for i, stmt in enumerate(call_body) if m.matches(stmt, plain)]
    guards = [i for i, stmt in enumerate(call_body)
              if stmt.with_changes(leading_lines=()).deep_equals(guarded)]
    done = (marked, bool(helpers), bool(guards))
    if all(done) and len(helpers) == 1 and len(guards) == 1 and not plains:
        return "present"
    if any(done):
        raise FixRefused(f"{path}: the patch-once fix is partly there (mark {marked}, "
                         f"_lang_patched {len(helpers)}, guarded calls {len(guards)}); "
                         f"reinstall triton")
    _require_imports(path, module, {
        "import inspect": m.Import(names=[m.ImportAlias(name=m.Name("inspect"))]),
        "import triton.language as tl": _TL_IMPORT})
    if len(plains) != 1:
        raise FixRefused(f"{path}: InterpretedFunction.__call__ should call "
                         f"_patch_lang(self.fn) once, found {len(plains)}; the file moved, "
                         f"re-check the fix")
    loop = loops[0].with_changes(body=loops[0].body.with_changes(
        body=[*loops[0].body.body, mark]))
    patch_lang = patch_lang.with_changes(body=patch_lang.body.with_changes(body=[
        loop if stmt is loops[0] else stmt for stmt in patch_lang.body.body]))
    call_body[plains[0]] = guarded.with_changes(leading_lines=call_body[plains[0]].leading_lines)
    call = calls[0].with_changes(body=calls[0].body.with_changes(body=call_body))
    klass = body[classes[0]]
    klass = klass.with_changes(body=klass.body.with_changes(body=[
        call if node is calls[0] else node for node in klass.body.body]))
    helper = list(cst.parse_module(_PATCH_ONCE_FIX).body)
    helper[0] = helper[0].with_changes(leading_lines=[cst.EmptyLine(), cst.EmptyLine()])
    patch_lang = patch_lang.with_changes(leading_lines=[cst.EmptyLine(), cst.EmptyLine()])
    new_body = []
    for i, node in enumerate(body):
        if i == patch_langs[0]:
            new_body.extend([*helper, patch_lang])
        elif i == classes[0]:
            new_body.append(klass)
        else:
            new_body.append(node)
    _write(path, module.with_changes(body=new_body).code)
    return "applied"
