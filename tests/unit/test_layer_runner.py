"""The layer runner's probe/apply/verify sequence, with a small synthetic layer."""


import pytest

from recipekit.exact_patch import FileEdit, PatchPlan, PatchRefused
from recipekit.layer import Layer, LayerSetupError, run_layer


class TinyLayer(Layer):
    """Adds vllm/feature.py with the given text; the capability is that file's FLAG."""

    name = "tiny"

    def __init__(self, text="FLAG = True\n", provided=False, refuse=None):
        self.text, self.provided, self.refuse = text, provided, refuse

    def plan(self, view):
        if self.refuse:
            raise PatchRefused(self.refuse)
        current = view.read_text("vllm/feature.py")
        if current == self.text:
            return PatchPlan("already-applied")
        return PatchPlan("apply", [FileEdit("vllm/feature.py", None, self.text.encode())])

    def missing_capability(self, view):
        return [] if "FLAG" in (view.read_text("vllm/feature.py") or "") else ["vllm/feature.py lacks FLAG"]

    def provided_by_base(self, view):
        return "the base has it" if self.provided else None

    def importable_modules(self, files):
        return ["vllm.feature"]


@pytest.fixture
def tree(tmp_path):
    (tmp_path / "vllm").mkdir()
    (tmp_path / "vllm" / "__init__.py").write_text("")
    (tmp_path / "vllm" / "present.py").write_text("def there():\n    pass\n")
    return tmp_path


def test_apply_then_already_applied(tree):
    first = run_layer(TinyLayer(), tree, import_check="off")
    assert (first.outcome, first.files) == ("applied", ["vllm/feature.py"])
    assert "not checked (--import-check off)" in first.reason
    assert run_layer(TinyLayer(), tree).outcome == "already-applied"


def test_provided_by_base_wins_over_a_refused_plan(tree):
    result = run_layer(TinyLayer(provided=True, refuse="drifted"), tree)
    assert (result.outcome, result.reason) == ("provided-by-base", "the base has it")


def test_refusal_is_passed_on(tree):
    result = run_layer(TinyLayer(refuse="x.py: anchor gone"), tree)
    assert (result.outcome, result.reason) == ("refused", "x.py: anchor gone")


def test_unresolved_import_fails_verify_and_writes_nothing(tree):
    result = run_layer(TinyLayer("from vllm.present import missing\nFLAG = 1\n"), tree)
    assert result.outcome == "refused"
    assert "vllm/feature.py:1: vllm.present defines no missing" in result.reason
    assert not (tree / "vllm" / "feature.py").exists()


def test_check_mode_writes_nothing(tree):
    result = run_layer(TinyLayer(), tree, check=True)
    assert result.outcome == "applied" and "nothing written" in result.reason
    assert not (tree / "vllm" / "feature.py").exists()


def test_failed_module_import_restores_the_tree(tree):
    result = run_layer(TinyLayer("raise RuntimeError('boom at import')\nFLAG = 1\n"), tree, import_check="on")
    assert result.outcome == "refused"
    assert "import vllm.feature failed: RuntimeError: boom at import" in result.reason
    assert not (tree / "vllm" / "feature.py").exists()


def test_modules_import_when_they_can(tree):
    result = run_layer(TinyLayer(), tree, import_check="on")
    assert result.outcome == "applied" and "1 touched modules import" in result.reason


def test_a_root_without_vllm_is_a_setup_error(tmp_path):
    with pytest.raises(LayerSetupError, match="no vllm/__init__.py here"):
        run_layer(TinyLayer(), tmp_path)
