"""v8's merged-linear scale change: vLLM's ModelOpt NVFP4 linears honour each shard's global.

A merged linear (qkv, gate_up, Glm5Next's fused_qkv_a, KDA's in_proj) runs its shards as one
GEMM, and vLLM's ModelOpt NVFP4 linear keeps one global for them all, ``weight_scale_2.max()``,
leaving the block scales as they are, so a shard exported with a smaller global decodes off by
``kept / own`` (it warns "the global weight scale differs across parallel layers"). The edit
decorates every ModelOpt linear method's ``process_weights_after_loading`` with
``honour_shard_global_scales`` and its ``apply`` with ``scale_shard_outputs``, from
``patches/v8/linear_global_scales.py`` (installed beside modelopt.py): each shard's output
columns are scaled by ``own / kept``. Nothing of vLLM's own text changes.

Base-aware by shape: a module that keeps ``weight_scale_2.max()`` is patched; one that keeps
neither the max nor the warning provides the fix itself; one that still warns but no longer
keeps the max is refused as drift.
"""

from __future__ import annotations

import libcst as cst

from recipekit.codepatch import (
    PATCHES_DIR,
    CodePatchLayer,
    StepLog,
    dotted,
    ensure_decorator,
    statement,
)
from recipekit.tree import TreeView

TARGET = "vllm/model_executor/layers/quantization/modelopt.py"
HELPER_SOURCE = PATCHES_DIR / "v8" / "linear_global_scales.py"
HELPER = "vllm/model_executor/layers/quantization/glm53_linear_scales.py"
BASE = "LinearMethodBase"
DECORATORS = {"process_weights_after_loading": "honour_shard_global_scales",
              "apply": "scale_shard_outputs"}
HELPER_IMPORT = ("from vllm.model_executor.layers.quantization.glm53_linear_scales import "
                 "honour_shard_global_scales, scale_shard_outputs\n")
KEEPS_MAX = "weight_scale_2.max()"  # the one global vLLM keeps for every shard
WARNS = "global weight scale differs across"  # vLLM's warning when the shards' differ


def linear_methods(module: cst.Module) -> list[cst.ClassDef]:
    """The module's top-level ``LinearMethodBase`` subclasses defining both decorated methods."""
    found = []
    for node in module.body:
        if isinstance(node, cst.ClassDef) and any(dotted(arg.value) == BASE for arg in node.bases):
            methods = {item.name.value for item in node.body.body
                       if isinstance(item, cst.FunctionDef)}
            if set(DECORATORS) <= methods:
                found.append(node)
    return found


class LinearGlobalScales(CodePatchLayer):
    name = "v8_linear_scales"
    target = TARGET
    helper_source = HELPER_SOURCE
    helper_target = HELPER

    def base_problem(self, view: TreeView) -> str | None:
        text = view.read_text(TARGET)
        if text is None:
            return f"{TARGET} is missing; this base has no ModelOpt quantization"
        if KEEPS_MAX not in text and WARNS in text:
            return (f"{TARGET}: still warns that '{WARNS} parallel layers' but no longer keeps "
                    f"{KEEPS_MAX}; the base drifted, check how it picks a merged linear's global")
        if KEEPS_MAX in text and not linear_methods(cst.parse_module(text)):
            return (f"{TARGET}: keeps {KEEPS_MAX} but has no {BASE} subclass with "
                    f"process_weights_after_loading and apply; the base drifted")
        return None

    def provided_by_base(self, view: TreeView) -> str | None:
        text = view.read_text(TARGET)
        if text is None or KEEPS_MAX in text or WARNS in text:
            return None
        return (f"{TARGET}: no longer keeps {KEEPS_MAX} for a merged NVFP4 linear nor warns "
                "that its shards' globals differ: the base honours each shard's global itself")

    def rewrite(self, module: cst.Module, log: StepLog) -> cst.Module:
        wanted_import = statement(HELPER_IMPORT)
        body = list(module.body)
        present = any(node.deep_equals(wanted_import) for node in body)
        log.record("import the merged-linear scale helper", present)
        replaced = {}
        for cls in linear_methods(module):
            new_body = []
            for item in cls.body.body:
                if isinstance(item, cst.FunctionDef) and item.name.value in DECORATORS:
                    item = ensure_decorator(item, DECORATORS[item.name.value], log)
                new_body.append(item)
            replaced[cls] = cls.with_changes(body=cls.body.with_changes(body=new_body))
        body = [replaced.get(node, node) for node in body]
        if not present:
            first_class = min(i for i, node in enumerate(body) if node in replaced.values())
            last_import = max(i for i, n in enumerate(body[:first_class])
                              if isinstance(n, cst.SimpleStatementLine)
                              and isinstance(n.body[0], (cst.Import, cst.ImportFrom)))
            body.insert(last_import + 1, wanted_import)
        return module.with_changes(body=body)

    def missing_capability(self, view: TreeView) -> list[str]:
        if self.provided_by_base(view):
            return []
        text = view.read_text(TARGET) or ""
        problems = []
        for cls in linear_methods(cst.parse_module(text)) if text else ():
            for item in cls.body.body:
                if isinstance(item, cst.FunctionDef) and item.name.value in DECORATORS:
                    if DECORATORS[item.name.value] not in {dotted(d.decorator)
                                                           for d in item.decorators}:
                        problems.append(f"{TARGET}: {cls.name.value}.{item.name.value} is not "
                                        f"decorated with {DECORATORS[item.name.value]}")
        if not view.exists(HELPER):
            problems.append(f"{HELPER} is missing")
        return problems


def build(**_: object) -> LinearGlobalScales:
    return LinearGlobalScales()
