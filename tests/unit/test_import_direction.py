"""recipekit's imports run one way: primitives, then the layer runner, codepatch, the layers,
the image build; and recipekit sits below its users, so none of its modules imports the
launcher, the bench or the tests. The launcher imports neither the bench nor the tests
(scripts/compare runs the bench's tools as commands). Imports are read from the source with
ast; nothing is imported."""

from __future__ import annotations

import ast
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
PACKAGE = REPO_ROOT / "recipekit"
# Bottom to top; a module of one rank may import only its own rank or the ranks below it.
# Every recipekit module not named here is a primitive (rank 0).
RANKS = ("recipekit.layer", "recipekit.codepatch", "recipekit.layers", "recipekit.imagebuild")
# The packages that import recipekit; an import the other way is an arrow back up.
USERS = ("launcher", "bench", "tests")


def module_name(path: Path) -> str:
    name = ".".join(path.relative_to(REPO_ROOT).with_suffix("").parts)
    return name.removesuffix(".__init__")


def rank_of(module: str) -> int:
    for index, prefix in reversed(list(enumerate(RANKS, start=1))):
        if module == prefix or module.startswith(prefix + "."):
            return index
    return 0


def imports_of(module: str, source: str, known: set[str]) -> set[str]:
    """The recipekit modules SOURCE imports (`from recipekit import x` names recipekit.x)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name.split(".")[0] == "recipekit"}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".") if is_package(module) else module.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] != "recipekit":
                continue
            found.add(target)
            found |= {f"{target}.{alias.name}" for alias in node.names if f"{target}.{alias.name}" in known}
    return (found & known) - {"recipekit", module}


def imported(source: str) -> set[str]:
    """Every module SOURCE imports (`from a import b` names a and a.b), statically or by a
    constant name given to importlib.import_module or __import__."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            found |= {node.module} | {f"{node.module}.{alias.name}" for alias in node.names}
        elif (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)
              and isinstance(node.args[0].value, str)
              and (getattr(node.func, "attr", None) == "import_module"
                   or getattr(node.func, "id", None) == "__import__")):
            found.add(node.args[0].value)
    return found


def user_imports(source: str, users: tuple[str, ...] = USERS) -> set[str]:
    """The modules of USERS (recipekit's, unless given) that SOURCE imports (`imported`)."""
    return {name for name in imported(source) if name.split(".")[0] in users}


def arrows_back_up(sources: dict[str, str]) -> list[str]:
    """`MODULE imports USER_MODULE` for every import of a user package in SOURCES."""
    return sorted(f"{module} imports {target}" for module, source in sources.items()
                  for target in user_imports(source))


def is_package(module: str) -> bool:
    return (REPO_ROOT / Path(*module.split(".")) / "__init__.py").is_file()


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    return sorted(f"{module} imports {target}" for module, targets in graph.items()
                  for target in targets if rank_of(target) > rank_of(module))


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    found, state = [], {}

    def visit(module: str, path: list[str]) -> None:
        state[module] = "open"
        for target in sorted(graph.get(module, ())):
            if state.get(target) == "open":
                found.append(path[path.index(target):] + [target] if target in path else [module, target])
            elif target not in state:
                visit(target, path + [target])
        state[module] = "done"

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    return found


def recipekit_graph() -> dict[str, set[str]]:
    paths = sorted(PACKAGE.rglob("*.py"))
    known = {module_name(path) for path in paths}
    return {module_name(path): imports_of(module_name(path), path.read_text(encoding="utf-8"), known)
            for path in paths}


def recipekit_sources() -> dict[str, str]:
    return {module_name(path): path.read_text(encoding="utf-8")
            for path in sorted(PACKAGE.rglob("*.py"))}


def test_no_recipekit_module_imports_its_users():
    sources = recipekit_sources()
    assert "recipekit.recipe" in sources and "recipekit.imagebuild.chain" in sources
    assert arrows_back_up(sources) == []


def test_the_check_catches_the_old_arrow_back_up():
    """chain.py's import of the recipe reader from the launcher (before the reader moved to
    recipekit/recipe.py) is reported, in every spelling, and so is one into bench or tests."""
    old = {"recipekit.imagebuild.chain": "from launcher import recipe as recipe_file\n"}
    assert arrows_back_up(old) == ["recipekit.imagebuild.chain imports launcher",
                                   "recipekit.imagebuild.chain imports launcher.recipe"]
    for source in ("from launcher.recipe import Recipe\n", "import launcher.recipe\n",
                   "import importlib\nimportlib.import_module('launcher.recipe')\n",
                   "from bench import receipts\n", "import tests.unit.test_launcher_support\n"):
        assert arrows_back_up({"recipekit.recipe": source}), source
    assert arrows_back_up({"recipekit.imagebuild.chain":
                           "from recipekit import recipe as recipe_file\n"
                           "from recipekit.recipe import Recipe\nimport testing\n"}) == []


def test_no_recipekit_module_imports_upward():
    graph = recipekit_graph()
    assert graph["recipekit.codepatch"] >= {"recipekit.layer"}
    assert upward_imports(graph) == []


def test_recipekit_imports_have_no_cycle():
    assert cycles(recipekit_graph()) == []


def test_the_layer_base_class_lives_below_codepatch():
    defined = {node.name for node in ast.parse((PACKAGE / "layer.py").read_text()).body
               if isinstance(node, ast.ClassDef)}
    assert {"Layer", "LayerResult", "LayerSetupError"} <= defined
    layers_init = ast.parse((PACKAGE / "layers" / "__init__.py").read_text())
    assert not [node for node in layers_init.body if isinstance(node, ast.ClassDef)]


def test_the_check_catches_an_upward_import_and_a_cycle():
    """The old shape (codepatch importing recipekit.layers) and a two-module cycle are caught."""
    known = {"recipekit.codepatch", "recipekit.layers", "recipekit.tree", "recipekit.verify"}
    old = imports_of("recipekit.codepatch", "from recipekit.layers import Layer\n", known)
    assert upward_imports({"recipekit.codepatch": old}) == [
        "recipekit.codepatch imports recipekit.layers"
    ]
    relative = imports_of("recipekit.layers", "from . import v8\nfrom ..tree import TreeView\n",
                          known | {"recipekit.layers.v8"})
    assert relative == {"recipekit.layers.v8", "recipekit.tree"}
    assert cycles({"recipekit.tree": {"recipekit.verify"}, "recipekit.verify": {"recipekit.tree"}})


def package_sources(package: str) -> dict[str, str]:
    return {module_name(path): path.read_text(encoding="utf-8")
            for path in sorted((REPO_ROOT / package).rglob("*.py"))}


def launcher_sources() -> dict[str, str]:
    return package_sources("launcher")


def test_the_launcher_imports_nothing_of_the_bench_or_the_tests():
    """The launcher runs with the standard library alone; scripts/compare runs bench/ as
    commands and reads their result files, so no import goes from launcher to bench."""
    sources = launcher_sources()
    assert "launcher.apply.serve" in sources
    found = sorted(f"{module} imports {target}" for module, source in sources.items()
                   for target in user_imports(source) if target.split(".")[0] in ("bench", "tests"))
    assert found == []


# bench/probes.py's families (bench/probing/), bottom to top: a module may import only the
# ranks below its own, so the families never import one another, the runner or the command.
PROBE_RANKS = (("bench.probing.verdict",), ("bench.probing.client",),
               ("bench.probing.serving", "bench.probing.tools", "bench.probing.multibyte",
                "bench.probing.tool_cycles"),
               ("bench.probing.runner",), ("bench.probes",))


def probe_modules() -> dict[str, str]:
    paths = [REPO_ROOT / "bench" / "probes.py",
             *sorted((REPO_ROOT / "bench" / "probing").glob("*.py"))]
    return {module_name(path): path.read_text(encoding="utf-8") for path in paths}


def probe_arrows(sources: dict[str, str]) -> list[str]:
    """`MODULE imports TARGET` for each import between the probe modules that does not go
    to a lower rank (the package's own __init__, which imports nothing, has no rank)."""
    rank = {module: index for index, ranked in enumerate(PROBE_RANKS) for module in ranked}
    found = set()
    for module, source in sources.items():
        for name in user_imports(source):
            target = next((known for known in rank
                           if name == known or name.startswith(known + ".")), None)
            if target and module in rank and rank[target] >= rank[module]:
                found.add(f"{module} imports {target}")
    return sorted(found)


def test_the_probe_families_import_only_downward():
    sources = probe_modules()
    ranked = {module for ranked in PROBE_RANKS for module in ranked}
    assert set(sources) - {"bench.probing"} == ranked, "a probe module without a rank"
    assert probe_arrows(sources) == []


def test_the_probe_check_catches_a_family_importing_another_or_the_command():
    assert probe_arrows({"bench.probing.multibyte":
                         "from bench.probing.tool_cycles import Turn\n"}) == [
        "bench.probing.multibyte imports bench.probing.tool_cycles"]
    assert probe_arrows({"bench.probing.verdict": "from bench import probes\n"}) == [
        "bench.probing.verdict imports bench.probes"]
    assert probe_arrows({"bench.probing.runner":
                         "from bench.probing.serving import probe_needle\n"}) == []


# scripts/compare (compare/) boots the launcher and runs the bench, so it stands above both:
# nothing under launcher/ or bench/ imports it (the circle launcher/compare/sides.py ->
# launcher/cli.py -> launcher/compare/ is gone), and it reads the settings through
# launcher/plan/load.py, never through the launcher's command line.
CLI_ENTRY = ("launcher.cli", "launcher.entry")


def arrows_into_compare(sources: dict[str, str]) -> list[str]:
    return sorted(f"{module} imports {target}" for module, source in sources.items()
                  for target in user_imports(source, ("compare",)))


def arrows_into_the_cli(sources: dict[str, str]) -> list[str]:
    return sorted(f"{module} imports {target}" for module, source in sources.items()
                  for target in user_imports(source, ("launcher",))
                  if any(target == entry or target.startswith(entry + ".") for entry in CLI_ENTRY))


def test_nothing_under_the_launcher_or_the_bench_imports_compare():
    sources = {**package_sources("launcher"), **package_sources("bench")}
    assert "launcher.plan.load" in sources and "bench.probes" in sources
    assert arrows_into_compare(sources) == []


def test_compare_reads_the_settings_without_the_launchers_command_line():
    sources = package_sources("compare")
    assert "compare.sides" in sources
    imported = {target for source in sources.values()
                for target in user_imports(source, ("launcher",))}
    assert "launcher.plan.load" in imported
    assert arrows_into_the_cli(sources) == []


def test_the_checks_catch_the_old_circle_in_every_spelling():
    for source in ("from compare import sides\n", "import compare.boot\n",
                   "def later():\n    from compare.command import main\n",
                   "import importlib\nimportlib.import_module('compare.rundir')\n"):
        assert arrows_into_compare({"launcher.cli": source}), source
    assert arrows_into_compare({"bench.probes": "import comparison\nfrom bench import x\n"}) == []
    for source in ("from launcher import cli\n", "from launcher.cli import load\n",
                   "import launcher.entry\n"):
        assert arrows_into_the_cli({"compare.sides": source}), source
    assert arrows_into_the_cli({"compare.sides": "from launcher.plan import load\n"}) == []
