"""Run with PYTHONPATH=<a vLLM release tree> on CPU torch: v13's weight-group helper quantizes
and packs real-shaped BF16 weights through vLLM's own code, and vLLM's own dequantizers
give back the weight within each format's error bound (NVFP4 with the drafter's amax
block scales; nvfp4_scales.py takes the searched ones); swap_linear gives a layer exactly
the parameters vLLM's schemes register (their kernels stubbed: Marlin needs CUDA) and frees
the BF16 weight; the image refuses NVFP4 target groups unforced. Prints one JSON line.

    python weight_groups_roundtrip.py HELPER.py
"""

from __future__ import annotations

import importlib.util
import json
import sys

import torch

# (name, per-rank (N, K)) at tensor parallel 2, from vLLM 0.30.0's Glm5NextConfig defaults
# (hidden 4096, 64 heads, q_lora_rank 1536, head dims 256, KDA 64 x 128, moe_intermediate
# 2048, one shared expert) and the drafter's fc over 5 taps; lm_head is a 4096-row slice of
# the 77,440-row shard
SHAPES = {
    "mla.q_b_proj": (8192, 1536), "mla.o_proj": (4096, 8192), "kda_o.o_proj": (4096, 4096),
    "shared.gate_up_proj": (2048, 4096), "shared.down_proj": (4096, 1024),
    "lm_head(slice)": (4096, 4096), "draft.fc": (4096, 5 * 4096),
}
# Rows per shape: every format here is per row (INT8's group scales, NVFP4's blocks of 16),
# so a shape's first ROWS rows at its real K run every path and err as the whole does; the
# whole matrices (176 M weights) cost the vllm tier over a minute, these 45 M a quarter.
ROWS = 1024
BF16_REL = 2.0 ** -8  # a bfloat16 rounding, relative (8 bits of mantissa with the rounding bit)


def load(path: str):
    spec = importlib.util.spec_from_file_location("glm53_weight_groups", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def weight(n: int, k: int, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=generator) * 0.02
    w[:, ::97] *= 8.0  # outlier columns, as trained weights have
    return w.to(torch.bfloat16)


def int8_case(helper, w: torch.Tensor, group: int) -> dict:
    tensors = helper.int8_wna16(w, group)
    back = helper.int8_wna16_dequantized(tensors, group)
    scale = tensors["weight_scale"].float().repeat_interleave(group, dim=1)
    # rounding to the nearest of 255 levels, plus the scale stored in bfloat16 (|q| <= 127)
    bound = scale * (0.5 / (1 - BF16_REL) + 127 * BF16_REL)
    error = (back - w.float()).abs()
    return {"max_error_over_bound": float((error / bound).max()),
            # rounding to the nearest step s errs uniformly over +-s/2: rms s / sqrt(12)
            "rms_error_over_rms_step": float(error.pow(2).mean().sqrt()
                                             / scale.pow(2).mean().sqrt()),
            "rms_error_over_rms_weight": float(error.pow(2).mean().sqrt()
                                               / w.float().pow(2).mean().sqrt()),
            "packed_shape": list(tensors["weight_packed"].shape),
            "scale_shape": list(tensors["weight_scale"].shape)}


def nvfp4_case(helper, w: torch.Tensor) -> dict:
    """The amax path (the drafter's) against the format's error bound."""
    tensors = helper.nvfp4(w, "amax")
    back = helper.nvfp4_dequantized(tensors)
    n, k = w.shape
    block = (tensors["weight_scale"].float() / tensors["weight_global_scale"]).reshape(n, -1, 1)
    x = w.float().reshape(n, -1, 16)
    # nearest E2M1 level (largest gap 2, between 4 and 6) at the block's scale, or the clip
    # at 6 where the block scale's FP8 rounding fell below amax / 6
    bound = torch.maximum(block * 1.0, x.abs() - 6 * block) * (1 + 1e-6)
    error = (back.reshape(n, -1, 16) - x).abs()
    amax = x.abs().amax(-1, keepdim=True)
    clipped = (x.abs() - 6 * block).clamp_min(0)
    return {"max_error_over_bound": float((error / bound).max()),
            "max_clip_over_block_amax": float((clipped / amax).max()),
            "rms_error_over_rms_weight": float(error.pow(2).mean().sqrt()
                                               / x.pow(2).mean().sqrt()),
            "packed_shape": list(tensors["weight_packed"].shape),
            "scale_shape": list(tensors["weight_scale"].shape)}


class _StubKernel:
    """Stands in for Marlin (CUDA only): records that the scheme handed it the layer."""

    processed: list = []

    def __init__(self, *args, **kwargs) -> None:
        pass

    @classmethod
    def can_implement(cls, config):
        return True, None

    def input_quant_key(self):
        return None  # a weight-only kernel takes its input as it is

    def process_weights_after_loading(self, layer) -> None:
        _StubKernel.processed.append(layer)

    def apply_weights(self, layer, x, bias=None):
        raise RuntimeError("stub kernel")


def swap_case(helper, fmt: str) -> dict:
    """swap_linear on a stand-in layer (NVFP4 with the target's searched block scales): the
    parameters vLLM's scheme registered, holding exactly what nvfp4() gives."""
    from vllm.model_executor import parameter
    from vllm.model_executor.layers.linear import UnquantizedLinearMethod
    from vllm.model_executor.layers.quantization.compressed_tensors.schemes import (
        compressed_tensors_w4a4_nvfp4,
        compressed_tensors_wNa16,
    )
    # one rank: the parameters vLLM builds ask the tensor-parallel group for rank and size
    parameter.get_tensor_model_parallel_rank = lambda: 0
    parameter.get_tensor_model_parallel_world_size = lambda: 1
    compressed_tensors_wNa16.choose_mp_linear_kernel = lambda config: _StubKernel
    compressed_tensors_w4a4_nvfp4.init_nvfp4_linear_kernel = lambda **_: _StubKernel()
    layer = torch.nn.Module()
    w = weight(512, 1024, 7)
    layer.register_parameter("weight", torch.nn.Parameter(w.clone(), requires_grad=False))
    layer.quant_method = UnquantizedLinearMethod()
    layer.input_size, layer.output_size = 1024, 512
    layer.output_partition_sizes = [256, 256]
    layer.params_dtype = torch.bfloat16
    freed = helper.swap_linear("probe", layer, fmt, 128, "searched")
    params = {k: [list(v.shape), str(v.dtype)] for k, v in layer.named_parameters()}
    if fmt == "int8":
        back = helper.int8_wna16_dequantized(
            {"weight_packed": layer.weight_packed.data, "weight_scale": layer.weight_scale.data},
            128)
        direct = helper.int8_wna16(w, 128)
        as_direct = torch.equal(layer.weight_packed.data, direct["weight_packed"]) \
            and torch.equal(layer.weight_scale.data, direct["weight_scale"])
    else:  # the scheme renamed weight_packed to weight and inverted the global scale
        back = helper.nvfp4_dequantized({"weight_packed": layer.weight.data,
                                         "weight_scale": layer.weight_scale.data,
                                         "weight_global_scale": 1.0 / layer.weight_global_scale})
        direct = helper.nvfp4(w, "searched")
        as_direct = torch.equal(layer.weight.data, direct["weight_packed"]) \
            and torch.equal(layer.weight_scale.data.view(torch.uint8),
                            direct["weight_scale"].view(torch.uint8)) \
            and torch.equal(layer.weight_global_scale.data.reshape(1),
                            1.0 / direct["weight_global_scale"])
    return {"params": params, "freed_bytes": freed, "has_bf16_weight": any(
        v.dtype == torch.bfloat16 and v.dim() == 2 and list(v.shape) == [512, 1024]
        for v in layer.parameters()),
        "method": type(layer.quant_method).__name__, "scheme": type(layer.scheme).__name__,
        "kernel_processed": _StubKernel.processed[-1] is layer, "as_direct": as_direct,
        "max_abs_error": float((back - w.float()).abs().max())}


def main(helper_path: str) -> int:
    helper = load(helper_path)
    out = {"int8": {}, "nvfp4": {}, "vllm_file": sys.modules["vllm"].__file__}
    for index, (name, (n, k)) in enumerate(SHAPES.items()):
        w = weight(min(n, ROWS), k, index)
        out["int8"][name] = {f"g{g}": int8_case(helper, w, g) for g in (64, 128)}
        out["nvfp4"][name] = nvfp4_case(helper, w)
    try:
        helper.settings_from_env({"GLM53_INT8_W8A16": "mla", "GLM53_TARGET_WEIGHT_FORMAT": "nvfp4"})
        out["nvfp4_refusal"] = None
    except helper.WeightGroupsError as error:
        out["nvfp4_refusal"] = str(error)
    forced = helper.settings_from_env({"GLM53_INT8_W8A16": "mla", "GLM53_TARGET_WEIGHT_FORMAT":
                                       "nvfp4", "GLM53_FORCE_UNSAFE_WEIGHTS": "1"})
    out["nvfp4_forced_format"] = forced["target_format"]
    out["swap"] = {fmt: swap_case(helper, fmt) for fmt in ("int8", "nvfp4")}
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
