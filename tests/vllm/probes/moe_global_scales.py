"""Run with PYTHONPATH=<a vLLM tree that v8_moe_scales patched> on CPU torch: vLLM's own
ModelOptNvFp4FusedMoE.create_weights and process_weights_after_loading on a synthetic
ModelOpt NVFP4 layer whose experts' gate and up global scales differ by planted ratios, run
as far as the CPU allows: the kernel-format conversion and the kernel's set-up (CUDA-only
Marlin repacking) are replaced by a capture of what vLLM hands them. Prints one JSON line.

    python moe_global_scales.py

Per run (stock: the method as vLLM wrote it, reached through the decorator's __wrapped__;
fixed: the patched method; wrong-way: the fix with each half folded by the other's ratio, a
plant the check must catch), per expert and half, in float64: the largest relative error of
the effective block scale (what the kernel is given times the one global it gets) against
the checkpoint's (the block scale times that half's own global), and how many blocks pass
the bound the fold allows. Also: an equal-scale layer through stock and fixed (bit for bit),
and the error of each choice of global (max, gate, searched) on ModelOpt-shaped weights.
"""

from __future__ import annotations

import hashlib
import json
import sys
import types

import torch

E4M3_MAX = 448.0
E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], dtype=torch.float64)
EXPERTS, ROWS, HIDDEN, GROUP = 8, 32, 256, 16
# up global / gate global per expert: equal, a few percent, the field's reported range, both ways
RATIOS = (1.0, 1.01, 0.99, 1.3, 2.0, 0.5, 10.0, 0.1)
# E4M3's steps: 3 mantissa bits in the normal range (from 2^-6), 2^-9 below it
E4M3_MANTISSA_BITS, E4M3_MIN_NORMAL, E4M3_SUBNORMAL_STEP = 3, 2.0 ** -6, 2.0 ** -9


def half_step(value: torch.Tensor) -> torch.Tensor:
    """Half the E4M3 step at each value: the most rounding to nearest can move it."""
    exponent = torch.floor(torch.log2(value.clamp_min(E4M3_MIN_NORMAL)))
    step = torch.where(value >= E4M3_MIN_NORMAL, 2.0 ** (exponent - E4M3_MANTISSA_BITS),
                       torch.full_like(value, E4M3_SUBNORMAL_STEP))
    return step / 2


def quantize_modelopt(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, float]:
    """ModelOpt-style NVFP4 of one (rows, hidden) half: (packed uint8, E4M3 block scales,
    global): global = amax / (6 * 448), block scale = E4M3(block amax / 6 / global)."""
    global_scale = weight.abs().max().item() / (6.0 * E4M3_MAX)
    blocks = weight.reshape(weight.shape[0], -1, GROUP)
    scales = (blocks.abs().amax(-1) / 6.0 / global_scale).clamp(max=E4M3_MAX)
    scales = scales.to(torch.float8_e4m3fn)
    step = scales.double().unsqueeze(-1) * global_scale
    scaled = torch.where(step > 0, blocks.double() / step.clamp_min(1e-300), 0.0)
    index = (scaled.abs().unsqueeze(-1) - E2M1).abs().argmin(-1)
    nibbles = (index | ((scaled < 0).long() << 3)).reshape(weight.shape[0], -1)
    packed = (nibbles[:, 0::2] | (nibbles[:, 1::2] << 4)).to(torch.uint8)
    return packed, scales, global_scale


def synthetic_experts(ratios, seed: int):
    """(packed (E, 2R, H/2), block scales (E, 2R, H/16) e4m3, globals (E, 2)) of experts whose
    up half is the gate's shape times its ratio, quantized each on its own."""
    generator = torch.Generator().manual_seed(seed)
    packed, scales, globals_ = [], [], []
    for ratio in ratios:
        gate = torch.randn(ROWS, HIDDEN, generator=generator, dtype=torch.float64)
        up = torch.randn(ROWS, HIDDEN, generator=generator, dtype=torch.float64)
        up *= ratio * gate.abs().max() / up.abs().max()  # the globals' ratio is the planted one
        halves = [quantize_modelopt(gate), quantize_modelopt(up)]
        if ratio == 1.0:  # an equal-scale expert, as a fused-aware export writes it
            halves[1] = (halves[1][0], halves[1][1], halves[0][2])
        packed.append(torch.cat([h[0] for h in halves]))
        scales.append(torch.cat([h[1] for h in halves]))
        globals_.append([h[2] for h in halves])
    return torch.stack(packed), torch.stack(scales), torch.tensor(globals_, dtype=torch.float32)


def make_method(modelopt):
    """ModelOptNvFp4FusedMoE without its constructor (which picks a CUDA backend): the
    attributes create_weights and process_weights_after_loading read."""
    method = object.__new__(modelopt.ModelOptNvFp4FusedMoE)
    method.moe = types.SimpleNamespace(is_act_and_mul=True)
    method.quant_config = types.SimpleNamespace(is_checkpoint_nvfp4_serialized=True,
                                                group_size=GROUP)
    method.use_global_sf, method.use_a16 = False, True
    method.per_token_activation = False  # 0.33.0 reads it; W4A16 has no activation scales
    method.nvfp4_backend, method.experts_cls = None, object  # the kernel is captured, never built
    return method


def load_layer(modelopt, packed, scales, globals_) -> torch.nn.Module:
    """A layer built by vLLM's create_weights, its parameters filled as the loader would."""
    layer = torch.nn.Module()
    make_method(modelopt).create_weights(
        layer, num_experts=EXPERTS, hidden_size=HIDDEN, intermediate_size_per_partition=ROWS,
        params_dtype=torch.bfloat16, weight_loader=lambda *args, **kwargs: None,
        global_num_experts=EXPERTS)
    layer._expert_routing_tables = lambda: None
    with torch.no_grad():
        layer.w13_weight.copy_(packed)
        layer.w13_weight_scale.copy_(scales)
        layer.w13_weight_scale_2.copy_(globals_)
        for name in ("w2_weight", "w2_weight_scale", "w2_weight_scale_2", "w13_input_scale",
                     "w2_input_scale"):
            getattr(layer, name).zero_()
    return layer


def capture_kernel_inputs(modelopt) -> dict:
    """Replace the CUDA-only steps after the scales are chosen by a capture of their inputs."""
    seen: dict = {}

    def convert(**kwargs):
        seen.update({k: v.detach().clone() if torch.is_tensor(v) else v
                     for k, v in kwargs.items()})
        return tuple(kwargs[k] for k in ("w13", "w13_scale", "w13_scale_2", "a13_scale", "w2",
                                         "w2_scale", "w2_scale_2", "a2_scale"))

    kernel = types.SimpleNamespace(  # 0.34.0 also calls keep_constants before loading
        fused_experts=types.SimpleNamespace(process_weights_after_loading=lambda layer: None,
                                            keep_constants=lambda layer: None))
    modelopt.convert_to_nvfp4_moe_kernel_format = convert
    modelopt.make_nvfp4_moe_kernel = lambda **kwargs: kernel
    modelopt.make_nvfp4_moe_quant_config = lambda **kwargs: None
    return seen


def run(modelopt, function, data) -> dict:
    seen = capture_kernel_inputs(modelopt)
    layer = load_layer(modelopt, *data)
    function(make_method(modelopt), layer)
    return seen


def judge(seen: dict, scales: torch.Tensor, globals_: torch.Tensor) -> dict:
    """Per expert and half, what the kernel is given against the checkpoint: the largest
    relative error of the effective block scale, the blocks farther from the checkpoint's
    than rounding the folded scale to E4M3 allows, and whether the half is exact. The fold
    allows that much and keeps one half of every expert exact (a power-of-two ratio), so an
    expert fails when a block is outside or no half is exact."""
    given = seen["w13_scale"].double().reshape(EXPERTS, 2, ROWS, -1)
    one_global = seen["w13_scale_2"].double().reshape(EXPERTS, 1, 1, 1)
    effective = given * one_global
    intended = scales.double().reshape(EXPERTS, 2, ROWS, -1) * globals_.double()[:, :, None, None]
    bound = half_step(intended / one_global) * one_global
    outside = ((effective - intended).abs() > bound).flatten(1).sum(1)
    exact = [[bool(torch.equal(effective[e, h], intended[e, h])) for h in (0, 1)]
             for e in range(EXPERTS)]
    relative = ((effective - intended).abs() / intended.clamp_min(1e-300)).flatten(2)
    return {"relative_error": relative.amax(2).tolist(),
            "outside_bound": outside.tolist(), "exact_halves": exact,
            "failing": [e for e in range(EXPERTS) if outside[e] or not any(exact[e])]}


def digest(seen: dict) -> str:
    sha = hashlib.sha256()
    for name in ("w13", "w13_scale", "w13_scale_2"):
        sha.update(seen[name].contiguous().view(torch.uint8).numpy().tobytes())
    return sha.hexdigest()


def policy_errors(helper, packed, scales, globals_) -> dict:
    """Each choice of one global per expert on these weights: the energy-weighted relative
    error of the folded w13 against the checkpoint's, and the blocks that overflow (saturated
    at 448) or fall below E4M3's normal range (2^-6)."""
    energy = helper.block_energy(packed, scales.shape[-1]).double()
    intended = scales.double() * globals_.double().repeat_interleave(ROWS, 1)[:, :, None]
    norm = (intended ** 2 * energy).sum((1, 2)).sqrt()
    searched, _ = helper.choose_globals(
        scales.float().reshape(EXPERTS, 2, ROWS, -1), globals_.float(),
        energy.float().reshape(EXPERTS, 2, ROWS, -1))
    out = {}
    for name, chosen in (("max", globals_.amax(1)), ("gate", globals_[:, 0]),
                         ("searched", searched)):
        ratio = (globals_ / chosen[:, None]).repeat_interleave(ROWS, 1)[:, :, None]
        rescaled = scales.float() * ratio
        overflow = (rescaled > E4M3_MAX).flatten(1).sum(1)
        subnormal = ((rescaled < 2.0 ** -6) & (rescaled > 0)).flatten(1).sum(1)
        folded = rescaled.clamp(max=E4M3_MAX).to(torch.float8_e4m3fn).double()
        folded = folded * chosen.double()[:, None, None]
        error = (((folded - intended) ** 2) * energy).sum((1, 2)).sqrt() / norm
        out[name] = {"relative_error": error.tolist(), "overflow_blocks": overflow.tolist(),
                     "subnormal_blocks": subnormal.tolist()}
    return out


def main() -> None:
    from vllm.distributed import parallel_state
    from vllm.model_executor.layers.quantization import glm53_moe_scales as helper
    from vllm.model_executor.layers.quantization import modelopt

    # one rank: what vLLM's parameters read of the tensor-parallel group
    parallel_state._TP = types.SimpleNamespace(rank_in_group=0, world_size=1)

    fixed = modelopt.ModelOptNvFp4FusedMoE.process_weights_after_loading
    stock = fixed.__wrapped__
    data = synthetic_experts(RATIOS, seed=0)
    packed, scales, globals_ = data
    result = {"ratios": list(RATIOS), "globals": globals_.tolist(),
              "stock": judge(run(modelopt, stock, data), scales, globals_),
              "fixed": judge(run(modelopt, fixed, data), scales, globals_)}
    original_fold = helper.fold
    # the plant: each half folded by the other half's global (the ratio the wrong way round)
    helper.fold = lambda s, g, p=None: original_fold(s, g[:, [1, 0]], p)
    result["wrong_way"] = judge(run(modelopt, fixed, data), scales, globals_)
    helper.fold = original_fold
    seen = run(modelopt, fixed, data)
    seen["w13_scale_2"] = seen["w13_scale_2"] * 1.01  # the plant: the kernel's global 1% off
    result["global_off_1pct"] = judge(seen, scales, globals_)
    equal = synthetic_experts((1.0,) * EXPERTS, seed=1)
    result["equal_scales"] = {"stock": digest(run(modelopt, stock, equal)),
                              "fixed": digest(run(modelopt, fixed, equal))}
    result["policies"] = policy_errors(helper, packed, scales, globals_)
    result["model_report"] = helper.MODEL_REPORT.line()
    print(json.dumps(result))


if __name__ == "__main__":
    sys.exit(main())
