"""The engine tier's Triton-interpreter fixes on synthetic files of the shapes they patch:
applied once, present after, refused with one line when the shape moved."""

import inspect
import types

import pytest

from tests.engine.interpreter_fixes import (
    FixRefused,
    ensure_has_triton_under_interpreter,
    ensure_interpreter_bool_masks,
    ensure_interpreter_libdevice,
    ensure_interpreter_patch_once,
)

IMPORTING = '''import os
from importlib.util import find_spec

HAS_TRITON = find_spec("triton") is not None
if HAS_TRITON:
    try:
        from triton.backends import backends
        HAS_TRITON = bool(backends)
    except ImportError:
        HAS_TRITON = False

if not HAS_TRITON:
    print("no triton")
'''

INTERPRETER = '''class TensorHandle:
    pass


class InterpreterBuilder:
    def create_masked_load(self, ptrs, mask, other, cache_policy, is_volatile):
        ret = _interpreter.load(ptrs.data, mask.data, other.data, dtype_np)
        return TensorHandle(ret, dtype_tt)

    def create_masked_store(self, ptrs, value, mask, cache_policy):
        return _interpreter.store(ptrs.data, value.data, mask.data)
'''

PATCH_LANG = '''import math
import numpy as np
import triton.language as tl


class TensorHandle:
    def __init__(self, data, dtype):
        self.data, self.dtype = data, dtype


def _patch_lang(fn):
    scope = _LangPatchScope()
    _patch_builtin(tl.core.tensor_descriptor_base, interpreter_builder, scope)
    return scope
'''

PATCH_ONCE = '''import inspect
import triton.language as tl


def _patch_lang(fn):
    scope = _LangPatchScope()
    langs = [value for _, value in fn.__globals__.items() if inspect.ismodule(value) and value in [tl, tl.core]]
    for lang in langs:
        _patch_builtin(lang, interpreter_builder, scope)
    return scope


class InterpretedFunction:
    def __call__(self, *args, **kwargs):
        # This is a device function call
        _patch_lang(self.fn)
        fn = self.rewrite()
        return fn(*args, **kwargs)
'''


def _run(path, fix):
    return fix(path), path.read_text()


def test_has_triton_fix_applies_once_after_the_gate(tmp_path):
    path = tmp_path / "importing.py"
    path.write_text(IMPORTING)
    outcome, text = _run(path, ensure_has_triton_under_interpreter)
    assert outcome == "applied"
    fix = 'if os.environ.get("TRITON_INTERPRET") == "1":\n    HAS_TRITON = find_spec("triton") is not None\n'
    assert text.index("HAS_TRITON = False") < text.index(fix) < text.index("if not HAS_TRITON:")
    assert _run(path, ensure_has_triton_under_interpreter) == ("present", text)
    compile(text, str(path), "exec")


def test_mask_fix_applies_once(tmp_path):
    path = tmp_path / "interpreter.py"
    path.write_text(INTERPRETER)
    outcome, text = _run(path, ensure_interpreter_bool_masks)
    assert outcome == "applied"
    assert text == INTERPRETER.replace("mask.data,", "mask.data.astype(bool),").replace(
        "value.data, mask.data)", "value.data, mask.data.astype(bool))")
    assert _run(path, ensure_interpreter_bool_masks) == ("present", text)


def test_libdevice_fix_applies_once_before_patch_lang_returns(tmp_path):
    path = tmp_path / "interpreter.py"
    path.write_text(PATCH_LANG)
    outcome, text = _run(path, ensure_interpreter_libdevice)
    assert outcome == "applied"
    assert text.index("def _patch_libdevice(scope):") < text.index("def _patch_lang(fn):")
    assert text.endswith("    _patch_libdevice(scope)\n    return scope\n")
    assert '"log1p": np.log1p,' in text
    assert _run(path, ensure_interpreter_libdevice) == ("present", text)
    compile(text, str(path), "exec")


def test_patch_once_fix_marks_the_patched_modules_and_guards_the_device_call(tmp_path):
    path = tmp_path / "interpreter.py"
    path.write_text(PATCH_ONCE)
    outcome, text = _run(path, ensure_interpreter_patch_once)
    assert outcome == "applied"
    assert ("        _patch_builtin(lang, interpreter_builder, scope)\n"
            "        scope.set_attr(lang, \"_glm53_patched_for_interpreter\", True)\n"
            "    return scope\n") in text
    assert ("        # This is a device function call\n"
            "        if not _lang_patched(self.fn):\n"
            "            _patch_lang(self.fn)\n        fn = self.rewrite()\n") in text
    assert text.index("def _lang_patched(fn):") < text.index("def _patch_lang(fn):")
    assert _run(path, ensure_interpreter_patch_once) == ("present", text)
    compile(text, str(path), "exec")


def test_patch_once_skips_only_where_every_module_the_function_sees_is_marked(tmp_path):
    """The added _lang_patched, run: true only while every language module in the function's
    globals carries the mark; a function seeing none, or one unmarked, is patched as before."""
    path = tmp_path / "interpreter.py"
    path.write_text(PATCH_ONCE)
    ensure_interpreter_patch_once(path)
    text = path.read_text()
    helper = text[text.index("def _lang_patched(fn):"):text.index("def _patch_lang(fn):")]
    core = types.ModuleType("triton.language.core")
    lang = types.ModuleType("triton.language")
    lang.core = core
    space = {"inspect": inspect, "tl": lang}
    exec(helper, space)
    lang_patched = space["_lang_patched"]

    def seeing(**modules):
        return types.FunctionType(compile("def f(): pass", "f", "exec").co_consts[0], modules)

    assert not lang_patched(seeing(tl=lang))
    lang._glm53_patched_for_interpreter = True
    assert lang_patched(seeing(tl=lang))
    assert not lang_patched(seeing(tl=lang, core=core))
    core._glm53_patched_for_interpreter = True
    assert lang_patched(seeing(tl=lang, core=core))
    assert not lang_patched(seeing(np=inspect))


# each fix, given a file an upstream change moved or one it half fixed, refuses it unchanged
@pytest.mark.parametrize("fix, name, moved", [
    (ensure_has_triton_under_interpreter, "importing.py", IMPORTING.replace("import os\n", "")),
    (ensure_has_triton_under_interpreter, "importing.py", IMPORTING.replace("from importlib.util import find_spec\n", "import importlib.util\n")),
    (ensure_has_triton_under_interpreter, "importing.py", IMPORTING.replace("if HAS_TRITON:", "if HAS_TRITON and True:")),
    (ensure_has_triton_under_interpreter, "importing.py", IMPORTING + "if HAS_TRITON:\n    pass\n"),
    (ensure_interpreter_bool_masks, "interpreter.py", INTERPRETER.replace("class InterpreterBuilder", "class Builder")),
    (ensure_interpreter_bool_masks, "interpreter.py", INTERPRETER.replace("ptrs.data, mask.data, other", "ptrs.data, mask, other")),
    (ensure_interpreter_bool_masks, "interpreter.py", INTERPRETER.replace("return _interpreter.store", "return _interp.store")),
    (ensure_interpreter_bool_masks, "interpreter.py", INTERPRETER.replace("value.data, mask.data)", "value.data, mask.data.astype(bool))")),
    (ensure_interpreter_libdevice, "interpreter.py", PATCH_LANG.replace("def _patch_lang(fn):", "def _patch_language(fn):")),
    (ensure_interpreter_libdevice, "interpreter.py", PATCH_LANG.replace("    return scope\n", "    return None\n")),
    (ensure_interpreter_libdevice, "interpreter.py", PATCH_LANG.replace("import numpy as np\n", "import numpy\n")),
    (ensure_interpreter_libdevice, "interpreter.py", PATCH_LANG.replace("class TensorHandle:", "class Handle:")),
    (ensure_interpreter_libdevice, "interpreter.py", PATCH_LANG.replace("    return scope\n", "    _patch_libdevice(scope)\n    return scope\n")),
    (ensure_interpreter_patch_once, "interpreter.py", PATCH_ONCE.replace("class InterpretedFunction:", "class JITFunction:")),
    (ensure_interpreter_patch_once, "interpreter.py", PATCH_ONCE.replace("for lang in langs:", "for module in langs:").replace("(lang,", "(module,")),
    (ensure_interpreter_patch_once, "interpreter.py", PATCH_ONCE.replace("        _patch_lang(self.fn)\n", "        _patch_lang(self.rewrite())\n")),
    (ensure_interpreter_patch_once, "interpreter.py", PATCH_ONCE.replace("import inspect\n", "from inspect import ismodule\n")),
    (ensure_interpreter_patch_once, "interpreter.py", PATCH_ONCE.replace("        _patch_builtin(lang, interpreter_builder, scope)\n", "        _patch_builtin(lang, interpreter_builder, scope)\n        scope.set_attr(lang, \"_glm53_patched_for_interpreter\", True)\n")),
], ids=["has-triton-no-os", "has-triton-no-find_spec", "has-triton-gate-reshaped", "has-triton-two-gates",
        "masks-no-builder", "masks-load-reshaped", "masks-store-renamed", "masks-half-fixed",
        "libdevice-no-patch-lang", "libdevice-returns-other", "libdevice-numpy-renamed", "libdevice-no-tensor-handle", "libdevice-half-fixed",
        "patch-once-no-interpreted-function", "patch-once-loop-renamed", "patch-once-call-reshaped",
        "patch-once-inspect-renamed", "patch-once-half-fixed"])
def test_each_fix_refuses_a_moved_or_half_fixed_file(tmp_path, fix, name, moved):
    path = tmp_path / name
    path.write_text(moved)
    with pytest.raises(FixRefused, match=name):
        fix(path)
    assert path.read_text() == moved
