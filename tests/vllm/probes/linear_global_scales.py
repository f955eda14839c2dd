"""Run with PYTHONPATH=<a vLLM tree that v8_linear_scales patched> on CPU torch: vLLM's own
ModelOpt NVFP4 linear method (create_weights, process_weights_after_loading, apply) on merged
linears built by vLLM's own MergedColumnParallelLinear and QKVParallelLinear, each shard
quantized ModelOpt's way with its own global. Only the kernel is replaced (its selection needs
a CUDA platform): a float64 emulation of the W4A16 GEMM on the layer as processed (fp4 x block
scale x the one global vLLM kept). Prints one JSON line.

    python linear_global_scales.py

Per layer and shard, the output's relative error against float64 of the checkpoint's intended
weights (fp4 x block scale x that shard's own global): stock (the decorators' __wrapped__),
fixed, and the fold a repair could do instead (each smaller shard's block scales re-rounded to
E4M3 by own/kept), with plants the check must fail: one shard's factor 1% off, the scale
applied after the bias, and the bias added as the kernel holds it (reordered). Equal globals: stock and fixed outputs bit for bit.
"""

from __future__ import annotations

import json
import sys
import types

import torch

from moe_global_scales import E2M1, dequantize, quantize_modelopt  # noqa: E402

HIDDEN, TOKENS = 256, 8
# (layer kind, shard sizes, each shard's amax relative to the first): the groups vLLM fuses
CASES = {
    "gate_up": ("merged", [128, 128], [1.0, 0.37]),
    "qkv": ("qkv", [128, 64, 64], [1.0, 3.1, 0.8]),
    "gate_up_equal": ("merged", [128, 128], [1.0, 1.0]),
}


class KernelStandIn:
    """The W4A16 NVFP4 kernel, emulated in float64 on the processed layer. Like Marlin, it
    keeps the layer's bias in an order of its own (here reversed) and restores it in the GEMM,
    so a fix that added the layer's bias itself would be caught."""

    def process_weights_after_loading(self, layer):
        if getattr(layer, "bias", None) is not None:
            layer.bias.data = layer.bias.data.flip(0)

    def input_quant_key(self):  # W4A16: no input quantization to expose
        return None

    def apply_weights(self, layer, x, bias=None):
        rows = layer.weight.shape[0]
        kept = layer.weight_global_scale.double().reshape(1).expand(rows)
        weight = dequantize(layer.weight_scale, kept, layer.weight)
        out = x.double() @ weight.T
        return out if bias is None else out + bias.flip(0).double()


def shard_weights(sizes, amaxes, seed):
    """Per shard: (packed, block scales, own global) from ModelOpt's quantization."""
    generator = torch.Generator().manual_seed(seed)
    shards = []
    for size, amax in zip(sizes, amaxes):
        weight = torch.randn(size, HIDDEN, generator=generator, dtype=torch.float64)
        shards.append(quantize_modelopt(weight * amax / weight.abs().max()))
    return shards


def build(linear, modelopt, config, kind, sizes):
    if kind == "qkv":
        head = 64
        return linear.QKVParallelLinear(HIDDEN, head, sizes[0] // head, sizes[1] // head,
                                        bias=True, quant_config=config, prefix="layers.0.qkv",
                                        params_dtype=torch.bfloat16)
    return linear.MergedColumnParallelLinear(HIDDEN, sizes, bias=True, quant_config=config,
                                             prefix="layers.0.gate_up_proj",
                                             params_dtype=torch.bfloat16)


def load(layer, shards, bias):
    with torch.no_grad():
        layer.weight.copy_(torch.cat([s[0] for s in shards]))
        layer.weight_scale.copy_(torch.cat([s[1] for s in shards]))
        layer.weight_scale_2.copy_(torch.tensor([s[2] for s in shards]))
        layer.bias.copy_(bias)
        if hasattr(layer, "input_scale"):
            layer.input_scale.fill_(float("nan"))


def fold_error(shards, sizes, x, intended):
    """The fold instead: each shard's block scales x own/kept, re-rounded to E4M3."""
    kept = max(s[2] for s in shards)
    parts = []
    for packed, scales, own in shards:
        rescaled = (scales.double() * own / kept).to(torch.float8_e4m3fn)
        parts.append(dequantize(rescaled, torch.full((packed.shape[0],), kept,
                                                     dtype=torch.float64), packed))
    out = x.double() @ torch.cat(parts).T
    return per_shard(out, intended, sizes)


def per_shard(out, truth, sizes):
    errors, start = [], 0
    for size in sizes:
        a, b = out[:, start:start + size], truth[:, start:start + size]
        errors.append(((a - b).norm() / b.norm()).item())
        start += size
    return errors


def main() -> None:
    from vllm.distributed import parallel_state
    from vllm.model_executor.layers import linear
    from vllm.model_executor.layers.quantization import glm53_linear_scales as helper
    from vllm.model_executor.layers.quantization import modelopt

    parallel_state._TP = types.SimpleNamespace(rank_in_group=0, world_size=1)
    modelopt.select_linear_kernel = lambda *args, **kwargs: KernelStandIn()
    config = modelopt.ModelOptNvFp4Config.from_config({"quantization": {
        "quant_algo": "NVFP4", "group_size": 16, "kv_cache_quant_algo": None,
        "exclude_modules": []}})
    method_cls = modelopt.ModelOptLinearMethod
    fixed_process = method_cls.process_weights_after_loading
    fixed_apply = method_cls.apply
    x = torch.randn(TOKENS, HIDDEN, generator=torch.Generator().manual_seed(3),
                    dtype=torch.float64)
    result = {"cases": {}}
    for name, (kind, sizes, amaxes) in CASES.items():
        shards = shard_weights(sizes, amaxes, seed=len(name))
        bias = torch.randn(sum(sizes), generator=torch.Generator().manual_seed(9)).bfloat16()
        intended = x @ torch.cat([dequantize(s, torch.full((p.shape[0],), g,
                                                           dtype=torch.float64), p)
                                  for p, s, g in shards]).T
        doc = {"sizes": sizes, "globals": [s[2] for s in shards]}
        outputs = {}
        runs = {"stock": (fixed_process.__wrapped__, fixed_apply.__wrapped__, None),
                "fixed": (fixed_process, fixed_apply, None),
                "factor_1pct_off": (fixed_process, fixed_apply, "factor"),
                "scaled_after_bias": (fixed_process, fixed_apply, "bias"),
                "bias_as_the_kernel_holds_it": (fixed_process, fixed_apply, "held_bias")}
        for run, (process, apply, plant) in runs.items():
            layer = build(linear, modelopt, config, kind, sizes)
            method = layer.quant_method
            assert type(method) is method_cls, type(method)
            load(layer, shards, bias)
            process(method, layer)
            scale = getattr(layer, helper.SCALE_ATTR, None)
            if plant == "factor" and scale is not None:
                scale[sizes[0]:sizes[0] + sizes[1]] *= 1.01  # the second shard's factor
            if plant == "bias" and scale is not None:  # the bias scaled with the GEMM
                out = (method.kernel.apply_weights(layer, x, layer.bias) * scale)
            elif plant == "held_bias" and scale is not None:  # the kernel's reordered bias added
                out = method.kernel.apply_weights(layer, x, None) * scale + layer.bias.double()
            else:  # the layer's own bias, as vLLM's LinearBase.forward passes it
                out = apply(method, layer, x, layer.bias)
            outputs[run] = out
            doc[run] = per_shard(out - bias.double(), intended, sizes)
            doc[f"{run}_scaled"] = scale is not None
        doc["fold_instead"] = fold_error(shards, sizes, x, intended)
        doc["stock_fixed_bit_identical"] = bool(torch.equal(outputs["stock"], outputs["fixed"]))
        result["cases"][name] = doc
    result["model_report"] = helper.MODEL_REPORT.line()
    print(json.dumps(result))


if __name__ == "__main__":
    sys.exit(main())
