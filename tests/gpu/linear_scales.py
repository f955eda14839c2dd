"""v8_linear_scales on vLLM 0.30.0's own NVFP4 linear kernel (Marlin W4A16 on the GPU machine):
merged linears whose shards carry unequal globals, stock and fixed, against float64.

vLLM's own MergedColumnParallelLinear and QKVParallelLinear are built with its ModelOpt NVFP4
config, loaded with shards quantized ModelOpt's way (tests/vllm/probes/linear_global_scales.py's
cases), prepared by vLLM's process_weights_after_loading (the Marlin repack) and run by its
apply, stock (the decorators' __wrapped__) and fixed. Per shard, the output's relative error
against float64 of the intended weights (fp4 x block scale x that shard's own global) must be
within EXACT_FACTOR times cuBLAS's BF16 product of the same intended weights (the bound is the
truth's, so a fold that re-rounds a block scale would fail it); stock must be beyond it where a
shard's global is not the kept one. Plants that must fail: one shard's factor 1% off, the scale
applied to the bias too. Equal globals: stock and fixed bit-identical. The kernel vLLM chose is
recorded and must be Marlin's. Cost: the fix's multiply on the shared experts' gate_up at
TP 2 (2,048 x 4,096), M = 1..16, eager and in a CUDA graph.

    python3 tests/gpu/linear_scales.py OUT.json
"""

from __future__ import annotations

import json
import statistics
import sys
import types
from pathlib import Path

import torch

REPO_ROOT = Path(__file__).resolve().parents[2]
# this folder's kernels.py would shadow the `kernels` package that transformers probes for
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).parent]
sys.path.insert(0, str(REPO_ROOT / "tests/vllm/probes"))

import linear_global_scales as probe  # noqa: E402  the cases, one definition
from moe_global_scales import dequantize  # noqa: E402

TOKENS = 64
EXACT_FACTOR = 1.5
EXPECTED_KERNEL = "Marlin"  # a substring of the kernel class vLLM must choose for W4A16 NVFP4
COST_SIZES, COST_HIDDEN, COST_TOKENS, COST_REPLAYS, CALLS_PER_GRAPH = (
    [1024, 1024], 4096, (1, 2, 4, 8, 16), 30, 16)


def log(message: str) -> None:
    print(f"gpu linear: {message}", file=sys.stderr, flush=True)


def relative(a, b) -> float:
    return ((a - b).norm() / b.norm()).item()


def intended_weight(shards) -> torch.Tensor:
    """float64 of the checkpoint's weights, made on the CPU (the probe's grid lives there)."""
    return torch.cat([dequantize(s.cpu(), torch.full((p.shape[0],), g, dtype=torch.float64),
                                 p.cpu()) for p, s, g in shards]).cuda()


def prepared(vllm, config, kind, sizes, shards, bias, process, hidden):
    probe.HIDDEN = hidden
    with torch.device("cuda"):
        layer = probe.build(vllm.linear, vllm.modelopt, config, kind, sizes)
    probe.load(layer, [tuple(t.cuda() if torch.is_tensor(t) else t for t in s) for s in shards],
               bias)
    process(layer.quant_method, layer)
    return layer


def time_us(function, graph: bool) -> float:
    if graph:
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(3):
                function()
        torch.cuda.current_stream().wait_stream(stream)
        cuda_graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(cuda_graph):
            for _ in range(CALLS_PER_GRAPH):
                function()
        run = cuda_graph.replay
    else:
        def run():
            for _ in range(CALLS_PER_GRAPH):
                function()
        run()
    times = []
    for _ in range(COST_REPLAYS):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        run()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 1000 / CALLS_PER_GRAPH)
    return statistics.median(times)


def main() -> int:
    from vllm.distributed import parallel_state
    from vllm.model_executor.layers import linear
    from vllm.model_executor.layers.quantization import glm53_linear_scales as helper
    from vllm.model_executor.layers.quantization import modelopt

    parallel_state._TP = types.SimpleNamespace(rank_in_group=0, world_size=1)
    vllm = types.SimpleNamespace(linear=linear, modelopt=modelopt, helper=helper)
    config = modelopt.ModelOptNvFp4Config.from_config({"quantization": {
        "quant_algo": "NVFP4", "group_size": 16, "kv_cache_quant_algo": None,
        "exclude_modules": []}})
    method_cls = modelopt.ModelOptLinearMethod
    fixed_process, fixed_apply = method_cls.process_weights_after_loading, method_cls.apply
    stock_process, stock_apply = fixed_process.__wrapped__, fixed_apply.__wrapped__
    x = torch.randn(TOKENS, probe.HIDDEN, generator=torch.Generator().manual_seed(3)).cuda()
    x = x.bfloat16()
    result, failed = {"tokens": TOKENS, "exact_factor": EXACT_FACTOR, "cases": {}}, []
    for name, (kind, sizes, amaxes) in probe.CASES.items():
        shards = [tuple(t.cuda() if torch.is_tensor(t) else t for t in s)
                  for s in probe.shard_weights(sizes, amaxes, seed=len(name))]
        bias = torch.randn(sum(sizes), generator=torch.Generator().manual_seed(9)).bfloat16()
        bias = bias.cuda()
        intended = intended_weight(shards)
        truth = x.double() @ intended.T
        pipeline = (x @ intended.bfloat16().T).double()
        bound = [EXACT_FACTOR * e for e in probe.per_shard(pipeline, truth, sizes)]
        doc = {"sizes": sizes, "globals": [s[2] for s in shards], "bound": bound}
        outputs = {}
        for run, (process, apply, plant) in {
                "stock": (stock_process, stock_apply, None),
                "fixed": (fixed_process, fixed_apply, None),
                "factor_1pct_off": (fixed_process, fixed_apply, "factor"),
                "scaled_after_bias": (fixed_process, fixed_apply, "bias")}.items():
            layer = prepared(vllm, config, kind, sizes, shards, bias.cpu(), process,
                             probe.HIDDEN)
            method = layer.quant_method
            doc["kernel"] = type(method.kernel).__name__
            scale = getattr(layer, helper.SCALE_ATTR, None)
            if plant == "factor" and scale is not None:
                scale[sizes[0]:sizes[0] + sizes[1]] *= 1.01
            if plant == "bias" and scale is not None:  # the kernel adds the bias, then scaled
                out = stock_apply(method, layer, x, layer.bias) * scale
            else:  # the layer's own bias, as vLLM's LinearBase.forward passes it
                out = apply(method, layer, x, layer.bias)
            outputs[run] = out
            doc[run] = probe.per_shard(out.double() - bias.double(), truth, sizes)
        over = {run: [s for s, e in enumerate(doc[run]) if e > bound[s]]
                for run in ("stock", "fixed", "factor_1pct_off", "scaled_after_bias")}
        doc["over_bound"] = over
        kept = max(doc["globals"])
        not_kept = [s for s, g in enumerate(doc["globals"]) if g != kept]
        checks = {"fixed_within_bound": over["fixed"] == [],
                  "stock_over_bound_off_the_kept_shards": over["stock"] == not_kept,
                  "kernel_is_marlin": EXPECTED_KERNEL in doc["kernel"]}
        if not_kept:
            checks["plant_factor_1pct_fails"] = 1 in over["factor_1pct_off"]
            checks["plant_bias_scaled_fails"] = over["scaled_after_bias"] != []
        else:
            checks["equal_bit_identical"] = bool(torch.equal(outputs["stock"], outputs["fixed"]))
        doc["checks"] = checks
        failed += [f"{name}: {check}" for check, ok in checks.items() if not ok]
        log(f"{name}: {doc['kernel']}; errors fixed {doc['fixed']} stock {doc['stock']}; "
            f"bound {bound}")
        result["cases"][name] = doc
    cost = {}
    probe.HIDDEN = COST_HIDDEN
    shards = [tuple(t.cuda() if torch.is_tensor(t) else t for t in s)
              for s in probe.shard_weights(COST_SIZES, [1.0, 0.37], seed=1)]
    bias = torch.zeros(sum(COST_SIZES)).bfloat16()
    layers = {"stock": prepared(vllm, config, "merged", COST_SIZES, shards, bias, stock_process,
                                COST_HIDDEN),
              "fixed": prepared(vllm, config, "merged", COST_SIZES, shards, bias, fixed_process,
                                COST_HIDDEN)}
    for tokens in COST_TOKENS:
        xs = torch.randn(tokens, COST_HIDDEN, device="cuda").bfloat16()
        row = {}
        for run, apply in (("stock", stock_apply), ("fixed", fixed_apply)):
            layer = layers[run]
            for graph in (False, True):
                row[f"{run}_{'graph' if graph else 'eager'}_us"] = time_us(
                    lambda layer=layer, apply=apply: apply(layer.quant_method, layer, xs, None),
                    graph)
        cost[tokens] = row
        log(f"cost at M={tokens}: {row}")
    result["cost_shared_gate_up"] = {"sizes": COST_SIZES, "hidden": COST_HIDDEN, "by_tokens": cost}
    result["failed"] = failed
    result["passed"] = not failed
    Path(sys.argv[1]).write_text(json.dumps(result, indent=2) + "\n")
    log("failed: " + ", ".join(failed) if failed else "every check passed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
