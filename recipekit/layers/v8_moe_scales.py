"""v8's MoE scale change: vLLM's ModelOpt NVFP4 fused MoE honours each half's global scale.

``ModelOptNvFp4FusedMoE.process_weights_after_loading`` keeps the gate's global scale
(``w13_weight_scale_2[:, 0]``) for the fused gate+up GEMM, so the up half of an expert exported
with its own global decodes off by their ratio (vLLM #54974; the default checkpoint's boots log
its warning). The edit decorates that method with ``honour_w13_global_scales`` of
``patches/v8/moe_global_scales.py`` (installed beside modelopt.py): on Marlin W4A16 it scales
each up output row by its expert's ratio before the activation (exact), elsewhere it folds each
half's ratio into its block scales before the method runs; nothing of vLLM's own text changes.

Base-aware by shape: the method picking ``w13_weight_scale_2[:, 0]`` alone is what is patched;
a base whose method no longer does, and no longer warns that the two must match, provides the
fix itself (upstream's PRs #55073 / #56095 shape); one that still warns but picks otherwise is
refused as drift.
"""

from __future__ import annotations

import ast

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
from recipekit.exact_patch import PatchRefused
from recipekit.tree import TreeView

TARGET = "vllm/model_executor/layers/quantization/modelopt.py"
HELPER_SOURCE = PATCHES_DIR / "v8" / "moe_global_scales.py"
HELPER = "vllm/model_executor/layers/quantization/glm53_moe_scales.py"
CLASS = "ModelOptNvFp4FusedMoE"
METHOD = "process_weights_after_loading"
DECORATOR = "honour_w13_global_scales"
HELPER_IMPORT = (
    f"from vllm.model_executor.layers.quantization.glm53_moe_scales import {DECORATOR}\n")
GATE_ONLY = "w13_weight_scale_2[:, 0]"  # the gate's global, picked for both halves
MUST_MATCH = "w1_weight_scale_2 must match w3_weight_scale_2"  # vLLM's warning


def find_method_node(view: TreeView) -> ast.FunctionDef | None:
    """ModelOptNvFp4FusedMoE.process_weights_after_loading as parsed, or None."""
    text = view.read_text(TARGET)
    for node in ast.parse(text).body if text is not None else ():
        if isinstance(node, ast.ClassDef) and node.name == CLASS:
            return next((item for item in node.body
                         if isinstance(item, ast.FunctionDef) and item.name == METHOD), None)
    return None


def picks_gate_only(method: ast.FunctionDef) -> bool:
    """Whether the method assigns from ``layer.w13_weight_scale_2[:, 0]`` (by syntax, not
    spacing; the warning's comparison of the two columns is not a pick)."""
    return any(isinstance(node, ast.Assign) and any(
        isinstance(part, ast.Subscript) and ast.unparse(part).endswith(GATE_ONLY)
        for part in ast.walk(node.value)) for node in ast.walk(method))


def warns_must_match(method: ast.FunctionDef) -> bool:
    return any(isinstance(node, ast.Constant) and isinstance(node.value, str)
               and MUST_MATCH in node.value for node in ast.walk(method))


class MoeGlobalScales(CodePatchLayer):
    name = "v8_moe_scales"
    target = TARGET
    helper_source = HELPER_SOURCE
    helper_target = HELPER

    def base_problem(self, view: TreeView) -> str | None:
        method = find_method_node(view)
        if method is None:
            return (f"{TARGET}: {CLASS}.{METHOD} not found; this base has no ModelOpt NVFP4 "
                    "fused MoE of the shape v8_moe_scales patches")
        if not picks_gate_only(method) and warns_must_match(method):
            return (f"{TARGET}: {CLASS}.{METHOD} still warns '{MUST_MATCH}' but no longer "
                    f"reads {GATE_ONLY}; the base drifted, check how it picks w13's global")
        return None

    def provided_by_base(self, view: TreeView) -> str | None:
        method = find_method_node(view)
        if method is None or picks_gate_only(method) or warns_must_match(method):
            return None
        return (f"{TARGET}: {CLASS}.{METHOD} no longer keeps the gate's global scale "
                f"({GATE_ONLY}) for both halves nor warns that they must match: the base "
                "honours each half's global itself (vLLM #55073's shape)")

    def rewrite(self, module: cst.Module, log: StepLog) -> cst.Module:
        body = list(module.body)
        wanted_import = statement(HELPER_IMPORT)
        present = any(node.deep_equals(wanted_import) for node in body)
        log.record("import the MoE scale helper", present)
        cls = find_class(module, CLASS, TARGET)
        method = find_method(cls, METHOD, TARGET)
        new_method = ensure_decorator(method, DECORATOR, log)
        new_cls = cls.with_changes(body=cls.body.with_changes(
            body=[new_method if node is method else node for node in cls.body.body]))
        body = [new_cls if node is cls else node for node in body]
        if not present:
            last_import = max(i for i, n in enumerate(body)
                              if isinstance(n, cst.SimpleStatementLine)
                              and isinstance(n.body[0], (cst.Import, cst.ImportFrom))
                              and body.index(new_cls) > i)
            body.insert(last_import + 1, wanted_import)
        return module.with_changes(body=body)

    def missing_capability(self, view: TreeView) -> list[str]:
        if self.provided_by_base(view):
            return []
        method = find_method_node(view)
        problems = []
        if method is None or DECORATOR not in {ast.unparse(d) for d in method.decorator_list}:
            problems.append(f"{TARGET}: {CLASS}.{METHOD} is not decorated with {DECORATOR}")
        if not view.exists(HELPER):
            problems.append(f"{HELPER} is missing")
        return problems


def build(**_: object) -> MoeGlobalScales:
    return MoeGlobalScales()
