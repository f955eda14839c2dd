"""Static verification: compile errors and unresolved vLLM imports are found."""

import sys

import pytest

from recipekit.tree import TreeView
from recipekit.verify import TorchDoesNotImport, import_problems, static_problems


def make(tmp_path, files):
    for name, text in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return TreeView(tmp_path)


def test_resolved_imports_pass(tmp_path):
    view = make(tmp_path, {
        "vllm/__init__.py": "",
        "vllm/a/__init__.py": "from vllm.a.impl import *\n",
        "vllm/a/impl.py": "def helper():\n    pass\n__all__ = ['helper']\n",
        "vllm/a/sub.py": "X = 1\n",
        "vllm/b.py": (
            "from vllm.a import helper, sub\n"
            "from .a.sub import X\n"
            "import vllm.a.impl\n"
            "try:\n    from vllm.a.sub import X as Y\nexcept ImportError:\n    pass\n"
            "from torch import nn\n"
        ),
    })
    assert static_problems(view, ["vllm/b.py"]) == []


def test_missing_names_and_modules_are_reported(tmp_path):
    view = make(tmp_path, {
        "vllm/__init__.py": "",
        "vllm/a.py": "def present():\n    pass\n",
        "vllm/b.py": "from vllm.a import present, absent\nfrom vllm.nowhere import thing\nimport vllm.gone\n",
    })
    assert static_problems(view, ["vllm/b.py"]) == [
        "vllm/b.py:1: vllm.a defines no absent",
        "vllm/b.py:2: module vllm.nowhere is not in the tree",
        "vllm/b.py:3: module vllm.gone is not in the tree",
    ]


def test_compile_error_is_reported(tmp_path):
    view = make(tmp_path, {"vllm/__init__.py": "", "vllm/bad.py": "def broken(:\n"})
    problems = static_problems(view, ["vllm/bad.py"])
    assert len(problems) == 1 and problems[0].startswith("vllm/bad.py:1: does not compile")


def test_overlay_is_what_gets_checked(tmp_path):
    view = make(tmp_path, {"vllm/__init__.py": "", "vllm/a.py": "OLD = 1\n", "vllm/b.py": "from vllm.a import NEW\n"})
    assert static_problems(view, ["vllm/b.py"]) == ["vllm/b.py:1: vllm.a defines no NEW"]
    patched = view.with_overlay({"vllm/a.py": b"NEW = 2\n"})
    assert static_problems(patched, ["vllm/b.py"]) == []


# --- import_problems: each module imported as a fresh interpreter would -------------------


def test_each_module_is_imported_as_if_alone(tmp_path):
    """Modules share their packages' import (one fork per package), yet none sees what
    another imported: `b` works only after `a` ran, and is reported though `a` comes first;
    a failing package fails every module below it with its own error, its siblings not."""
    make(tmp_path, {
        "vllm/__init__.py": "import sys\nsys.argv_seen = list(sys.argv)\n",
        "vllm/shared.py": "VALUE = None\n",
        "vllm/a.py": "import vllm.shared\nvllm.shared.VALUE = 1\n",
        "vllm/b.py": "import vllm.shared\nassert vllm.shared.VALUE == 1, 'a was not imported'\n",
        "vllm/c.py": "import sys\nassert sys.argv == ['-c'], sys.argv\nassert 'vllm.a' not in sys.modules\n",
        "vllm/broken/__init__.py": "undefined_name\n",
        "vllm/broken/d.py": "X = 1\n",
        "vllm/ok/__init__.py": "from vllm.ok.e import E\n",
        "vllm/ok/e.py": "E = 1\n",
        "vllm/ok/f.py": "import vllm.nowhere\n",
    })
    modules = ["vllm.a", "vllm.b", "vllm.c", "vllm.broken.d", "vllm.ok.e", "vllm.ok.f", "vllm.missing"]
    assert import_problems(tmp_path, modules) == [
        "import vllm.b failed: AssertionError: a was not imported",
        "import vllm.broken.d failed: NameError: name 'undefined_name' is not defined",
        "import vllm.ok.f failed: ModuleNotFoundError: No module named 'vllm.nowhere'",
        "import vllm.missing failed: ModuleNotFoundError: No module named 'vllm.missing'",
    ]
    assert not any(tmp_path.rglob("__pycache__"))  # the tree stays as patched


def test_a_module_that_kills_its_interpreter_is_reported(tmp_path):
    make(tmp_path, {
        "vllm/__init__.py": "",
        "vllm/dies.py": "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n",
        "vllm/lives.py": "X = 1\n",
    })
    assert import_problems(tmp_path, ["vllm.dies", "vllm.lives"]) == [
        "import vllm.dies failed: killed by signal 9"]


def python_without_site(tmp_path):
    """This interpreter without its site-packages (`-S`): torch does not import in it."""
    wrapper = tmp_path / "python-without-site"
    wrapper.write_text(f'#!/bin/sh\nexec "{sys.executable}" -S "$@"\n')
    wrapper.chmod(0o755)
    return str(wrapper)


def test_where_torch_does_not_import_the_check_says_so_or_walks_as_asked(tmp_path):
    """Asked to check only where torch imports, the check refuses to judge without it; told
    to check regardless (--import-check on), each module is imported and the one that needs
    torch fails with torch's error."""
    tree = tmp_path / "tree"
    make(tree, {"vllm/__init__.py": "", "vllm/plain.py": "X = 1\n",
                "vllm/needs_torch.py": "import torch\n"})
    python = python_without_site(tmp_path)
    with pytest.raises(TorchDoesNotImport, match="torch does not import"):
        import_problems(tree, ["vllm.plain", "vllm.needs_torch"], python,
                        only_where_torch_imports=True)
    assert import_problems(tree, ["vllm.plain", "vllm.needs_torch"], python) == [
        "import vllm.needs_torch failed: ModuleNotFoundError: No module named 'torch'"]


def test_a_tree_that_breaks_torchs_import_is_still_checked(tmp_path):
    """torch imports here, but not with this tree first on the path (it shadows a module
    torch imports): the check still runs, without torch preloaded, and reports what fails."""
    make(tmp_path, {"typing_extensions.py": "raise ImportError('shadowed by the tree')\n",
                    "vllm/__init__.py": "", "vllm/plain.py": "X = 1\n",
                    "vllm/needs_torch.py": "import torch\n"})
    assert import_problems(tmp_path, ["vllm.plain", "vllm.needs_torch"],
                           only_where_torch_imports=True) == [
        "import vllm.needs_torch failed: ImportError: shadowed by the tree"]
