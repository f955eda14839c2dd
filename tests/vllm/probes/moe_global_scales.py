"""Run with PYTHONPATH=<a vLLM tree that v8_moe_scales patched> on CPU torch: vLLM's own
ModelOptNvFp4FusedMoE.create_weights and process_weights_after_loading on a synthetic
ModelOpt NVFP4 layer whose experts' gate and up global scales differ by planted ratios, run
as far as the CPU allows: the kernel-format conversion and the kernel's set-up (CUDA-only
Marlin repacking) are replaced by a capture of what vLLM hands them. Prints one JSON line.

    python moe_global_scales.py

The fold (the experts class is not Marlin's, so the patched method folds). Per run (stock:
the method as vLLM wrote it, reached through the decorator's __wrapped__; fixed: the patched
method; wrong-way: the fix with each half folded by the other's ratio, a plant the check must
catch), per expert and half, in float64: the largest relative error of the effective block
scale (what the kernel is given times the one global it gets) against the checkpoint's (the
block scale times that half's own global), and how many blocks pass the bound the fold
allows. Also: an equal-scale layer through stock and fixed (bit for bit), and the error of
each choice of global (max, gate, searched) on ModelOpt-shaped weights.

The exact route (the experts class is vLLM's MarlinExperts, so the patched method keeps the
gate's global and wraps the built experts' activation): the fused MoE emulated in float64 on
what vLLM handed the kernel, rows ordered as the fused kernel writes them (token, then top-k
slot), the activation called through the experts object as vLLM's MarlinExperts.apply does,
SiLU with Glm5Next's clamp (``swiglu_limit``) set where it bites. Per expert (every token
routed to it alone), the output's relative error against float64 of the checkpoint's intended
weights: stock, the fold, the exact route, the routing-weight route (the ratio on the top-k
weight, exact only without a clamp), and the exact route with one expert's ratio 1% off and
with rows read slot-first (plants that must fail).
"""

from __future__ import annotations

import hashlib
import json
import os
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


TOKENS = 12
CLAMP_QUANTILE = 0.9  # the clamp bites on the largest tenth of the first GEMM's outputs


def dequantize(scales: torch.Tensor, globals_rows: torch.Tensor, packed: torch.Tensor):
    """float64 (E, rows, HIDDEN) from packed fp4, E4M3 block scales and a global per row."""
    low, high = (packed & 0x7).long(), ((packed >> 4) & 0x7).long()
    sign_low = 1 - 2 * ((packed >> 3) & 1).double()
    sign_high = 1 - 2 * ((packed >> 7) & 1).double()
    values = torch.stack([E2M1[low] * sign_low, E2M1[high] * sign_high], -1).flatten(-2)
    return values * scales.double().repeat_interleave(GROUP, -1) * globals_rows[..., None]


def clamped_silu(limit: float):
    """Glm5Next's activation in float64 as vLLM's callback is called: (kind, out, in, **)."""

    def activation(kind, output, input, *, topk_ids=None, expert_map=None):
        gate, up = input.chunk(2, -1)
        gate, up = gate.clamp(max=limit), up.clamp(-limit, limit)
        output.copy_(gate * torch.sigmoid(gate) * up)

    return activation


def fused_moe(w13, w2, x, ids, weights, activation, slot_first: bool = False):
    """The fused MoE in float64: the first GEMM's rows in the kernel's order (token, then
    slot; slot_first is the plant), the activation callback, the second GEMM, weighted sum."""
    tokens, topk = ids.shape
    order = [(t, k) for k in range(topk) for t in range(tokens)] if slot_first else \
        [(t, k) for t in range(tokens) for k in range(topk)]
    h = torch.stack([w13[ids[t, k]] @ x[t] for t, k in order])
    act = torch.empty(h.shape[0], h.shape[1] // 2, dtype=torch.float64)
    activation("silu", act, h, topk_ids=ids, expert_map=None)
    out = torch.zeros(tokens, w2.shape[1], dtype=torch.float64)
    for row, (t, k) in enumerate(order):
        out[t] += weights[t, k] * (w2[ids[t, k]] @ act[row])
    return out


def exact_route(modelopt, helper, marlin_experts, data) -> dict:
    """vLLM's patched method on Marlin's experts class, then the fused MoE in float64 on what
    it handed the kernel and through the activation it left wrapped, per expert."""
    packed, scales, globals_ = data
    generator = torch.Generator().manual_seed(11)
    w2 = torch.randn(EXPERTS, HIDDEN, ROWS, generator=generator, dtype=torch.float64) / 16
    x = torch.randn(TOKENS, HIDDEN, generator=generator, dtype=torch.float64)
    intended = dequantize(scales, globals_.double().repeat_interleave(ROWS, 1), packed)
    limit = torch.quantile(torch.einsum("erh,th->etr", intended, x).abs().flatten(),
                           CLAMP_QUANTILE).item()

    def prepared(function, method_setup=lambda method: None):
        """(the w13 the kernel computes with, in float64; the activation it calls)."""
        experts = object.__new__(marlin_experts)
        experts.activation = clamped_silu(limit)
        experts.process_weights_after_loading = lambda layer: None
        seen = capture_kernel_inputs(modelopt)
        kernel = types.SimpleNamespace(fused_experts=experts)
        modelopt.make_nvfp4_moe_kernel = lambda **kwargs: kernel
        method = make_method(modelopt)
        method.experts_cls = marlin_experts
        method_setup(method)
        layer = load_layer(modelopt, *data)
        function(method, layer)
        method.moe_kernel = kernel  # the stock method sets it too; a stand-in's capture may not
        one_global = seen["w13_scale_2"].double().reshape(EXPERTS, 1).expand(-1, 2 * ROWS)
        return dequantize(seen["w13_scale"], one_global, seen["w13"]), experts

    fixed = modelopt.ModelOptNvFp4FusedMoE.process_weights_after_loading
    stock = fixed.__wrapped__
    runs = {"stock": prepared(stock), "exact": prepared(fixed)}
    os.environ[helper.ROUTE_ENV] = "fold"
    runs["fold"] = prepared(fixed)
    del os.environ[helper.ROUTE_ENV]
    original = helper.up_over_gate

    def one_off(globals_):  # the plant: expert 3's ratio 1% off
        ratios = original(globals_).clone()
        ratios[3] *= 1.01
        return ratios

    helper.up_over_gate = one_off
    runs["exact_ratio_1pct_off"] = prepared(fixed)
    helper.up_over_gate = original
    ratios = original(globals_).double()
    out = {"clamp_limit": limit, "routes": {}}
    for name in (*runs, "routing_weight", "exact_slot_first"):
        errors = []
        for expert in range(EXPERTS):
            ids = torch.full((TOKENS, 2), expert, dtype=torch.long)  # both slots: the same expert
            ids[:, 1] = (expert + 1) % EXPERTS
            weights = torch.tensor([[1.0, 0.0]], dtype=torch.float64).expand(TOKENS, -1)
            truth = fused_moe(intended, w2, x, ids, weights, clamped_silu(limit))
            if name == "routing_weight":  # stock kernel, each row's weight x its expert's ratio
                w13, experts = runs["stock"]
                got = fused_moe(w13, w2, x, ids, weights * ratios[ids], experts.activation)
            elif name == "exact_slot_first":
                w13, experts = runs["exact"]
                got = fused_moe(w13, w2, x, ids, weights, experts.activation, slot_first=True)
            else:
                w13, experts = runs[name]
                got = fused_moe(w13, w2, x, ids, weights, experts.activation)
            errors.append(((got - truth).norm() / truth.norm()).item())
        out["routes"][name] = errors
    out["exact_wrapped"] = type(runs["exact"][1].activation).__name__
    out["stock_wrapped"] = type(runs["stock"][1].activation).__name__
    return out


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


def routes_by_backend(helper) -> dict:
    """For every NVFP4 MoE backend this tree offers, the experts classes vLLM's own table
    (oracle/nvfp4.py backend_to_kernel_cls) maps it to, and the route the fix takes for each."""
    from vllm.model_executor.layers.fused_moe.oracle import nvfp4

    routes = {}
    for backend in nvfp4.NvFp4MoeBackend:
        try:
            classes = nvfp4.backend_to_kernel_cls(backend)
        except Exception as error:  # noqa: BLE001  an optional kernel package absent on CPU
            routes[backend.name] = f"not importable here: {type(error).__name__}"
            continue
        routes[backend.name] = {cls.__name__: helper.choose_route(
            types.SimpleNamespace(experts_cls=cls)) for cls in classes}
    return routes


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
    from vllm.model_executor.layers.fused_moe.experts.marlin_moe import MarlinExperts

    result["exact"] = exact_route(modelopt, helper, MarlinExperts, data)
    result["routes_by_backend"] = routes_by_backend(helper)
    result["model_report"] = helper.MODEL_REPORT.line()
    print(json.dumps(result))


if __name__ == "__main__":
    sys.exit(main())
