"""v8_moe_scales on vLLM 0.30.0's own fused Marlin MoE (run on the GPU machine): stock, the
fold and the exact route, judged against float64 of the checkpoint's intended weights.

A synthetic ModelOpt NVFP4 MoE layer (tests/vllm/probes/moe_global_scales.py's experts: gate
and up global scales equal, or unequal by the planted ratios) is built by vLLM's own
``ModelOptNvFp4FusedMoE.create_weights``, loaded, and prepared by its
``process_weights_after_loading`` on the Marlin backend (the launcher's ``--moe-backend
marlin``): stock (the decorator's ``__wrapped__``), the fold (``GLM53_MOE_SCALE_ROUTE=fold``)
and the exact route (the default on Marlin's experts class). Only the modular kernel's
prepare/finalize is not built: the experts object is vLLM's ``MarlinExperts`` (its own
``activation``, Glm5Next's clamp in its config), and vLLM's ``fused_marlin_moe`` runs on what
the method left, calling that experts object's activation as ``MarlinExperts.apply`` does.

The judge, per expert (every token routed to it in top-k slot 0, slot 1 to another expert at
weight 0, so the kernel's row order is exercised): the output's relative error against float64
of the intended weights (fp4 x block scale x that half's own global), bounded by
``EXACT_FACTOR`` times the error of cuBLAS's BF16 pipeline on the same intended weights (the
least any 16-bit MoE can err). The bound is the truth's, not the weights the kernel was handed,
so a fold that re-rounds a block scale, or a global 2% off inside the fold, fails it. Checks:
- the exact route within the bound on every expert, at clamp off and on;
- stock beyond it where the ratio is not 1; the fold beyond it where it re-rounds;
- plants that must fail: one expert's ratio 1% off (that expert), every ratio 1% off (every
  expert; without the clamp, which hides a ratio where it cuts the up half off), one expert's
  global 2% off inside the fold (that expert);
- equal scales: stock, fold and exact bit-identical;
- the kernel on what it was handed, within BF16_FACTOR of the BF16 pipeline on the same;
- cost: one MoE layer at GLM-5.3-Flash's per-rank shape (hidden 4,096, 1,024 rows per half at
  TP 2, 256 experts, top 8), M = 1, 2, 4, 8, 16 tokens, stock and exact, in CUDA graphs.

    python3 tests/gpu/moe_scales.py OUT.json           # on the GPU machine
    python3 tests/gpu/moe_scales.py OUT.json --cpu     # the same judge on a bf16 emulation
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import types
from pathlib import Path

import torch

REPO_ROOT = Path(__file__).resolve().parents[2]
# this folder's kernels.py would shadow the `kernels` package that transformers probes for
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).parent]
sys.path.insert(0, str(REPO_ROOT / "tests/vllm/probes"))

import moe_global_scales as probe  # noqa: E402  the synthetic experts, one definition

TOKENS, TOPK = 64, 2
HIDDEN, ROWS = 512, 256  # Marlin's tiles: hidden a multiple of 128, rows of 64
BF16_FACTOR = 4.0  # the kernel on its handed weights, against the BF16 pipeline on the same
EXACT_FACTOR = 1.5  # the end result against the truth, over the BF16 pipeline's own error
CLAMP_QUANTILE = 0.9  # the clamp case: Glm5Next's swiglu_limit biting on the top tenth
PLANTED_EXPERT = 3  # ratio 1.3: every route but the exact one re-rounds it
# the cost layer: GLM-5.3-Flash per rank at TP 2 (vLLM 0.30.0's Glm5NextConfig: hidden 4096,
# moe_intermediate 2048 split over 2 ranks); 256 experts hold the weights well past L2
COST_EXPERTS, COST_HIDDEN, COST_ROWS, COST_TOPK = 256, 4096, 1024, 8
COST_TOKENS = (1, 2, 4, 8, 16)
COST_LAYERS_PER_GRAPH, COST_REPLAYS = 8, 30


def log(message: str) -> None:
    print(f"gpu moe: {message}", file=sys.stderr, flush=True)


def dequantize(packed: torch.Tensor, scales: torch.Tensor, globals_rows: torch.Tensor):
    """float64 (E, rows, cols) from packed fp4, E4M3 block scales and a global per row."""
    low, high = (packed & 0x7).long(), ((packed >> 4) & 0x7).long()
    sign_low = 1 - 2 * ((packed >> 3) & 1).double()
    sign_high = 1 - 2 * ((packed >> 7) & 1).double()
    grid = probe.E2M1.to(packed.device)
    values = torch.stack([grid[low] * sign_low, grid[high] * sign_high], -1).flatten(-2)
    block = scales.double().repeat_interleave(probe.GROUP, -1)
    return values * block * globals_rows[..., None]


def moe_reference(x, w13, w2, topk_ids, topk_weights, dtype, limit):
    """SiLU-and-mul MoE (gate clamped above, up both ways, at LIMIT when set) in DTYPE
    (float64, or bfloat16 through cuBLAS with each intermediate rounded as a 16-bit MoE does)."""
    x = x.to(dtype)
    out = torch.zeros(x.shape[0], w2.shape[1], dtype=torch.float64, device=x.device)
    for slot in range(topk_ids.shape[1]):
        for expert in topk_ids[:, slot].unique().tolist():
            rows = (topk_ids[:, slot] == expert).nonzero().flatten()
            h = x[rows] @ w13[expert].to(dtype).T
            gate, up = h.chunk(2, -1)
            if limit is not None:
                gate, up = gate.clamp(max=limit), up.clamp(-limit, limit)
            act = (torch.nn.functional.silu(gate) * up).to(dtype)
            y = (act @ w2[expert].to(dtype).T).double()
            out[rows] += y * topk_weights[rows, slot, None].double()
    return out


def relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm()).item()


class Plants:
    """The faults planted inside the fix, each a context for one preparation."""

    def __init__(self, helper):
        self.helper = helper

    def ratio_off(self, experts):
        original = self.helper.up_over_gate

        def planted(globals_):
            ratios = original(globals_).clone()
            ratios[experts] *= 1.01
            return ratios

        return self._swap("up_over_gate", planted)

    def fold_global_off(self, expert):
        original = self.helper.fold

        def planted(*args, **kwargs):
            scales, globals_, report = original(*args, **kwargs)
            globals_ = globals_.clone()
            globals_[expert] *= 1.02
            return scales, globals_, report

        return self._swap("fold", planted)

    def _swap(self, name, planted):
        helper = self.helper

        class Swap:
            def __enter__(self):
                self.original = getattr(helper, name)
                setattr(helper, name, planted)

            def __exit__(self, *exc):
                setattr(helper, name, self.original)

        return Swap()


class NoPlant:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


class Prepared(types.SimpleNamespace):
    """A layer as vLLM's method left it, its experts object, and the w13 tensors handed to the
    kernel-format conversion (checkpoint layout)."""


def prepare(vllm, function, data, route, limit, plant, emulated):
    """vLLM's method FUNCTION on a loaded layer (GLM53_MOE_SCALE_ROUTE=ROUTE, PLANT inside)."""
    modelopt = vllm.modelopt
    handed: dict = {}
    convert = modelopt.convert_to_nvfp4_moe_kernel_format

    def recording_convert(**kwargs):
        handed.update(w13_scale=kwargs["w13_scale"].clone(),
                      w13_scale_2=kwargs["w13_scale_2"].clone())
        if emulated:  # the CPU has no Marlin repack: the kernel reads the checkpoint layout
            return tuple(kwargs[k] for k in ("w13", "w13_scale", "w13_scale_2", "a13_scale",
                                             "w2", "w2_scale", "w2_scale_2", "a2_scale"))
        return convert(**kwargs)

    experts = object.__new__(vllm.MarlinExperts)
    experts.activation_config = vllm.ApplyMoEActivationConfig(clamp_limit=limit)
    experts.process_weights_after_loading = lambda layer: None
    if emulated:
        experts.activation = emulated_activation(limit)
    kernel = types.SimpleNamespace(fused_experts=experts)
    modelopt.convert_to_nvfp4_moe_kernel_format = recording_convert
    modelopt.make_nvfp4_moe_kernel = lambda **kwargs: kernel
    os.environ[vllm.helper.ROUTE_ENV] = route
    try:
        with plant:
            layer = probe.load_layer(modelopt, *data[:3])
            layer.hidden_size, layer.intermediate_size_per_partition = HIDDEN, ROWS
            method = probe.make_method(modelopt)
            method.nvfp4_backend = vllm.NvFp4MoeBackend.MARLIN
            method.experts_cls = vllm.MarlinExperts
            method.moe_kernel = None
            with torch.no_grad():  # w2: each expert its own global (never folded)
                layer.w2_weight.copy_(data[3]), layer.w2_weight_scale.copy_(data[4])
                layer.w2_weight_scale_2.copy_(data[5])
            function(method, layer)
    finally:
        modelopt.convert_to_nvfp4_moe_kernel_format = convert
        del os.environ[vllm.helper.ROUTE_ENV]
    return Prepared(layer=layer, experts=experts, handed=handed)


def emulated_activation(limit):
    """The CPU's stand-in for vLLM's CUDA activation op: float32 math, a bf16 result."""

    def activation(kind, output, input, *, topk_ids=None, expert_map=None):
        gate, up = input.float().chunk(2, -1)
        if limit is not None:
            gate, up = gate.clamp(max=limit), up.clamp(-limit, limit)
        output.copy_((torch.nn.functional.silu(gate) * up).to(output.dtype))

    return activation


def run_moe(vllm, prepared, x, ids, weights, emulated):
    """The fused MoE on what the method left: vLLM's fused_marlin_moe, or on the CPU a bf16
    emulation of it (row order token then slot, as the kernel writes it)."""
    layer, experts = prepared.layer, prepared.experts
    if not emulated:
        return vllm.marlin_moe.fused_marlin_moe(
            x, layer.w13_weight, layer.w2_weight, None, None, layer.w13_weight_scale,
            layer.w2_weight_scale, weights, ids, vllm.scalar_types.float4_e2m1f.id,
            global_num_experts=probe.EXPERTS, activation=vllm.MoEActivation.SILU,
            activation_func=experts.activation, global_scale1=layer.w13_weight_scale_2,
            global_scale2=layer.w2_weight_scale_2, workspace=getattr(layer, "workspace", None),
        ).double()
    one = layer.w13_weight_scale_2.double()[:, None].expand(-1, 2 * ROWS)
    w13 = dequantize(layer.w13_weight, layer.w13_weight_scale, one).bfloat16().float()
    w2_rows = layer.w2_weight_scale_2.double()[:, None].expand(-1, HIDDEN)
    w2 = dequantize(layer.w2_weight, layer.w2_weight_scale, w2_rows).bfloat16().float()
    tokens, topk = ids.shape
    xf = x.float()
    h = torch.stack([xf[t] @ w13[ids[t, k]].T for t in range(tokens) for k in range(topk)])
    h = h.bfloat16()
    act = torch.empty(h.shape[0], ROWS, dtype=torch.bfloat16)
    experts.activation(vllm.MoEActivation.SILU, act, h, topk_ids=ids, expert_map=None)
    out = torch.zeros(tokens, HIDDEN, dtype=torch.float64)
    for t in range(tokens):
        for k in range(topk):
            y = (act[t * topk + k].float() @ w2[ids[t, k]].T).bfloat16().double()
            out[t] += y * weights[t, k].double()
    return out


def experts(ratios, seed):
    """w13 of the probe's experts at this file's size, and a w2 quantized alike."""
    probe.ROWS, probe.HIDDEN = ROWS, HIDDEN
    packed, scales, globals_ = probe.synthetic_experts(ratios, seed)
    generator = torch.Generator().manual_seed(seed + 100)
    w2 = [probe.quantize_modelopt(torch.randn(HIDDEN, ROWS, generator=generator,
                                              dtype=torch.float64)) for _ in ratios]
    return (packed, scales, globals_, torch.stack([w[0] for w in w2]),
            torch.stack([w[1] for w in w2]), torch.tensor([w[2] for w in w2]))


def routing_to(expert, device):
    """Every token to EXPERT in slot 0 (weight 1), slot 1 to the next expert at weight 0."""
    ids = torch.full((TOKENS, TOPK), expert, dtype=torch.int32, device=device)
    ids[:, 1] = (expert + 1) % probe.EXPERTS
    weights = torch.zeros(TOKENS, TOPK, dtype=torch.float32, device=device)
    weights[:, 0] = 1.0
    return ids, weights


def judge_case(vllm, name, data, limit, x, emulated, device):
    """Every route and plant on one set of experts, per expert, and the checks."""
    ratios = data[6]
    fixed = vllm.modelopt.ModelOptNvFp4FusedMoE.process_weights_after_loading
    stock = fixed.__wrapped__
    plants = Plants(vllm.helper)
    w2_f64 = dequantize(data[3], data[4], data[5].double()[:, None].expand(-1, HIDDEN))
    intended13 = dequantize(data[0], data[1], data[2].double().repeat_interleave(ROWS, 1))
    unequal = name == "unequal"
    preparations = {"stock": (stock, "auto", NoPlant()), "fold": (fixed, "fold", NoPlant()),
                    "exact": (fixed, "auto", NoPlant())}
    if unequal:
        preparations.update({
            "exact_ratio_1pct_off": (fixed, "auto", plants.ratio_off([PLANTED_EXPERT])),
            "exact_every_ratio_1pct_off": (fixed, "auto",
                                           plants.ratio_off(list(range(probe.EXPERTS)))),
            "fold_global_2pct_off": (fixed, "fold", plants.fold_global_off(PLANTED_EXPERT)),
        })
    prepared = {route: prepare(vllm, function, data, env, limit, plant, emulated)
                for route, (function, env, plant) in preparations.items()}
    doc = {"ratios": list(ratios), "clamp_limit": limit, "per_expert": {}}
    outputs = {route: [] for route in prepared}
    bf16_errors, kernel_ok = [], True
    for expert in range(probe.EXPERTS):
        ids, weights = routing_to(expert, device)
        truth = moe_reference(x, intended13, w2_f64, ids, weights, torch.float64, limit)
        pipeline = relative(moe_reference(x, intended13, w2_f64, ids, weights,
                                          torch.bfloat16, limit), truth)
        bf16_errors.append(pipeline)
        for route, prep in prepared.items():
            out = run_moe(vllm, prep, x, ids, weights, emulated)
            outputs[route].append(out)
            doc["per_expert"].setdefault(route, []).append(relative(out, truth))
        # the kernel on what the exact route handed it, against the BF16 pipeline on the same
        handed = prepared["exact"].handed
        given13 = dequantize(data[0], handed["w13_scale"],
                             handed["w13_scale_2"].double()[:, None].expand(-1, 2 * ROWS))
        given_f64 = moe_reference(x, given13, w2_f64, ids, weights, torch.float64, None)
        given_bf16 = moe_reference(x, given13, w2_f64, ids, weights, torch.bfloat16, None)
        if limit is None:  # the handed weights with no ratio applied: judged without a clamp
            stock_out = outputs["stock"][-1]
            kernel_ok &= relative(stock_out, given_f64) <= \
                BF16_FACTOR * relative(given_bf16, given_f64)
    doc["bf16_pipeline_error"] = bf16_errors
    bound = [EXACT_FACTOR * error for error in bf16_errors]
    doc["bound"] = bound
    over = {route: [e for e, err in enumerate(errors) if err > bound[e]]
            for route, errors in doc["per_expert"].items()}
    doc["over_bound"] = over
    everyone = list(range(probe.EXPERTS))
    rerounded = [e for e, r in enumerate(ratios) if r not in (1.0, 2.0, 0.5)]
    off_ratio = [e for e, r in enumerate(ratios) if r != 1.0]
    checks = {"exact_within_bound": over["exact"] == []}
    if limit is None:
        checks["kernel_within_bf16_on_handed"] = bool(kernel_ok)
    if unequal:
        checks.update({
            "stock_over_bound_where_ratio_not_1": set(off_ratio) <= set(over["stock"]),
            "fold_over_bound_where_it_rerounds_beyond_1pct": set(
                e for e in rerounded if abs(ratios[e] - 1) > 0.02) <= set(over["fold"]),
            "plant_one_ratio_1pct_fails_that_expert": over["exact_ratio_1pct_off"] == [
                PLANTED_EXPERT],
            "plant_fold_global_2pct_fails_that_expert": PLANTED_EXPERT in over[
                "fold_global_2pct_off"],
            "exact_wraps_the_activation": type(prepared["exact"].experts.activation).__name__
            == "UpHalfRatio",
        })
        if limit is None:  # a clamp hides a ratio's error wherever it cuts the up half off
            checks["plant_every_ratio_1pct_fails_every_expert"] = over[
                "exact_every_ratio_1pct_off"] == everyone
    else:
        checks["equal_bit_identical"] = all(
            torch.equal(a, b) and torch.equal(a, c)
            for a, b, c in zip(outputs["stock"], outputs["fold"], outputs["exact"]))
        checks["equal_not_wrapped"] = not isinstance(prepared["exact"].experts.activation,
                                                     vllm.helper.UpHalfRatio)
    doc["checks"] = checks
    return doc


def time_layer(vllm, route, tokens):
    """Median microseconds of one MoE layer (COST_LAYERS_PER_GRAPH calls captured in one CUDA
    graph, replayed) at GLM-5.3-Flash's per-rank shape, random fp4 weights."""
    torch.manual_seed(5)
    modelopt = vllm.modelopt
    experts_obj = object.__new__(vllm.MarlinExperts)
    experts_obj.activation_config = vllm.ApplyMoEActivationConfig(clamp_limit=None)
    experts_obj.process_weights_after_loading = lambda layer: None
    modelopt.make_nvfp4_moe_kernel = lambda **kwargs: types.SimpleNamespace(
        fused_experts=experts_obj)
    saved = probe.EXPERTS, probe.ROWS, probe.HIDDEN
    probe.EXPERTS, probe.ROWS, probe.HIDDEN = COST_EXPERTS, COST_ROWS, COST_HIDDEN
    try:
        layer = torch.nn.Module()
        method = probe.make_method(modelopt)
        method.create_weights(layer, num_experts=COST_EXPERTS, hidden_size=COST_HIDDEN,
                              intermediate_size_per_partition=COST_ROWS,
                              params_dtype=torch.bfloat16,
                              weight_loader=lambda *a, **k: None,
                              global_num_experts=COST_EXPERTS)
        layer._expert_routing_tables = lambda: None
        layer.hidden_size, layer.intermediate_size_per_partition = COST_HIDDEN, COST_ROWS
        with torch.no_grad():
            for name in ("w13_weight", "w2_weight"):
                getattr(layer, name).copy_(torch.randint(0, 256, getattr(layer, name).shape,
                                                         dtype=torch.uint8))
            for name in ("w13_weight_scale", "w2_weight_scale"):
                param = getattr(layer, name)
                param.copy_(torch.empty(param.shape).uniform_(1, 448).to(param.dtype))
            layer.w13_weight_scale_2.copy_(torch.empty(COST_EXPERTS, 2).uniform_(1e-3, 2e-3))
            layer.w2_weight_scale_2.copy_(torch.empty(COST_EXPERTS).uniform_(1e-3, 2e-3))
            for name in ("w13_input_scale", "w2_input_scale"):
                getattr(layer, name).fill_(1.0)
        method.nvfp4_backend = vllm.NvFp4MoeBackend.MARLIN
        method.experts_cls = vllm.MarlinExperts
        fixed = modelopt.ModelOptNvFp4FusedMoE.process_weights_after_loading
        function = fixed.__wrapped__ if route == "stock" else fixed
        os.environ[vllm.helper.ROUTE_ENV] = "auto"
        function(method, layer)
        del os.environ[vllm.helper.ROUTE_ENV]
    finally:
        probe.EXPERTS, probe.ROWS, probe.HIDDEN = saved
    x = torch.randn(tokens, COST_HIDDEN, device="cuda").bfloat16()
    logits = torch.randn(tokens, COST_EXPERTS, device="cuda")
    weights, ids = torch.softmax(logits, -1).topk(COST_TOPK, -1)
    ids = ids.to(torch.int32)

    def layer_call():
        return vllm.marlin_moe.fused_marlin_moe(
            x, layer.w13_weight, layer.w2_weight, None, None, layer.w13_weight_scale,
            layer.w2_weight_scale, weights, ids, vllm.scalar_types.float4_e2m1f.id,
            global_num_experts=COST_EXPERTS, activation=vllm.MoEActivation.SILU,
            activation_func=experts_obj.activation, global_scale1=layer.w13_weight_scale_2,
            global_scale2=layer.w2_weight_scale_2, workspace=getattr(layer, "workspace", None))

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            layer_call()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(COST_LAYERS_PER_GRAPH):
            layer_call()
    times = []
    for _ in range(COST_REPLAYS):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 1000 / COST_LAYERS_PER_GRAPH)
    wrapped = type(experts_obj.activation).__name__
    del graph, layer
    torch.cuda.empty_cache()
    return statistics.median(times), wrapped


class Vllm(types.SimpleNamespace):
    """The vLLM pieces this check uses, imported once."""


def load_vllm() -> Vllm:
    from vllm.distributed import parallel_state
    from vllm.model_executor.layers.fused_moe.activation import (
        ApplyMoEActivationConfig,
        MoEActivation,
    )
    from vllm.model_executor.layers.fused_moe.experts import marlin_moe
    from vllm.model_executor.layers.fused_moe.oracle.nvfp4 import NvFp4MoeBackend
    from vllm.model_executor.layers.quantization import glm53_moe_scales as helper
    from vllm.model_executor.layers.quantization import modelopt
    from vllm.scalar_type import scalar_types

    parallel_state._TP = types.SimpleNamespace(rank_in_group=0, world_size=1)
    return Vllm(modelopt=modelopt, helper=helper, marlin_moe=marlin_moe,
                MarlinExperts=marlin_moe.MarlinExperts, NvFp4MoeBackend=NvFp4MoeBackend,
                ApplyMoEActivationConfig=ApplyMoEActivationConfig, MoEActivation=MoEActivation,
                scalar_types=scalar_types)


def clamp_limit(data, x) -> float:
    """The CLAMP_QUANTILE of |first GEMM output| over every expert's intended weights."""
    intended13 = dequantize(data[0], data[1], data[2].double().repeat_interleave(ROWS, 1))
    return torch.quantile(torch.einsum("erh,th->etr", intended13.cpu(), x.double().cpu())
                          .abs().flatten()[:2 ** 24], CLAMP_QUANTILE).item()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out")
    parser.add_argument("--cpu", action="store_true",
                        help="judge a bf16 emulation of the kernel on the CPU (no timing)")
    args = parser.parse_args(argv)
    emulated = args.cpu
    if not emulated:
        try:  # vLLM's own import of it swallows the error, and Marlin MoE dies on its first op
            import vllm._moe_C_stable_libtorch  # noqa: F401
        except ImportError as error:
            log(f"the fused MoE's library does not load ({error}): install part moe "
                f"(tests/gpu/run moe)")
            return 2
    vllm = load_vllm()
    device = "cpu" if emulated else "cuda"
    # the experts are made on the CPU (seeded CPU generators), then moved
    cases = {"unequal": (*experts(probe.RATIOS, seed=0), probe.RATIOS),
             "equal": (*experts((1.0,) * probe.EXPERTS, 1), (1.0,) * probe.EXPERTS)}
    cases = {name: tuple(t.to(device) if torch.is_tensor(t) else t for t in data)
             for name, data in cases.items()}
    torch.set_default_device(device)
    generator = torch.Generator(device=device).manual_seed(7)
    x = torch.randn(TOKENS, HIDDEN, generator=generator, device=device).bfloat16()
    result = {"tokens": TOKENS, "hidden": HIDDEN, "rows": ROWS, "exact_factor": EXACT_FACTOR,
              "emulated": emulated, "cases": {}}
    failed = []
    limit = clamp_limit(cases["unequal"], x)
    for name, data in cases.items():
        for clamp in (None, limit):
            key = f"{name}{'' if clamp is None else '-clamped'}"
            doc = judge_case(vllm, name, data, clamp, x, emulated, device)
            result["cases"][key] = doc
            worst = {route: max(errors) for route, errors in doc["per_expert"].items()}
            log(f"{key}: worst error per route {worst}; bound {max(doc['bound']):.4g}")
            failed += [f"{key}: {check}" for check, ok in doc["checks"].items() if not ok]
    result["failed"] = list(failed)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")  # kept if the cost dies
    if not emulated:
        cost = {}
        for tokens in COST_TOKENS:
            stock_us, _ = time_layer(vllm, "stock", tokens)
            exact_us, wrapped = time_layer(vllm, "exact", tokens)
            cost[tokens] = {"stock_us": stock_us, "exact_us": exact_us,
                            "exact_minus_stock_us": exact_us - stock_us, "wrapped": wrapped}
            log(f"cost at M={tokens}: {cost[tokens]}")
        result["cost_per_layer"] = {"experts": COST_EXPERTS, "hidden": COST_HIDDEN,
                                    "rows": COST_ROWS, "topk": COST_TOPK, "by_tokens": cost}
        if any(c["wrapped"] != "UpHalfRatio" for c in cost.values()):
            failed.append("cost: the exact layer's activation was not wrapped")
    result["failed"] = failed
    result["passed"] = not failed
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    log("failed: " + ", ".join(failed) if failed else "every check passed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
