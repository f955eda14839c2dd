"""patches/v11/dflash_block_drop.py on its own (it imports nothing of vLLM): DFlash gets no
trailing-block drop, every other method the base's answer."""

import ast
import importlib.util

import pytest

from recipekit.codepatch import PATCHES_DIR


def helper():
    spec = importlib.util.spec_from_file_location("dflash_block_drop", PATCHES_DIR / "v11" / "dflash_block_drop.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def config_class(block_drop):
    class Config:
        def __init__(self, method, disabled=False):
            self.method, self.disabled = method, disabled

        @block_drop.without_dflash_block_drop
        def use_eagle_block_drop(self):
            return self.method in ("eagle", "eagle3", "mtp", "dflash") and not self.disabled

    return Config


@pytest.mark.parametrize("method, disabled, expected", [
    ("dflash", False, False),  # the change
    ("eagle", False, True), ("eagle3", False, True), ("mtp", False, True),
    ("eagle", True, False), ("ngram", False, False), (None, False, False),
])
def test_the_decorated_method_drops_for_every_method_but_dflash(method, disabled, expected):
    assert config_class(helper())(method, disabled).use_eagle_block_drop() is expected


def test_the_decorated_method_keeps_the_base_method_to_undo():
    config = config_class(helper())
    assert config.use_eagle_block_drop.__wrapped__(config("dflash")) is True


@pytest.mark.parametrize("use_eagle, method, expected", [
    (True, "dflash", False), (True, "eagle", True), (True, "mtp", True), (False, "eagle", False),
])
def test_the_fork_shapes_gate(use_eagle, method, expected):
    speculative_config = type("SpeculativeConfig", (), {"method": method})()
    assert helper().drops_trailing_block(use_eagle, speculative_config) is expected


def test_the_helper_imports_nothing_of_vllm():
    """vllm/config/speculative.py imports it while vllm.config is half built."""
    tree = ast.parse((PATCHES_DIR / "v11" / "dflash_block_drop.py").read_text())
    imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    imported |= {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert imported and not {name for name in imported if name.split(".")[0] == "vllm"}
