# SPDX-License-Identifier: Apache-2.0
"""Weight-only quantization of chosen BF16 linears, right after a model's weights load.

Installed beside vllm/model_executor/model_loader/utils.py by the GLM-5.3-Flash DGX Spark
recipe's v13 layer, which decorates ``process_weights_after_loading`` with
``with_weight_groups``. After the base has processed every layer, the target's BF16
non-MoE linears of the chosen groups (Glm5Next) become INT8 weight-only (vLLM's
CompressedTensorsWNA16, 8 bits, symmetric, group 64 or 128: GPTQ-Marlin on CUDA) and the
DFlash2 drafter's linears NVFP4 weight-only (vLLM's CompressedTensorsW4A4Fp4 in its A16
form: Marlin FP4). Quantizing and packing use vLLM's own code (quantize_weights,
pack_quantized_values_into_int32, ref_nvfp4_quant, cast_to_fp4); the BF16 tensors are freed.
NVFP4 on target groups searches each block's FP8 scale for the least squared error; the
drafter keeps ref_nvfp4_quant's amax scales, the setting the seed measured. The
weight reads of those linears are a large share of a decode step on GB10; the seed's v13
measured them (see docs/quality.md for what was proven here and what a Spark owner runs).

Settings (the recipe sets them identically on every rank; unset means off):
  GLM53_INT8_W8A16        comma list of shared, mla, kda_o, kda_in, lm_head (target)
  GLM53_INT_GROUP_SIZE    64 or 128 (default 128)
  GLM53_DRAFT_WEIGHTS     nvfp4: the drafter's linears to NVFP4 weight-only; bf16: as loaded
  GLM53_TARGET_WEIGHT_FORMAT  int8 (default) or nvfp4 (searched block scales); NVFP4 failed
                          the seed's quality gate on KL, so nvfp4 is refused unless
                          GLM53_FORCE_UNSAFE_WEIGHTS=1
"""

from __future__ import annotations

import functools
import os

import torch

from vllm.logger import init_logger
from vllm.model_executor.layers.quantization.utils.nvfp4_emulation_utils import (
    FLOAT4_E2M1_MAX,
    cast_to_fp4,
    get_reciprocal,
    kE2M1ToFloat_handle,
    ref_nvfp4_quant,
)
from vllm.model_executor.layers.quantization.utils.quant_utils import (
    pack_quantized_values_into_int32,
    quantize_weights,
)
from vllm.scalar_type import scalar_types

logger = init_logger(__name__)

# group -> (the class that owns the linears, their attribute paths in it); the seed's v13
GROUPS = {
    "shared": ("Glm5NextMoE", ("shared_experts.gate_up_proj", "shared_experts.down_proj")),
    "mla": ("Glm5NextMLAAttention", ("q_b_proj", "o_proj")),
    "kda_o": ("Glm5NextLinearAttention", ("o_proj",)),
    "kda_in": ("Glm5NextLinearAttention", ("in_proj_qkvbfg_a",)),
    "lm_head": ("Glm5NextForCausalLM", ("lm_head",)),
}
TARGET_ROOTS = ("Glm5NextForCausalLM", "Glm5NextForConditionalGeneration")
# the DFlash2 drafter's linears: attention, MLP and the context projection
DRAFT_OWNERS = {
    "DFlashQwen3Attention": ("qkv_proj", "o_proj"),
    "Qwen2MLP": ("gate_up_proj", "down_proj"),
    "DFlash2Qwen3Model": ("fc",),
}
DRAFT_ROOTS = ("DFlash2Qwen3ForCausalLM",)
GROUP_SIZES = (64, 128)
TARGET_FORMATS = ("int8", "nvfp4")
UNSAFE_TARGET_FORMATS = {
    "nvfp4": "NVFP4 on target groups failed the seed's v13 quality gate on KL; judge it with "
             "scripts/compare --candidate TARGET_WEIGHT_FORMAT=nvfp4 on your Spark",
}
NVFP4_BLOCK = 16
FLOAT8_E4M3_MAX = torch.finfo(torch.float8_e4m3fn).max
FLOAT8_E4M3_MAX_CODE = 0x7E  # 448; 0x7F is NaN, and positive codes order as their values
NVFP4_SCALES = ("amax", "searched")
TARGET_NVFP4_SCALES = "searched"  # target error reaches the answers
DRAFT_NVFP4_SCALES = "amax"  # the seed's measured drafter; drafts are verified either way
# beside amax/6's and amax/4's codes: 99% of a twelve-code search's gain in error, measured
NVFP4_SCALE_NEIGHBOURS = (-1, 1)
NVFP4_CHUNK = 1 << 20  # weights quantized at once: bounds the temporaries on every rank
NVFP4_SEARCH_MARGIN = 2.0 ** -16  # of a block's energy: above float32's noise, so amax keeps ties
INT8 = scalar_types.uint8b128


class WeightGroupsError(RuntimeError):
    """A setting or a model this module refuses, in one line."""


# ----------------------------------------------------------------------------- settings


def settings_from_env(env=os.environ) -> dict:
    groups_text = env.get("GLM53_INT8_W8A16", "").strip()
    groups = [] if groups_text in ("", "none", "0") else [g.strip() for g in groups_text.split(",")]
    unknown = [g for g in groups if g not in GROUPS]
    if unknown:
        raise WeightGroupsError(f"GLM53_INT8_W8A16={groups_text!r}: unknown group(s) "
                                f"{', '.join(unknown)}; use a comma list of {', '.join(GROUPS)}")
    size_text = env.get("GLM53_INT_GROUP_SIZE", "128").strip() or "128"
    if size_text not in {str(s) for s in GROUP_SIZES}:
        raise WeightGroupsError(f"GLM53_INT_GROUP_SIZE={size_text!r}: use 64 or 128")
    target_format = env.get("GLM53_TARGET_WEIGHT_FORMAT", "int8").strip() or "int8"
    if target_format not in TARGET_FORMATS:
        raise WeightGroupsError(f"GLM53_TARGET_WEIGHT_FORMAT={target_format!r}: use "
                                f"{' or '.join(TARGET_FORMATS)}")
    if target_format in UNSAFE_TARGET_FORMATS and env.get("GLM53_FORCE_UNSAFE_WEIGHTS") != "1":
        raise WeightGroupsError(f"GLM53_TARGET_WEIGHT_FORMAT={target_format}: "
                                f"{UNSAFE_TARGET_FORMATS[target_format]}; use int8, or set "
                                f"GLM53_FORCE_UNSAFE_WEIGHTS=1")
    draft = env.get("GLM53_DRAFT_WEIGHTS", "").strip()
    if draft not in ("", "bf16", "nvfp4"):
        raise WeightGroupsError(f"GLM53_DRAFT_WEIGHTS={draft!r}: use bf16 or nvfp4")
    return {"groups": groups, "group_size": int(size_text), "target_format": target_format,
            "draft_nvfp4": draft == "nvfp4"}


# ----------------------------------------------------------------------------- formats


def int8_wna16(weight: torch.Tensor, group_size: int) -> dict[str, torch.Tensor]:
    """(N, K) float weight -> the compressed-tensors pack-quantized tensors of a symmetric
    8-bit weight with one scale per `group_size` inputs: weight_packed (N, K/4) int32,
    weight_scale (N, K/group) in the weight's dtype, weight_shape [N, K]."""
    n, k = weight.shape
    if k % group_size:
        raise WeightGroupsError(f"input size {k} is not a multiple of group {group_size}")
    _, w_q, w_s, _ = quantize_weights(weight.t().float(), INT8, group_size)
    return {"weight_packed": pack_quantized_values_into_int32(w_q.t().contiguous(), INT8,
                                                              packed_dim=1),
            "weight_scale": w_s.t().contiguous().to(weight.dtype),
            "weight_shape": torch.tensor([n, k], dtype=torch.int64)}


def int8_wna16_dequantized(tensors: dict[str, torch.Tensor], group_size: int) -> torch.Tensor:
    from vllm.model_executor.layers.quantization.utils.quant_utils import (
        unpack_quantized_values_into_int32,
    )
    q = unpack_quantized_values_into_int32(tensors["weight_packed"], INT8, packed_dim=1)
    scale = tensors["weight_scale"].float().repeat_interleave(group_size, dim=1)
    return (q - INT8.bias).float() * scale


def _e2m1_codes(values: torch.Tensor) -> torch.Tensor:
    """E2M1 values (exactly representable) -> their 4-bit codes, sign in bit 3."""
    table = kE2M1ToFloat_handle.val.to(values.device)
    code_of_double = torch.zeros(int(table[-1] * 2) + 1, dtype=torch.uint8, device=values.device)
    code_of_double[(table * 2).long()] = torch.arange(len(table), dtype=torch.uint8,
                                                      device=values.device)
    return code_of_double[(values.abs() * 2).long()] | ((values < 0).to(torch.uint8) << 3)


def _e2m1_nearest(magnitude: torch.Tensor) -> torch.Tensor:
    """Magnitudes in [0, 6] -> the nearest E2M1 value, ties to the even code, as vLLM's
    cast_to_fp4 rounds, in a few cheap ops for the search: adding and taking away
    1.5 * 2**(23 + e) rounds a float32 to a multiple of 2**e, ties to even, and E2M1's step is
    2**(max(exponent, 0) - 1), read from the float's own exponent bits."""
    shift = (magnitude.view(torch.int32) >> 23).clamp_(min=127).add_(22) \
        .bitwise_left_shift_(23).bitwise_or_(0x400000).view(torch.float32)
    return (magnitude + shift).sub_(shift)


def _e4m3(code: torch.Tensor) -> torch.Tensor:
    """int16 E4M3 codes (clamped to 0..448's) -> their values in float32."""
    return code.clamp(0, FLOAT8_E4M3_MAX_CODE).to(torch.uint8).view(torch.float8_e4m3fn).float()


def _e4m3_code(scale: torch.Tensor) -> torch.Tensor:
    """float32 E4M3 values (or scales to round as ref_nvfp4_quant does) -> int16 codes."""
    return scale.clamp(max=FLOAT8_E4M3_MAX).to(torch.float8_e4m3fn).view(torch.uint8) \
        .to(torch.int16)


def searched_block_scales(w: torch.Tensor, global_scale: torch.Tensor,
                          amax_scale: torch.Tensor) -> torch.Tensor:
    """(R, K) float32 weights, amax_scale (R, K/16) from ref_nvfp4_quant -> per block of 16 the
    E4M3 scale whose dequantized block has the least squared error, among amax/6's
    (amax_scale), amax/4's and their NVFP4_SCALE_NEIGHBOURS codes; float32, (R, K/16)."""
    magnitude = w.abs().reshape(*amax_scale.shape, NVFP4_BLOCK)
    six = _e4m3_code(amax_scale)
    four = _e4m3_code(global_scale * magnitude.amax(-1) / 4)

    def squared_error(code: torch.Tensor) -> torch.Tensor:
        scale = _e4m3(code).unsqueeze(-1)
        scaled = magnitude * get_reciprocal(scale * get_reciprocal(global_scale))
        values = _e2m1_nearest(scaled.clamp_(max=FLOAT4_E2M1_MAX))
        return values.mul_(scale / global_scale).sub_(magnitude).square_().sum(-1)

    best_code, best_error = six, squared_error(six)
    margin = NVFP4_SEARCH_MARGIN * magnitude.square().sum(-1)
    tried = [six + step for step in NVFP4_SCALE_NEIGHBOURS] \
        + [four + step for step in (0, *NVFP4_SCALE_NEIGHBOURS)]
    for code in tried:
        error = squared_error(code)
        better = error < best_error - margin
        best_code = torch.where(better, code, best_code)
        best_error = torch.where(better, error, best_error)
    return _e4m3(best_code)


def nvfp4_values(w: torch.Tensor, global_scale: torch.Tensor,
                 block_scale: torch.Tensor) -> torch.Tensor:
    """(R, K) float32 weights at given block scales -> their E2M1 values, (R, K), as
    ref_nvfp4_quant computes them at its own scales."""
    scale = block_scale.unsqueeze(-1)
    scaled = w.reshape(*block_scale.shape, NVFP4_BLOCK) \
        * get_reciprocal(scale * get_reciprocal(global_scale))
    return cast_to_fp4(torch.clamp(scaled, -FLOAT4_E2M1_MAX, FLOAT4_E2M1_MAX)).reshape(w.shape)


def nvfp4(weight: torch.Tensor, scales: str) -> dict[str, torch.Tensor]:
    """(N, K) float weight -> compressed-tensors NVFP4 tensors: weight_packed (N, K/2) uint8
    (low nibble first), weight_scale (N, K/16) float8_e4m3fn, weight_global_scale [1]
    (stored as the divisor, as checkpoints store it). Block scales: `amax` (ref_nvfp4_quant's
    amax/6) or `searched` (searched_block_scales); quantized NVFP4_CHUNK weights at a time."""
    n, k = weight.shape
    if k % NVFP4_BLOCK:
        raise WeightGroupsError(f"input size {k} is not a multiple of {NVFP4_BLOCK}")
    if scales not in NVFP4_SCALES:
        raise WeightGroupsError(f"NVFP4 block scales {scales!r}: use {' or '.join(NVFP4_SCALES)}")
    rows = max(1, NVFP4_CHUNK // k)
    chunks = [weight[start:start + rows] for start in range(0, n, rows)]
    amax = torch.stack([c.abs().max() for c in chunks]).max().float().clamp_min(1e-8)
    global_scale = ((FLOAT4_E2M1_MAX * FLOAT8_E4M3_MAX) / amax).to(torch.float32)
    packed = torch.empty(n, k // 2, dtype=torch.uint8, device=weight.device)
    block_scale = torch.empty(n, k // NVFP4_BLOCK, dtype=torch.float8_e4m3fn,
                              device=weight.device)
    for start, chunk in zip(range(0, n, rows), chunks):
        w = chunk.float()
        values, scale = ref_nvfp4_quant(w, global_scale, NVFP4_BLOCK)
        if scales == "searched":
            scale = searched_block_scales(w, global_scale, scale)
            values = nvfp4_values(w, global_scale, scale)
        codes = _e2m1_codes(values.reshape(w.shape))
        packed[start:start + rows] = codes[:, 0::2] | (codes[:, 1::2] << 4)
        block_scale[start:start + rows] = scale.to(torch.float8_e4m3fn)
    return {"weight_packed": packed, "weight_scale": block_scale,
            "weight_global_scale": global_scale.reshape(1)}


def nvfp4_dequantized(tensors: dict[str, torch.Tensor]) -> torch.Tensor:
    from vllm.model_executor.layers.quantization.utils.nvfp4_emulation_utils import (
        dequantize_to_dtype,
    )
    return dequantize_to_dtype(tensors["weight_packed"], tensors["weight_scale"],
                               1.0 / tensors["weight_global_scale"], torch.float32,
                               NVFP4_BLOCK, swizzle=False)


# ----------------------------------------------------------------------------- the swap


def _resolve(owner: torch.nn.Module, path: str, owner_name: str) -> torch.nn.Module | None:
    module = owner
    for part in path.split("."):
        if not hasattr(module, part):
            raise WeightGroupsError(f"{type(owner).__name__} at {owner_name or '<root>'} has "
                                    f"no {path}: the model code drifted from what v13 knows")
        module = getattr(module, part)
        if module is None:  # e.g. a MoE layer without shared experts
            return None
    return module


def target_linears(model: torch.nn.Module, groups: list[str]) -> dict[str, list]:
    """group -> [(name, linear)] of the model's modules the groups name."""
    found: dict[str, list] = {g: [] for g in groups}
    for name, module in model.named_modules():
        for group in groups:
            owner, paths = GROUPS[group]
            if type(module).__name__ != owner:
                continue
            for path in paths:
                layer = _resolve(module, path, name)
                if layer is not None:
                    found[group].append((f"{name}.{path}".lstrip("."), layer))
    return found


def draft_linears(model: torch.nn.Module) -> list:
    out = []
    for name, module in model.named_modules():
        for path in DRAFT_OWNERS.get(type(module).__name__, ()):
            layer = _resolve(module, path, name)
            if layer is not None:
                out.append((f"{name}.{path}".lstrip("."), layer))
    return out


def _no_loader(*_args, **_kwargs) -> None:
    raise WeightGroupsError("a weight-group layer takes its weights from the swap, not a loader")


def _sizes(layer: torch.nn.Module, weight: torch.Tensor) -> tuple[int, int, list[int]]:
    n, k = weight.shape
    if hasattr(layer, "num_embeddings_padded"):  # ParallelLMHead
        return layer.embedding_dim, layer.num_embeddings_padded, [n]
    parts = list(getattr(layer, "output_partition_sizes", None) or [n])
    return getattr(layer, "input_size", k), getattr(layer, "output_size", n), parts


def swap_linear(name: str, layer: torch.nn.Module, fmt: str, group_size: int,
                nvfp4_scales: str) -> int:
    """Give one BF16 linear a weight-only scheme (NVFP4 with `nvfp4_scales` block scales);
    returns the BF16 bytes freed."""
    weight = getattr(layer, "weight", None)
    if not isinstance(weight, torch.Tensor) or weight.dim() != 2 \
            or weight.dtype not in (torch.bfloat16, torch.float16):
        raise WeightGroupsError(f"{name}: no 16-bit 2-D weight to quantize (is the "
                                f"checkpoint already quantized there?)")
    if type(layer.quant_method).__name__ != "UnquantizedLinearMethod" \
            and not hasattr(layer, "num_embeddings_padded"):
        raise WeightGroupsError(f"{name}: has {type(layer.quant_method).__name__}, not BF16")
    # imported here, not at the top: model_loader/utils.py imports this module, and vLLM's
    # compressed-tensors package imports the MoE layers, which import the model utilities
    # that import model_loader: at the top it closes an import cycle (0.30.0's registry
    # could then load no model class)
    from vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors import (
        CompressedTensorsLinearMethod,
    )
    from vllm.model_executor.layers.quantization.compressed_tensors.schemes import (
        CompressedTensorsW4A4Fp4,
        CompressedTensorsWNA16,
    )

    input_size, output_size, parts = _sizes(layer, weight)
    data = weight.data
    k = data.shape[1]
    device = data.device
    if fmt == "int8":
        scheme = CompressedTensorsWNA16(strategy="group", num_bits=8, group_size=group_size,
                                        symmetric=True, layer_name=name)
        tensors = int8_wna16(data, group_size)
    else:
        scheme = CompressedTensorsW4A4Fp4(use_a16=True)
        tensors = nvfp4(data, nvfp4_scales)
        tensors["weight_global_scale"] = tensors["weight_global_scale"].repeat(len(parts))
    freed = data.numel() * data.element_size()
    del layer._parameters["weight"]  # the BF16 tensor goes with its last reference
    del weight, data
    # vLLM processes weights after loading outside the loader's device scope: allocate the
    # scheme's parameters where the BF16 weight was, or the Marlin repack meets CPU tensors
    with torch.device(device):
        scheme.create_weights(layer=layer, output_size=output_size, input_size=input_size,
                              output_partition_sizes=parts,
                              input_size_per_partition=k,
                              params_dtype=layer.params_dtype if hasattr(layer, "params_dtype")
                              else torch.bfloat16, weight_loader=_no_loader)
    with torch.no_grad():
        for key, value in tensors.items():
            getattr(layer, key).data.copy_(value.to(getattr(layer, key).device))
    layer.scheme = scheme
    layer.quant_method = CompressedTensorsLinearMethod(None)
    layer.quant_method.process_weights_after_loading(layer)
    return freed


def swap_weight_groups(model: torch.nn.Module, settings: dict) -> dict[str, int]:
    """Swap what the settings ask for in this model; {group: linears swapped}."""
    root = type(model).__name__
    counts: dict[str, int] = {}
    freed = 0
    fmt = ""
    if root in TARGET_ROOTS and settings["groups"]:
        found = target_linears(model, settings["groups"])
        if "lm_head" in found:
            embed = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") \
                else None
            for name, head in found["lm_head"]:
                if embed is not None and getattr(embed, "weight", None) is head.weight:
                    raise WeightGroupsError(f"{name} is tied to the input embedding: drop "
                                            f"lm_head from GLM53_INT8_W8A16")
        for group, layers in found.items():
            for name, layer in layers:
                freed += swap_linear(name, layer, settings["target_format"],
                                     settings["group_size"], TARGET_NVFP4_SCALES)
            counts[group] = len(layers)
        fmt = (f"int8 group {settings['group_size']}" if settings["target_format"] == "int8"
               else f"nvfp4, {TARGET_NVFP4_SCALES} block scales")
    elif root in DRAFT_ROOTS and settings["draft_nvfp4"]:
        layers = draft_linears(model)
        for name, layer in layers:
            freed += swap_linear(name, layer, "nvfp4", NVFP4_BLOCK, DRAFT_NVFP4_SCALES)
        counts["draft"] = len(layers)
        fmt = f"nvfp4, {DRAFT_NVFP4_SCALES} block scales"
    if counts:
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        logger.info("GLM53 weight groups on %s: %s; %s; %.2f GiB of 16-bit weights freed",
                    root, ", ".join(f"{g} {n}" for g, n in counts.items()), fmt,
                    freed / (1 << 30))
    return counts


def with_weight_groups(process):
    """Decorator for process_weights_after_loading(model, model_config, target_device)."""

    @functools.wraps(process)
    def wrapper(model, *args, **kwargs):
        result = process(model, *args, **kwargs)
        swap_weight_groups(model, settings_from_env())
        return result

    return wrapper
