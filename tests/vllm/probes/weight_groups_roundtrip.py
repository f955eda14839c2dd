"""Run with PYTHONPATH=<a vLLM release tree> on CPU torch: v13's weight-group helper quantizes
and packs real-shaped BF16 weights through vLLM's own code, and vLLM's own dequantizers
give back the weight within each format's error bound; NVFP4 with searched block scales
errs no more than with amax scales in any block, and vLLM's dequantize_to_dtype reads back
exactly the E2M1 values and scales chosen; swap_linear gives a layer exactly the parameters
vLLM's schemes register (their kernels stubbed: Marlin needs CUDA) and frees the BF16
weight. Prints one JSON line.

    python weight_groups_roundtrip.py HELPER.py
"""

from __future__ import annotations

import importlib.util
import json
import sys
import time

import torch

# (name, per-rank (N, K)) at tensor parallel 2, from vLLM 0.30.0's Glm5NextConfig defaults
# (hidden 4096, 64 heads, q_lora_rank 1536, head dims 256, KDA 64 x 128, moe_intermediate
# 2048, one shared expert) and the drafter's fc over 5 taps; lm_head is a 4096-row slice of
# the 77,440-row shard (every format is per row, so a slice errs as the whole does)
SHAPES = {
    "mla.q_b_proj": (8192, 1536), "mla.o_proj": (4096, 8192), "kda_o.o_proj": (4096, 4096),
    "shared.gate_up_proj": (2048, 4096), "shared.down_proj": (4096, 1024),
    "lm_head(slice)": (4096, 4096), "draft.fc": (4096, 5 * 4096),
}
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


def nvfp4_case(helper, w: torch.Tensor, tensors: dict) -> dict:
    """The amax path (the drafter's) against the format's error bound."""
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


E2M1_GRID = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], dtype=torch.float64)
CHECK_ELEMENTS = 1 << 20  # weights checked at once in float64


def read_and_own(helper, x: torch.Tensor, packed, scale, global_scale) -> tuple:
    """Rows of one result: (what vLLM's dequantize_to_dtype reads from the packed tensors,
    this probe's float64 product of the chosen E2M1 values in element order and the scales,
    those values). The float32 reciprocal the scheme keeps, the FP8 scale and an E2M1 value
    multiply exactly in float64 (24 + 4 + 2 bits), so the two agree to the last bit exactly
    when the packing is what vLLM reads."""
    from vllm.model_executor.layers.quantization.utils.nvfp4_emulation_utils import (
        dequantize_to_dtype,
    )
    inverse = (1.0 / global_scale).double()
    read = dequantize_to_dtype(packed, scale, inverse, torch.float64, 16, swizzle=False)
    values = helper.nvfp4_values(x.float(), global_scale, scale.float()).double()
    block = scale.double() * inverse
    own = (values.reshape(*block.shape, 16) * block.unsqueeze(-1)).reshape(x.shape)
    return read, own, values


def not_nearest(x: torch.Tensor, values: torch.Tensor, scale: torch.Tensor,
                global_scale: torch.Tensor) -> int:
    """Weights whose E2M1 value is not the nearest to weight / block scale (clipped at 6) or
    has the wrong sign, in float64; float32's rounding of that quotient (a few 1e-7 of it)
    may pick either side of a near-tie."""
    block = (scale.double() / global_scale.double()).repeat_interleave(16, dim=1)
    scaled = torch.where(block > 0, x.abs() / block.clamp_min(1e-300), 0.0).clamp(max=6.0)
    above = torch.searchsorted(E2M1_GRID, scaled).clamp(max=len(E2M1_GRID) - 1)
    nearest = torch.minimum((E2M1_GRID[above] - scaled).abs(),
                            (scaled - E2M1_GRID[(above - 1).clamp(min=0)]).abs())
    chosen = (values.abs() - scaled).abs()
    wrong_sign = (values * x < 0).sum()
    return int((chosen > nearest + 1e-5 * scaled.clamp_min(1e-30)).sum() + wrong_sign)


def nvfp4_scales_case(helper, w: torch.Tensor, tensors: dict, seconds: dict) -> dict:
    """amax against searched block scales on one shape: float64 errors from what vLLM reads."""
    n, k = w.shape
    global_scale = tensors["amax"]["weight_global_scale"]
    out = {s: {"sum_squared_error": 0.0, "max_error": 0.0, "reader_mismatches": 0,
               "not_nearest": 0, "seconds": seconds[s],
               "layout": {key: [list(t.shape), str(t.dtype)] for key, t in tensors[s].items()}}
           for s in tensors}
    out["shape"] = [n, k]
    out["same_global_scale"] = bool(torch.equal(global_scale,
                                                tensors["searched"]["weight_global_scale"]))
    out["blocks"] = n * k // 16
    out["blocks_worse"] = out["blocks_better"] = out["scales_changed"] = 0
    out["sum_squared_weight"] = float(w.double().square().sum())
    rows = max(1, CHECK_ELEMENTS // k)
    for start in range(0, n, rows):
        x = w[start:start + rows].double()
        block_error = {}
        for scales, t in tensors.items():
            packed = t["weight_packed"][start:start + rows]
            scale = t["weight_scale"][start:start + rows]
            read, own, values = read_and_own(helper, x, packed, scale, global_scale)
            case = out[scales]
            case["reader_mismatches"] += int((read != own).sum())
            case["not_nearest"] += not_nearest(x, values, scale, global_scale)
            error = read - x
            case["sum_squared_error"] += float(error.square().sum())
            case["max_error"] = max(case["max_error"], float(error.abs().max()))
            block_error[scales] = error.reshape(x.shape[0], -1, 16).square().sum(-1)
        out["blocks_worse"] += int((block_error["searched"] > block_error["amax"]).sum())
        out["blocks_better"] += int((block_error["searched"] < block_error["amax"]).sum())
        out["scales_changed"] += int((tensors["searched"]["weight_scale"][start:start + rows]
                                      .view(torch.uint8) != tensors["amax"]["weight_scale"]
                                      [start:start + rows].view(torch.uint8)).sum())
    for scales in tensors:
        case = out[scales]
        case["rms_error"] = (case["sum_squared_error"] / (n * k)) ** 0.5
    out["rms_weight"] = (out["sum_squared_weight"] / (n * k)) ** 0.5
    return out


def nvfp4_controls(helper, w: torch.Tensor) -> dict:
    """What the checks above must catch, and the amax path the seed measured left as it was."""
    from vllm.model_executor.layers.quantization.utils.nvfp4_emulation_utils import (
        cast_to_fp4,
        ref_nvfp4_quant,
    )
    searched = helper.nvfp4(w, "searched")
    amax = helper.nvfp4(w, "amax")
    global_scale = searched["weight_global_scale"]
    x = w.double()
    # high nibble first: vLLM reads other values than the ones chosen
    packed = searched["weight_packed"]
    swapped = (packed >> 4) | (packed << 4)
    read, own, _ = read_and_own(helper, x, swapped, searched["weight_scale"], global_scale)
    nibble_swapped = int((read != own).sum())
    # every block scale three E4M3 codes up: a valid NVFP4 result that errs more in most blocks
    bumped = (amax["weight_scale"].view(torch.uint8).to(torch.int16) + 3).clamp(max=0x7E) \
        .to(torch.uint8).view(torch.float8_e4m3fn)
    errors = {}
    for name, scale in (("amax", amax["weight_scale"]), ("bumped", bumped)):
        values = helper.nvfp4_values(w.float(), global_scale, scale.float()).double()
        back = (values.reshape(*scale.shape, 16)
                * (scale.double() / global_scale.double()).unsqueeze(-1)).reshape(x.shape)
        errors[name] = (back - x).reshape(*scale.shape, 16).square().sum(-1)
    bumped_worse = int((errors["bumped"] > errors["amax"]).sum())
    # the amax path equals ref_nvfp4_quant on the whole tensor, as before the search came in
    ref_values, ref_scale = ref_nvfp4_quant(w.float(), global_scale, 16)
    read, own, _ = read_and_own(helper, x, amax["weight_packed"], amax["weight_scale"],
                                global_scale)
    ref_back = (ref_values.double().reshape(*ref_scale.shape, 16)
                * (ref_scale.double() * (1.0 / global_scale).double()).unsqueeze(-1)) \
        .reshape(x.shape)
    amax_as_before = bool(torch.equal(read, ref_back) and torch.equal(
        amax["weight_scale"].view(torch.uint8), ref_scale.to(torch.float8_e4m3fn)
        .view(torch.uint8)))
    # the search's own rounding against vLLM's cast_to_fp4, at every threshold and between
    points = [torch.linspace(0, 6, 2_000_001)]
    for level in (0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 3.5, 4.0, 5.0, 6.0):
        near = torch.full((9,), level)
        for i in range(4):
            near[3 - i] = torch.nextafter(near[4 - i], torch.tensor(0.0))
            near[5 + i] = torch.nextafter(near[4 + i], torch.tensor(7.0))
        points.append(near)
    grid = torch.cat(points).clamp(0, 6)
    rounding = int((helper._e2m1_nearest(grid.clone()) != cast_to_fp4(grid.clone())).sum())
    return {"nibble_swapped_mismatches": nibble_swapped, "scale_bumped_blocks_worse": bumped_worse,
            "blocks": amax["weight_scale"].numel(), "amax_as_before": amax_as_before,
            "search_rounding_mismatches": rounding, "rounding_points": grid.numel()}


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
    out = {"int8": {}, "nvfp4": {}, "nvfp4_scales": {},
           "vllm_file": sys.modules["vllm"].__file__}
    for index, (name, (n, k)) in enumerate(SHAPES.items()):
        w = weight(n, k, index)
        out["int8"][name] = {f"g{g}": int8_case(helper, w, g) for g in (64, 128)}
        tensors, seconds = {}, {}
        for scales in ("amax", "searched"):
            started = time.perf_counter()
            tensors[scales] = helper.nvfp4(w, scales)
            seconds[scales] = time.perf_counter() - started
        out["nvfp4"][name] = nvfp4_case(helper, w, tensors["amax"])
        out["nvfp4_scales"][name] = nvfp4_scales_case(helper, w, tensors, seconds)
    out["nvfp4_controls"] = nvfp4_controls(helper, weight(*SHAPES["kda_o.o_proj"], 2))
    out["swap"] = {fmt: swap_case(helper, fmt) for fmt in ("int8", "nvfp4")}
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
