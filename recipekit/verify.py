"""Static checks of patched files: they compile, and their vLLM imports resolve.

An import ``from vllm.x import y`` resolves when ``vllm/x`` is a module of the tree
that defines ``y`` at top level (a def, class, assignment or import, including names
re-exported through ``from ... import *``), or when ``vllm/x/y`` is a submodule.
Compiling alone let NameErrors reach serve time in other recipes; this catches the
import half of them without importing anything.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from recipekit.tree import TreeView


def _defined_names(tree: ast.Module) -> tuple[set[str], list[str], bool]:
    """Top-level names, modules star-imported, and whether ``__getattr__`` is defined."""
    names: set[str] = set()
    star_modules: list[str] = []
    has_getattr = False

    def visit(statements):
        nonlocal has_getattr
        for node in statements:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
                has_getattr |= node.name == "__getattr__"
            elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for target in targets:
                    for leaf in ast.walk(target):
                        if isinstance(leaf, ast.Name):
                            names.add(leaf.id)
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    names.add(alias.asname or alias.name.split(".")[0])
            elif isinstance(node, ast.ImportFrom):
                for alias in node.names:
                    if alias.name == "*":
                        star_modules.append(("." * node.level) + (node.module or ""))
                    else:
                        names.add(alias.asname or alias.name)
            elif isinstance(node, (ast.If, ast.Try, ast.With)):
                visit(node.body)
                visit(getattr(node, "orelse", []))
                visit(getattr(node, "finalbody", []))
                for handler in getattr(node, "handlers", []):
                    visit(handler.body)

    visit(tree.body)
    return names, star_modules, has_getattr


def _resolve_relative(current_module: str, is_package: bool, dotted: str) -> str:
    level = len(dotted) - len(dotted.lstrip("."))
    if level == 0:
        return dotted
    package = current_module.split(".") if is_package else current_module.split(".")[:-1]
    package = package[: len(package) - (level - 1)] if level > 1 else package
    rest = dotted[level:]
    return ".".join(package + ([rest] if rest else []))


class ImportChecker:
    """Resolves ``vllm`` imports against one tree view, caching parsed modules."""

    def __init__(self, view: TreeView) -> None:
        self.view = view
        self._summaries: dict[str, tuple | None] = {}

    def _module_summary(self, dotted: str):
        if dotted not in self._summaries:
            self._summaries[dotted] = self._summarise(dotted)
        return self._summaries[dotted]

    def _summarise(self, dotted: str):
        relative = self.view.module_file(dotted)
        if relative is None:
            return None
        source = self.view.read_text(relative)
        try:
            tree = ast.parse(source, filename=relative)
        except SyntaxError:
            return set(), [], True
        names, stars, has_getattr = _defined_names(tree)
        is_package = relative.endswith("__init__.py")
        stars = [_resolve_relative(dotted, is_package, star) for star in stars]
        lazy = has_getattr and source is not None
        return names, stars, (source if lazy else None)

    def defines(self, dotted: str, name: str, seen: frozenset = frozenset()) -> bool:
        if dotted in seen:
            return False
        summary = self._module_summary(dotted)
        if summary is None:
            return False
        names, stars, lazy_source = summary
        if name in names or self.view.module_file(f"{dotted}.{name}") is not None:
            return True
        if lazy_source is not None and (f'"{name}"' in lazy_source or f"'{name}'" in lazy_source):
            return True  # a module-level __getattr__ serves names it lists as strings
        return any(self.defines(star, name, seen | {dotted}) for star in stars)

    def problems(self, relative: str) -> list[str]:
        source = self.view.read_text(relative)
        tree = ast.parse(source, filename=relative)
        module = relative[:-3].replace("/", ".")
        is_package = relative.endswith("__init__.py")
        if is_package:
            module = module[: -len(".__init__")]
        found = []
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                target = _resolve_relative(module, is_package, "." * node.level + (node.module or ""))
                if not target.startswith("vllm"):
                    continue
                if self.view.module_file(target) is None:
                    found.append(f"{relative}:{node.lineno}: module {target} is not in the tree")
                    continue
                for alias in node.names:
                    if alias.name != "*" and not self.defines(target, alias.name):
                        found.append(
                            f"{relative}:{node.lineno}: {target} defines no {alias.name}"
                        )
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.startswith("vllm") and self.view.module_file(alias.name) is None:
                        found.append(f"{relative}:{node.lineno}: module {alias.name} is not in the tree")
        return found


def compile_problems(view: TreeView, relative: str) -> list[str]:
    source = view.read_text(relative)
    if source is None:
        return []
    try:
        compile(source, relative, "exec", dont_inherit=True)
    except SyntaxError as error:
        return [f"{relative}:{error.lineno}: does not compile: {error.msg}"]
    return []


def static_problems(view: TreeView, files: list[str], baseline: TreeView | None = None) -> list[str]:
    """Compile errors and unresolved vLLM imports in ``files`` (python files only).

    With ``baseline`` (the tree before a patch), an unresolved import the file already had
    there is not the patch's doing and is left out: a release tree holds no compiled
    extension modules (``vllm._C``), which vLLM's own files import.
    """
    checker = ImportChecker(view)
    before = ImportChecker(baseline) if baseline is not None else None
    problems: list[str] = []
    for relative in files:
        if not relative.endswith(".py") or not view.exists(relative):
            continue
        compile_errors = compile_problems(view, relative)
        if compile_errors:
            problems.extend(compile_errors)
            continue
        found = checker.problems(relative)
        if before is not None and baseline.exists(relative):
            known = {_without_line(p) for p in before.problems(relative)}
            found = [p for p in found if _without_line(p) not in known]
        problems.extend(found)
    return problems


def _without_line(problem: str) -> str:
    """``path:12: message`` without its line number."""
    path, _, rest = problem.partition(":")
    return f"{path}:{rest.partition(':')[2]}"


class TorchDoesNotImport(RuntimeError):
    """import_problems was asked to check only where torch imports, and it does not."""


# Run by import_problems in an interpreter of its own, cwd the tree (argv: the answer file,
# what to do when torch does not import ("skip" or "walk"), then the modules). Importing a
# module first imports each package above it, whole, in order (`vllm`, then `vllm.v1`, ...),
# so a fork taken once a package is imported holds exactly what a fresh interpreter holds at
# that point of importing any module below it. So the interpreter imports torch (every vLLM
# module does, before anything of the tree), then walks the modules' package tree: each
# package is imported once, in a fork of its parent package's process, and each module in a
# fork of its own. A package that fails to import fails every module below it with its
# error, as each would alone. Should torch's import load anything from the tree, or fail,
# the walk is made again without it; with "skip", a torch that fails to import with the tree
# off the path too means torch does not import here: the answer says so and nothing is
# walked. Writes {"skipped": bool, "modules": {module: [exit code, the last line of its
# stderr]}} as JSON.
_IMPORT_EACH = r"""
import json, os, sys, traceback
answer, without_torch, modules = sys.argv[1], sys.argv[2], sys.argv[3:]
sys.argv = ["-c"]  # what `python -c "import MODULE"` gives the imported code
records = answer + ".d"  # one record per module, and each fork's stderr
os.mkdir(records)
TORCH_FAILED = 5


def record(module, code, last):
    with open(os.path.join(records, module), "w") as out:
        out.write(json.dumps([code, last]))


def import_in_fork(name):
    err_path = os.path.join(records, "." + name + ".err")
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            # fds 2 and 1 moved under sys.stderr and sys.stdout (new file objects on them
            # would close them when the old ones are collected)
            sys.stdout.flush()
            sys.stderr.flush()
            err = os.open(err_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.dup2(err, 2)
            os.close(err)
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, 1)
            os.close(null)
            try:
                __import__(name)
            except BaseException:
                traceback.print_exc()
                sys.stderr.flush()
                os._exit(1)
            if name in modules:
                record(name, 0, "")
            walk(name)
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    if code != 0:
        with open(err_path) as err:
            lines = err.read().strip().splitlines()
        last = lines[-1] if lines else ("killed by signal %d" % -code if code < 0 else "no output")
        for module in modules:
            if (module == name or module.startswith(name + ".")) and not os.path.exists(os.path.join(records, module)):
                record(module, code, last)


def walk(prefix):
    # each name one level below PREFIX on the way to a module, imported in a fork
    depth = len(prefix.split(".")) if prefix else 0
    heads = []
    for module in modules:
        if not prefix or module.startswith(prefix + "."):
            head = ".".join(module.split(".")[: depth + 1])
            if head not in heads:
                heads.append(head)
    for head in heads:
        import_in_fork(head)


def with_torch():
    # torch first, in a fork; should it load anything of the tree, the walk goes without it
    try:
        import torch  # noqa: F401
    except BaseException:
        os._exit(TORCH_FAILED)
    root = os.path.realpath(os.getcwd()) + os.sep
    files = [getattr(m, "__file__", None) for m in list(sys.modules.values())]
    if any(os.path.isabs(f) and os.path.realpath(f).startswith(root) for f in files if isinstance(f, str)):
        os._exit(3)
    walk("")
    os._exit(0)


def torch_imports_off_the_tree():
    # in a fork, with the tree (the working directory) off the path: torch alone
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            root = os.path.realpath(os.getcwd())
            sys.path[:] = [p for p in sys.path if os.path.realpath(p or ".") != root]
            import torch  # noqa: F401
            code = 0
        finally:
            os._exit(code)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0


pid = os.fork()
if pid == 0:
    try:
        with_torch()
    finally:
        os._exit(4)
torch_code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
if torch_code == TORCH_FAILED and without_torch == "skip" and not torch_imports_off_the_tree():
    with open(answer, "w") as out:
        json.dump({"skipped": True, "modules": {}}, out)
    sys.exit(0)
if not all(os.path.exists(os.path.join(records, module)) for module in modules):
    for module in modules:
        if os.path.exists(os.path.join(records, module)):
            os.unlink(os.path.join(records, module))
    walk("")
results = {}
for module in modules:
    with open(os.path.join(records, module)) as found:
        results[module] = json.loads(found.read())
with open(answer, "w") as out:
    json.dump({"skipped": False, "modules": results}, out)
"""


def import_problems(root: Path, modules: list[str], python: str = sys.executable,
                    *, only_where_torch_imports: bool = False) -> list[str]:
    """Import each module from ``root`` as a fresh interpreter would; the failures, one
    line each. With ``only_where_torch_imports``, raises TorchDoesNotImport instead where
    torch does not import in the check's own environment, even with the tree off the path:
    nothing could be checked. The check's interpreter finds that out itself, so torch is
    imported once (a probe of its own cost an import of torch more, about 3 s of CPU).

    One interpreter does it for all of them (``_IMPORT_EACH``): torch and each package
    above the modules are imported once, each module in a fork after its packages. The
    same imports run in the same order as in a fresh interpreter per module, without
    repeating the shared ones (vLLM's modules share most of theirs).
    """
    env = {
        "PYTHONPATH": str(root),
        # No bytecode: the tree stays exactly what was patched and verified.
        "PYTHONDONTWRITEBYTECODE": "1",
        # vLLM's linear kernels import humming, whose import starts two background
        # interpreters (each importing torch) to build CUDA launchers: work for a GPU, not
        # for an import check, and on a CPU machine they only fail.
        "HUMMING_DISABLE_PARALLEL_BUILD": "1",
        "PATH": "/usr/bin:/bin",
        "HOME": str(Path.home()),
    }
    with tempfile.TemporaryDirectory(prefix="import-check-") as tmp:
        answer = Path(tmp) / "answer.json"
        result = subprocess.run(
            [python, "-c", _IMPORT_EACH, str(answer),
             "skip" if only_where_torch_imports else "walk", *modules], cwd=root, env=env,
            capture_output=True, text=True, timeout=600 * max(1, len(modules)), check=False,
        )
        if result.returncode != 0 or not answer.is_file():
            last = (result.stderr.strip().splitlines() or ["no output"])[-1]
            return [f"import check of {', '.join(modules)} failed: {last}"]
        answer_json = json.loads(answer.read_text())
    if answer_json["skipped"]:
        raise TorchDoesNotImport(f"{python}: torch does not import")
    answers = answer_json["modules"]
    return [f"import {module} failed: {answers[module][1]}" for module in modules
            if answers.get(module, [1])[0] != 0]
