"""Static verification: compile errors and unresolved vLLM imports are found."""

from recipekit.tree import TreeView
from recipekit.verify import static_problems


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
