"""v8_moe_scales on vLLM 0.30.0's own fused Marlin MoE (run on the GPU machine).

A synthetic ModelOpt NVFP4 MoE layer (tests/vllm/probes/moe_global_scales.py's experts: gate
and up global scales equal, or unequal by the planted ratios) is built by vLLM's own
``ModelOptNvFp4FusedMoE.create_weights``, loaded, and prepared by its
``process_weights_after_loading`` on the Marlin backend (the launcher's ``--moe-backend
marlin``): the stock method (the decorator's ``__wrapped__``) and the patched one. Only the
modular-kernel object is not built; vLLM's ``fused_marlin_moe`` runs on what the method left.

Per case, against float64:
- the checkpoint's intended weights (fp4 x block scale x that half's own global): the output's
  relative error, stock and fixed;
- the weights the kernel was handed (after the fold): the kernel's error, judged against
  cuBLAS's BF16 pipeline on the same dequantized weights and inputs (the kernel may err up to
  BF16_FACTOR times as much; both round activations and the intermediate to bfloat16).
Fixed must be within the fold's own error (float64 of the folded weights against the
intended) plus the kernel's; stock off by the ratio; equal scales bit-identical.

    python3 tests/gpu/moe_scales.py OUT.json
"""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path

import torch

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT / "tests/vllm/probes"))

import moe_global_scales as probe  # noqa: E402  the synthetic experts, one definition

TOKENS, TOPK = 64, 2
HIDDEN, ROWS = 512, 256  # Marlin's tiles: hidden a multiple of 128, rows of 64
BF16_FACTOR = 4.0


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


def moe_reference(x, w13, w2, topk_ids, topk_weights, dtype):
    """SiLU-and-mul MoE in DTYPE (float64, or bfloat16 through cuBLAS)."""
    x = x.to(dtype)
    out = torch.zeros(x.shape[0], w2.shape[1], dtype=torch.float64, device=x.device)
    for slot in range(topk_ids.shape[1]):
        for expert in topk_ids[:, slot].unique().tolist():
            rows = (topk_ids[:, slot] == expert).nonzero().flatten()
            h = x[rows] @ w13[expert].to(dtype).T
            gate, up = h.chunk(2, -1)
            act = (torch.nn.functional.silu(gate) * up).to(dtype)
            y = (act @ w2[expert].to(dtype).T).double()
            out[rows] += y * topk_weights[rows, slot, None].double()
    return out


def relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm()).item()


def run_case(modelopt, marlin_moe, scalar_types, backend, function, data, x, ids, weights):
    """vLLM prepares the layer with FUNCTION, then its fused Marlin MoE runs: the output, and
    the checkpoint-layout w13 tensors the kernel-format conversion was handed."""
    handed: dict = {}
    convert = modelopt.convert_to_nvfp4_moe_kernel_format

    def recording_convert(**kwargs):
        handed.update(w13_scale=kwargs["w13_scale"].clone(), w13_scale_2=kwargs["w13_scale_2"])
        handed["w13_scale_2"] = handed["w13_scale_2"].clone()
        return convert(**kwargs)

    modelopt.convert_to_nvfp4_moe_kernel_format = recording_convert
    modelopt.make_nvfp4_moe_kernel = lambda **kwargs: types.SimpleNamespace(
        fused_experts=types.SimpleNamespace(process_weights_after_loading=lambda layer: None))
    try:
        layer = probe.load_layer(modelopt, *data[:3])
        layer.hidden_size, layer.intermediate_size_per_partition = HIDDEN, ROWS
        method = probe.make_method(modelopt)
        method.nvfp4_backend = backend
        # w2: the gate's first expert layout, each expert its own global (never folded)
        with torch.no_grad():
            layer.w2_weight.copy_(data[3]), layer.w2_weight_scale.copy_(data[4])
            layer.w2_weight_scale_2.copy_(data[5])
        function(method, layer)
    finally:
        modelopt.convert_to_nvfp4_moe_kernel_format = convert
    out = marlin_moe.fused_marlin_moe(
        x, layer.w13_weight, layer.w2_weight, None, None, layer.w13_weight_scale,
        layer.w2_weight_scale, weights, ids, scalar_types.float4_e2m1f.id,
        global_num_experts=probe.EXPERTS, global_scale1=layer.w13_weight_scale_2,
        global_scale2=layer.w2_weight_scale_2, workspace=layer.workspace)
    return out.double(), handed


def experts(ratios, seed):
    """w13 of the probe's experts at this file's size, and a w2 quantized alike."""
    probe.ROWS, probe.HIDDEN = ROWS, HIDDEN
    packed, scales, globals_ = probe.synthetic_experts(ratios, seed)
    generator = torch.Generator().manual_seed(seed + 100)
    w2 = [probe.quantize_modelopt(torch.randn(HIDDEN, ROWS, generator=generator,
                                              dtype=torch.float64)) for _ in ratios]
    return (packed, scales, globals_, torch.stack([w[0] for w in w2]),
            torch.stack([w[1] for w in w2]), torch.tensor([w[2] for w in w2]))


def main() -> int:
    try:  # vLLM's own import of it swallows the error, and Marlin MoE dies on its first op
        import vllm._moe_C_stable_libtorch  # noqa: F401
    except ImportError as error:
        log(f"the fused MoE's library does not load ({error}): install part moe "
            f"(tests/gpu/run moe)")
        return 2
    from vllm.distributed import parallel_state
    from vllm.model_executor.layers.fused_moe.experts import marlin_moe
    from vllm.model_executor.layers.fused_moe.oracle.nvfp4 import NvFp4MoeBackend
    from vllm.model_executor.layers.quantization import modelopt
    from vllm.scalar_type import scalar_types

    parallel_state._TP = types.SimpleNamespace(rank_in_group=0, world_size=1)
    cases = {"unequal": experts(probe.RATIOS, seed=0), "equal": experts((1.0,) * probe.EXPERTS, 1)}
    torch.set_default_device("cuda")
    fixed = modelopt.ModelOptNvFp4FusedMoE.process_weights_after_loading
    stock = fixed.__wrapped__
    generator = torch.Generator(device="cuda").manual_seed(7)
    x = torch.randn(TOKENS, HIDDEN, generator=generator, device="cuda").bfloat16()
    logits = torch.randn(TOKENS, probe.EXPERTS, generator=generator, device="cuda")
    weights, ids = torch.softmax(logits, -1).topk(TOPK, -1)
    ids = ids.to(torch.int32)
    result, failed = {"tokens": TOKENS, "hidden": HIDDEN, "rows": ROWS, "cases": {}}, []
    for case, data in cases.items():
        ratios = probe.RATIOS if case == "unequal" else (1.0,) * probe.EXPERTS
        on_gpu = tuple(t.cuda() for t in data)
        w2_f64 = dequantize(on_gpu[3], on_gpu[4], on_gpu[5].double()[:, None].expand(-1, HIDDEN))
        intended13 = dequantize(on_gpu[0], on_gpu[1],
                                on_gpu[2].double().repeat_interleave(ROWS, 1))
        truth = moe_reference(x, intended13, w2_f64, ids, weights, torch.float64)
        doc = {"ratios": list(ratios)}
        outputs = {}
        for name, function in (("stock", stock), ("fixed", fixed)):
            out, handed = run_case(modelopt, marlin_moe, scalar_types, NvFp4MoeBackend.MARLIN,
                                   function, on_gpu, x, ids, weights)
            outputs[name] = out
            given13 = dequantize(on_gpu[0], handed["w13_scale"],
                                 handed["w13_scale_2"].double()[:, None].expand(-1, 2 * ROWS))
            given_f64 = moe_reference(x, given13, w2_f64, ids, weights, torch.float64)
            given_bf16 = moe_reference(x, given13, w2_f64, ids, weights, torch.bfloat16)
            doc[name] = {
                "error_vs_intended": relative(out, truth),
                "kernel_error_vs_handed": relative(out, given_f64),
                "bf16_pipeline_error": relative(given_bf16, given_f64),
                "handed_error_vs_intended": relative(given_f64, truth),
            }
            log(f"{case} {name}: {doc[name]}")
        fixed_doc, stock_doc = doc["fixed"], doc["stock"]
        kernel_ok = fixed_doc["kernel_error_vs_handed"] <= \
            BF16_FACTOR * fixed_doc["bf16_pipeline_error"]
        within = fixed_doc["error_vs_intended"] <= fixed_doc["handed_error_vs_intended"] + \
            BF16_FACTOR * fixed_doc["bf16_pipeline_error"]
        doc["checks"] = {"kernel_within_bf16": kernel_ok, "fixed_within_fold_and_kernel": within}
        if case == "equal":
            doc["checks"]["bit_identical"] = bool(torch.equal(outputs["stock"], outputs["fixed"]))
        else:
            doc["checks"]["stock_off"] = stock_doc["error_vs_intended"] > \
                10 * fixed_doc["error_vs_intended"]
        failed += [f"{case}: {name}" for name, ok in doc["checks"].items() if not ok]
        result["cases"][case] = doc
    result["failed"] = failed
    Path(sys.argv[1]).write_text(json.dumps(result, indent=2) + "\n")
    log("failed: " + ", ".join(failed) if failed else "every check passed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
