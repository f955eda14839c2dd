"""v8's API key change: every route of vLLM's API server needs the key but /health.

vLLM's ``AuthenticationMiddleware.__call__`` asks for the key only on paths starting with its
``GUARDED_PREFIX`` (/v1, /v2, /inference, /cohere), so ``POST /invocations`` and
``POST /generative_scoring`` run the model without it. The edit decorates that method with
``guard_every_route`` of ``patches/v8/api_key_guard.py``, installed beside the middleware's
module as ``glm53_api_key.py``: deny by default, an explicit open list; nothing of vLLM's own
text changes.

The middleware is found by shape, not by path: the one module under vllm/entrypoints/ that
defines ``class AuthenticationMiddleware`` with ``verify_token`` and ``__call__`` (0.27.1 and
the fork keep it in serve/utils/server_utils.py, 0.30.0 on in serve/middleware/authenticate.py).
A ``__call__`` that checks the token with no path-prefix test guards every route itself: the
base provides it. One that no longer checks the token, or two such classes, is refused.
"""

from __future__ import annotations

import ast
from pathlib import PurePosixPath

import libcst as cst

from recipekit.codepatch import (
    PATCHES_DIR,
    CodePatchLayer,
    StepLog,
    ensure_decorator,
    find_class,
    find_method,
    statement,
)
from recipekit.exact_patch import PatchPlan, PatchRefused
from recipekit.tree import TreeView

SEARCHED = "vllm/entrypoints"
CLASS = "AuthenticationMiddleware"
METHOD = "__call__"
TOKEN_CHECK = "verify_token"
HELPER_SOURCE = PATCHES_DIR / "v8" / "api_key_guard.py"
HELPER_NAME = "glm53_api_key.py"
DECORATOR = "guard_every_route"


def open_paths() -> frozenset[str]:
    """The helper's OPEN_PATHS, read from its source (importing it needs starlette): the one
    place the open list is written; the launcher's and the test fake's copies are held to it."""
    for node in ast.parse(HELPER_SOURCE.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Assign) and ast.unparse(node.targets[0]) == "OPEN_PATHS":
            return frozenset(ast.literal_eval(node.value.args[0]))
    raise ValueError(f"{HELPER_SOURCE}: no OPEN_PATHS = frozenset({{...}})")


def middleware_files(view: TreeView) -> list[str]:
    """Every module under vllm/entrypoints/ defining a top-level AuthenticationMiddleware
    class with verify_token and __call__, by relative path."""
    found = []
    for path in sorted((view.root / SEARCHED).rglob("*.py")):
        relative = path.relative_to(view.root).as_posix()
        text = view.read_text(relative)
        if text is None or f"class {CLASS}" not in text:
            continue
        cls = _class_node(text)
        if cls is not None and {TOKEN_CHECK, METHOD} <= {
                item.name for item in cls.body if isinstance(item, ast.FunctionDef)}:
            found.append(relative)
    return found


def _class_node(text: str) -> ast.ClassDef | None:
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return None
    return next((node for node in tree.body
                 if isinstance(node, ast.ClassDef) and node.name == CLASS), None)


def call_method(view: TreeView, target: str) -> ast.FunctionDef | None:
    cls = _class_node(view.read_text(target) or "")
    return None if cls is None else next(
        (item for item in cls.body if isinstance(item, ast.FunctionDef) and item.name == METHOD),
        None)


def _calls(method: ast.FunctionDef, attribute: str) -> bool:
    return any(isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
               and node.func.attr == attribute for node in ast.walk(method))


def decorated(method: ast.FunctionDef) -> bool:
    return DECORATOR in {ast.unparse(d) for d in method.decorator_list}


def helper_of(target: str) -> str:
    return str(PurePosixPath(target).with_name(HELPER_NAME))


def helper_import(target: str) -> str:
    module = helper_of(target)[:-3].replace("/", ".")
    return f"from {module} import {DECORATOR}\n"


class ApiKeyEveryRoute(CodePatchLayer):
    name = "v8_api_key"
    helper_source = HELPER_SOURCE

    def locate(self, view: TreeView) -> str:
        """The middleware's module (sets target and helper_target); refused unless there is
        exactly one."""
        found = middleware_files(view)
        if len(found) != 1:
            what = "none" if not found else " and ".join(found)
            raise PatchRefused(f"{SEARCHED}: {len(found)} modules define {CLASS} with "
                               f"{TOKEN_CHECK} and {METHOD} ({what}); the base drifted, find "
                               "how it authenticates requests")
        self.target, self.helper_target = found[0], helper_of(found[0])
        return found[0]

    def base_problem(self, view: TreeView) -> str | None:
        method = call_method(view, self.target)
        if method is None or not _calls(method, TOKEN_CHECK):
            return (f"{self.target}: {CLASS}.{METHOD} no longer calls {TOKEN_CHECK}; the base "
                    "drifted, find how it authenticates requests")
        return None

    def provided_by_base(self, view: TreeView) -> str | None:
        try:
            target = self.locate(view)
        except PatchRefused:
            return None
        method = call_method(view, target)
        if method is None or decorated(method) or not _calls(method, TOKEN_CHECK) or _calls(
                method, "startswith"):
            return None
        return (f"{target}: {CLASS}.{METHOD} checks the key with no path-prefix test: the base "
                "guards every route itself")

    def plan(self, view: TreeView) -> PatchPlan:
        self.locate(view)
        return super().plan(view)

    def rewrite(self, module: cst.Module, log: StepLog) -> cst.Module:
        body = list(module.body)
        wanted_import = statement(helper_import(self.target))
        present = any(node.deep_equals(wanted_import) for node in body)
        log.record("import the API key guard", present)
        cls = find_class(module, CLASS, self.target)
        method = find_method(cls, METHOD, self.target)
        new_method = ensure_decorator(method, DECORATOR, log)
        new_cls = cls.with_changes(body=cls.body.with_changes(
            body=[new_method if node is method else node for node in cls.body.body]))
        body = [new_cls if node is cls else node for node in body]
        if not present:
            last_import = max(i for i, n in enumerate(body[:body.index(new_cls)])
                              if isinstance(n, cst.SimpleStatementLine)
                              and isinstance(n.body[0], (cst.Import, cst.ImportFrom)))
            body.insert(last_import + 1, wanted_import)
        return module.with_changes(body=body)

    def missing_capability(self, view: TreeView) -> list[str]:
        if self.provided_by_base(view):
            return []
        try:
            target = self.locate(view)
        except PatchRefused as refused:
            return [str(refused)]
        method = call_method(view, target)
        problems = []
        if method is None or not decorated(method):
            problems.append(f"{target}: {CLASS}.{METHOD} is not decorated with {DECORATOR}")
        if not view.exists(helper_of(target)):
            problems.append(f"{helper_of(target)} is missing")
        return problems


def build(**_: object) -> ApiKeyEveryRoute:
    return ApiKeyEveryRoute()
