"""v13's weight-group change: after a model's weights load, the target's BF16 non-MoE linears
of the chosen groups become INT8 weight-only and the DFlash2 drafter's NVFP4 weight-only,
through vLLM's own schemes (``patches/v13/weight_groups.py``, installed as
``vllm/model_executor/model_loader/glm53_weight_groups.py``).

The edit: ``process_weights_after_loading(model, model_config, target_device)`` of
``vllm/model_executor/model_loader/utils.py`` is decorated with ``with_weight_groups``. Before
it, every name the helper relies on is checked on the base, and drift is refused: each
group's owner class assigns each of its linears from the expected vLLM linear class (the
Glm5Next model code and the DFlash2 drafter's), and vLLM's schemes and quantize/pack
functions have the parameters the helper passes.
"""

from __future__ import annotations

import ast

import libcst as cst

from recipekit.codepatch import (
    PATCHES_DIR,
    StepLog,
    decorator_gaps,
    ensure_decorator,
    statement,
)
from recipekit.exact_patch import PatchRefused
from recipekit.layers.glm5next import PACKAGE, Glm5NextPatchLayer
from recipekit.tree import TreeView

TARGET = "vllm/model_executor/model_loader/utils.py"
HELPER_SOURCE = PATCHES_DIR / "v13" / "weight_groups.py"
HELPER = "vllm/model_executor/model_loader/glm53_weight_groups.py"
SEAM = "process_weights_after_loading"
SEAM_PARAMETERS = ("model", "model_config", "target_device")
DECORATOR = "with_weight_groups"
HELPER_IMPORT = f"from vllm.model_executor.model_loader.glm53_weight_groups import {DECORATOR}\n"

# 0.30.0 keeps Glm5Next's model code in nvidia/, 0.33.0 in common/
NVIDIA = f"{PACKAGE}/{{nvidia,common}}"
MODELS = "vllm/model_executor/models"
# class -> (file, {attribute: the class it is built from}); what GROUPS and DRAFT_OWNERS of
# the helper resolve through at run time
OWNERS = {
    "Glm5NextMoE": (f"{NVIDIA}/model.py", {"shared_experts": "Glm5NextMLP"}),
    "Glm5NextMLP": (f"{NVIDIA}/model.py", {"gate_up_proj": "MergedColumnParallelLinear",
                                          "down_proj": "RowParallelLinear"}),
    "Glm5NextMLAAttention": (f"{NVIDIA}/attention.py", {"q_b_proj": "ColumnParallelLinear",
                                                       "o_proj": "RowParallelLinear"}),
    "Glm5NextLinearAttention": (f"{NVIDIA}/kda.py", {
        "in_proj_qkvbfg_a": "_Glm5NextMergedColumnParallelLinear",
        "o_proj": "RowParallelLinear"}),
    "Glm5NextForCausalLM": (f"{NVIDIA}/model.py", {"lm_head": "ParallelLMHead"}),
    "DFlashQwen3Attention": (f"{MODELS}/qwen3_dflash.py", {"qkv_proj": "QKVParallelLinear",
                                                          "o_proj": "RowParallelLinear"}),
    "Qwen2MLP": (f"{MODELS}/qwen2.py", {"gate_up_proj": "MergedColumnParallelLinear",
                                       "down_proj": "RowParallelLinear"}),
    "DFlashQwen3Model": (f"{MODELS}/qwen3_dflash.py", {"fc": "ReplicatedLinear"}),
}
# a subclass the helper matches by name -> (file, the base class it must extend)
SUBCLASSES = {"DFlash2Qwen3Model": (f"{MODELS}/qwen3_dflash2.py", "DFlashQwen3Model"),
              "DFlash2Qwen3ForCausalLM": (f"{MODELS}/qwen3_dflash2.py",
                                          "DFlashQwen3ForCausalLM")}
# imported first, in a fresh interpreter, after the change: how every model module meets it
MODEL_ENTRY_MODULES = ("vllm.model_executor.models.utils",)
QUANT = "vllm/model_executor/layers/quantization"
SCHEMES = f"{QUANT}/compressed_tensors/schemes"
# (file, class or None, function) -> parameters it must take, in this order
SIGNATURES = {
    (TARGET, None, SEAM): SEAM_PARAMETERS,
    (f"{SCHEMES}/compressed_tensors_wNa16.py", "CompressedTensorsWNA16", "__init__"):
        ("self", "strategy", "num_bits", "group_size", "symmetric", "layer_name"),
    (f"{SCHEMES}/compressed_tensors_wNa16.py", "CompressedTensorsWNA16", "create_weights"):
        ("self", "layer", "output_size", "input_size", "output_partition_sizes",
         "input_size_per_partition", "params_dtype", "weight_loader"),
    (f"{SCHEMES}/compressed_tensors_w4a4_nvfp4.py", "CompressedTensorsW4A4Fp4", "__init__"):
        ("self", "use_a16"),
    (f"{SCHEMES}/compressed_tensors_w4a4_nvfp4.py", "CompressedTensorsW4A4Fp4",
     "create_weights"):
        ("self", "layer", "output_partition_sizes", "input_size_per_partition", "params_dtype",
         "weight_loader"),
    (f"{QUANT}/compressed_tensors/compressed_tensors.py", "CompressedTensorsLinearMethod",
     "__init__"): ("self", "quantization_config"),
    (f"{QUANT}/compressed_tensors/compressed_tensors.py", "CompressedTensorsLinearMethod",
     "apply"): ("self", "layer", "x", "bias"),
    (f"{QUANT}/utils/quant_utils.py", None, "quantize_weights"):
        ("w", "quant_type", "group_size"),
    (f"{QUANT}/utils/quant_utils.py", None, "pack_quantized_values_into_int32"):
        ("w_q", "wtype", "packed_dim"),
    (f"{QUANT}/utils/quant_utils.py", None, "unpack_quantized_values_into_int32"):
        ("w_q", "wtype", "packed_dim"),
    (f"{QUANT}/utils/nvfp4_emulation_utils.py", None, "ref_nvfp4_quant"):
        ("x", "global_scale", "block_size"),
    (f"{QUANT}/utils/nvfp4_emulation_utils.py", None, "dequantize_to_dtype"):
        ("tensor_fp4", "tensor_sf", "global_scale", "dtype", "block_size", "swizzle"),
    (f"{QUANT}/utils/nvfp4_emulation_utils.py", None, "cast_to_fp4"): ("x",),
    (f"{QUANT}/utils/nvfp4_emulation_utils.py", None, "get_reciprocal"): ("x",),
}
# module-level names the helper imports, by file
NAMES = {
    f"{QUANT}/utils/nvfp4_emulation_utils.py": ("FLOAT4_E2M1_MAX", "kE2M1ToFloat_handle"),
    f"{SCHEMES}/__init__.py": ("CompressedTensorsW4A4Fp4", "CompressedTensorsWNA16"),
}


def candidates(path: str) -> list[str]:
    if "{nvidia,common}" not in path:
        return [path]
    return [path.replace("{nvidia,common}", d) for d in ("nvidia", "common")]


def owner_file(view: TreeView, path: str) -> str:
    """The first of a path's candidates the base has (a missing one is refused on parse)."""
    return next((p for p in candidates(path) if view.exists(p)), candidates(path)[0])


def _parse(view: TreeView, path: str) -> ast.Module:
    text = view.read_text(path)
    if text is None:
        raise PatchRefused(f"{path} is missing; v13's weight groups need it (base drifted)")
    return ast.parse(text)


def _class(module: ast.Module, name: str, path: str) -> ast.ClassDef:
    for node in module.body:
        if isinstance(node, ast.ClassDef) and node.name == name:
            return node
    raise PatchRefused(f"{path}: class {name} not found; v13's weight groups need it")


def attribute_classes(cls: ast.ClassDef) -> dict[str, set[str]]:
    """self.NAME = CALLEE(...) in the class's __init__: NAME -> the callees' names."""
    out: dict[str, set[str]] = {}
    init = next((n for n in cls.body if isinstance(n, ast.FunctionDef)
                 and n.name == "__init__"), None)
    for node in ast.walk(init) if init else ():
        if not (isinstance(node, ast.Assign) and isinstance(node.value, ast.Call)):
            continue
        callee = node.value.func
        name = callee.id if isinstance(callee, ast.Name) else getattr(callee, "attr", None)
        for target in node.targets:
            if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) \
                    and target.value.id == "self" and name:
                out.setdefault(target.attr, set()).add(name)
    return out


def resolved_owners(view: TreeView) -> dict[str, dict[str, set[str]]]:
    """Each owner class's attributes as the base builds them; refuses what drifted."""
    out = {}
    for owner, (pattern, wanted) in OWNERS.items():
        path = owner_file(view, pattern)
        have = attribute_classes(_class(_parse(view, path), owner, path))
        for attribute, callee in wanted.items():
            if callee not in have.get(attribute, set()):
                built = ", ".join(sorted(have.get(attribute, set()))) or "nothing"
                raise PatchRefused(f"{path}: {owner}.{attribute} is built from {built}, not "
                                   f"{callee}; v13's weight groups do not know this base")
        out[owner] = have
    for sub, (path, base) in SUBCLASSES.items():
        cls = _class(_parse(view, path), sub, path)
        if base not in {getattr(b, "id", getattr(b, "attr", "")) for b in cls.bases}:
            raise PatchRefused(f"{path}: {sub} does not extend {base}; the drafter drifted")
    return out


def _function(module: ast.Module, cls: str | None, name: str, path: str) -> ast.FunctionDef:
    body = module.body if cls is None else _class(module, cls, path).body
    for node in body:
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return node
    where = f"{cls}.{name}" if cls else name
    raise PatchRefused(f"{path}: {where} not found; v13's weight groups call it")


def check_signatures(view: TreeView) -> None:
    for (path, cls, name), wanted in SIGNATURES.items():
        func = _function(_parse(view, path), cls, name, path)
        have = [a.arg for a in func.args.posonlyargs + func.args.args]
        have += [a.arg for a in func.args.kwonlyargs]
        if [p for p in wanted if p not in have]:
            where = f"{cls}.{name}" if cls else name
            raise PatchRefused(f"{path}: {where}({', '.join(have)}) lacks "
                               f"{', '.join(p for p in wanted if p not in have)}; the base "
                               f"drifted from what v13's weight groups call")
    for path, names in NAMES.items():
        text = view.read_text(path) or ""
        missing = [n for n in names if n not in text]
        if missing:
            raise PatchRefused(f"{path}: no {', '.join(missing)}; v13's weight groups import it")


class WeightGroups(Glm5NextPatchLayer):
    name = "v13_weights"
    target = TARGET
    helper_source = HELPER_SOURCE
    helper_target = HELPER

    def base_problem(self, view: TreeView) -> str | None:
        problem = super().base_problem(view)
        if problem:
            return problem
        resolved_owners(view)
        check_signatures(view)
        return None

    def rewrite(self, module: cst.Module, log: StepLog) -> cst.Module:
        body = list(module.body)
        wanted_import = statement(HELPER_IMPORT)
        present = any(node.deep_equals(wanted_import) for node in body)
        log.record("import the weight-group helper", present)
        seam = next((i for i, n in enumerate(body)
                     if isinstance(n, cst.FunctionDef) and n.name.value == SEAM), None)
        if seam is None:
            raise PatchRefused(f"{TARGET}: function {SEAM} not found; the base drifted")
        body[seam] = ensure_decorator(body[seam], DECORATOR, log)
        if not present:
            last_import = max(i for i, n in enumerate(body[:seam])
                              if isinstance(n, cst.SimpleStatementLine)
                              and isinstance(n.body[0], (cst.Import, cst.ImportFrom)))
            body.insert(last_import + 1, wanted_import)
        return module.with_changes(body=body)

    def missing_capability(self, view: TreeView) -> list[str]:
        return decorator_gaps(view, TARGET, HELPER, lambda source: {SEAM: DECORATOR})

    def importable_modules(self, files: list[str]) -> list[str]:
        # the touched modules, and the ones vLLM's model registry imports first: a model
        # module reaches model_loader/utils.py through the model utilities, an order in
        # which a helper importing vLLM's quantization package at its top closes a cycle
        return [*super().importable_modules(files), *MODEL_ENTRY_MODULES]

    def provided_by_base(self, view: TreeView) -> str | None:
        return None


def build(**_: object) -> WeightGroups:
    return WeightGroups()
