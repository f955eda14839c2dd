"""Run with PYTHONPATH=<a vLLM release tree> on CPU torch: v13's NVFP4 with searched block
scales against amax's, on the real-K weights of weight_groups_roundtrip.py (ROWS rows each). Per shape,
in float64 from what vLLM's dequantize_to_dtype reads: no block of 16 errs more than with
amax scales; the packed tensors read back, to the last bit, as the chosen E2M1 values in
element order times the scales, each value the nearest to its weight at its block's scale;
both results share the amax path's layout and global scale. And the controls: a wrong
nibble order and worse scales are caught, the amax path is ref_nvfp4_quant's on the whole
tensor, the search's rounding is cast_to_fp4's. Prints one JSON line.

    python nvfp4_scales.py HELPER.py
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from weight_groups_roundtrip import ROWS, SHAPES, load, weight  # noqa: E402  seeded alike

E2M1_GRID = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], dtype=torch.float64)
CHECK_ELEMENTS = 1 << 20  # weights checked at once in float64
CONTROL_SHAPE = "shared.down_proj"  # the controls need a shape, not a large one
# ROWS rows per shape (weight_groups_roundtrip.py): a block's scale search and packing see
# its own 16 weights only; the whole matrices took 5.5 min of the vllm tier's critical path.


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


def scales_case(helper, w: torch.Tensor, tensors: dict, seconds: dict) -> dict:
    """amax against searched block scales on one shape. Every weight is read back and every
    block compared; nearest-ness is checked on the first and the last CHECK_ELEMENTS (the
    quantizer runs the same code on every chunk, the last one possibly shorter)."""
    n, k = w.shape
    global_scale = tensors["amax"]["weight_global_scale"]
    out = {s: {"sum_squared_error": 0.0, "max_error": 0.0, "reader_mismatches": 0,
               "not_nearest": 0, "nearest_checked": 0, "seconds": seconds[s],
               "layout": {key: [list(t.shape), str(t.dtype)] for key, t in tensors[s].items()}}
           for s in tensors}
    out["shape"] = [n, k]
    out["same_global_scale"] = bool(torch.equal(global_scale,
                                                tensors["searched"]["weight_global_scale"]))
    out["blocks"] = n * k // 16
    out["blocks_worse"] = out["blocks_better"] = out["scales_changed"] = 0
    out["sum_squared_weight"] = float(w.double().square().sum())
    rows = max(1, CHECK_ELEMENTS // k)
    starts = list(range(0, n, rows))
    for start in starts:
        x = w[start:start + rows].double()
        block_error = {}
        for scales, t in tensors.items():
            scale = t["weight_scale"][start:start + rows]
            read, own, values = read_and_own(helper, x, t["weight_packed"][start:start + rows],
                                             scale, global_scale)
            case = out[scales]
            case["reader_mismatches"] += int((read != own).sum())
            if start in (starts[0], starts[-1]):
                case["not_nearest"] += not_nearest(x, values, scale, global_scale)
                case["nearest_checked"] += x.numel()
            error = read - x
            case["sum_squared_error"] += float(error.square().sum())
            case["max_error"] = max(case["max_error"], float(error.abs().max()))
            block_error[scales] = error.reshape(x.shape[0], -1, 16).square().sum(-1)
        out["blocks_worse"] += int((block_error["searched"] > block_error["amax"]).sum())
        out["blocks_better"] += int((block_error["searched"] < block_error["amax"]).sum())
        out["scales_changed"] += int(
            (tensors["searched"]["weight_scale"][start:start + rows].view(torch.uint8)
             != tensors["amax"]["weight_scale"][start:start + rows].view(torch.uint8)).sum())
    for scales in tensors:
        out[scales]["rms_error"] = (out[scales]["sum_squared_error"] / (n * k)) ** 0.5
    out["rms_weight"] = (out["sum_squared_weight"] / (n * k)) ** 0.5
    return out


def controls(helper, w: torch.Tensor, tensors: dict) -> dict:
    """What the checks above must catch, and the amax path the seed measured left as it was."""
    from vllm.model_executor.layers.quantization.utils.nvfp4_emulation_utils import (
        cast_to_fp4,
        ref_nvfp4_quant,
    )
    searched, amax = tensors["searched"], tensors["amax"]
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
    read, _, _ = read_and_own(helper, x, amax["weight_packed"], amax["weight_scale"],
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
    return {"shape": list(w.shape), "nibble_swapped_mismatches": nibble_swapped,
            "weights": w.numel(), "scale_bumped_blocks_worse": bumped_worse,
            "blocks": amax["weight_scale"].numel(), "amax_as_before": amax_as_before,
            "search_rounding_mismatches": rounding, "rounding_points": grid.numel()}


def main(helper_path: str) -> int:
    helper = load(helper_path)
    out = {"shapes": {}, "vllm_file": sys.modules["vllm"].__file__}
    for index, (name, (n, k)) in enumerate(SHAPES.items()):
        w = weight(min(n, ROWS), k, index)
        tensors, seconds = {}, {}
        for scales in ("amax", "searched"):
            started = time.perf_counter()
            tensors[scales] = helper.nvfp4(w, scales)
            seconds[scales] = time.perf_counter() - started
        out["shapes"][name] = scales_case(helper, w, tensors, seconds)
        if name == CONTROL_SHAPE:
            out["controls"] = controls(helper, w, tensors)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
