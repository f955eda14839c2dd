"""Layer v13's weight groups on vLLM 0.30.0's own CUDA kernels (run on the GPU machine).

For each shape of GLM-5.3-Flash's swapped linears at TP=2 and each format layer v13 uses
(INT8 weight-only at group 64 and 128: CompressedTensorsWNA16 on GPTQ-Marlin; NVFP4 weight-only:
CompressedTensorsW4A4Fp4 in its A16 form on Marlin FP4), a stand-in linear is swapped exactly
as the engine swaps it (the installed helper's `swap_linear`: quantize, pack, vLLM's
`create_weights` and `process_weights_after_loading`, the Marlin repack), under the kernel
choice `--linear-backend marlin` makes. Then, at the verify step's row counts M:

- eager: vLLM's `apply` against the float64 product of the dequantized weight, within
  bfloat16's bound; the cuBLAS BF16 product of that weight is held to the same bound;
- graph: the same product captured in a CUDA graph, replayed on new input into a poisoned
  output;
- time: per product, CUDA-graph replays of COPIES products over distinct weights (together
  several times the L2 cache, so every product reads its weight from memory, as a decode step
  does), against BF16 `F.linear` of the same shape, median of REPLAYS.

Planted faults (a scale tensor read in the wrong layout, a wrong pack order) go through the
same swap and check, and must fail it. Prints progress on stderr; writes one JSON document.

    python3 tests/gpu/kernels.py OUT.json
"""

from __future__ import annotations

import json
import math
import signal
import statistics
import sys
import time
import traceback
from pathlib import Path

import torch

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT))

from tests.vllm.probes.weight_groups_roundtrip import SHAPES, weight  # noqa: E402

# Beyond the CPU probe's shapes: KDA's merged input projection at TP=2 (q, k, v of 64 heads x
# 128 halved, 32 betas, f_a and g_a of 128 replicated: 12,576 rows, not a multiple of Marlin's
# 64-row tile, so vLLM pads it) and the whole lm_head shard (154,880 / 2 rows), the largest read
GPU_SHAPES = {**SHAPES, "kda_in.in_proj_qkvbfg_a": (12576, 4096), "lm_head": (77440, 4096)}
FORMATS = {"int8-g64": ("int8", 64), "int8-g128": ("int8", 128), "nvfp4": ("nvfp4", 16)}
ROWS = (1, 2, 8, 16)  # the verify step's rows: k + 1 at k = 7 is 8, two sequences 16
# bfloat16 keeps 8 significant bits: rounding to nearest errs by at most 2^-9 relative. Per
# term of the sum, the dequantized weight as the kernel holds it in bf16; the output rounded
# once more. Twice that bound is allowed: accumulation orders differ.
BF16_UNIT = 2.0 ** -9
SLACK = 2.0
L2_BYTES = 60 << 20  # the H200's L2 (KINDS.md, read by torch on the machine)
MIN_STREAMED = 4 * L2_BYTES
MAX_COPIES = 32
REPLAYS = 30
FAULT_SHAPE = "mla.o_proj"
MARLIN = {"int8": "MarlinLinearKernel", "nvfp4": "MarlinNvFp4LinearKernel"}


def log(message: str) -> None:
    print(f"gpu kernels: {message}", file=sys.stderr, flush=True)


def helper_module():
    """The weight-group module layer v13 installs, as the engine imports it."""
    from vllm.model_executor.model_loader import glm53_weight_groups

    return glm53_weight_groups


def marlin_config():
    """The vLLM config `--linear-backend marlin` (the launcher's flag) gives the kernels."""
    from vllm.config import KernelConfig, VllmConfig

    return VllmConfig(kernel_config=KernelConfig(linear_backend="marlin"))


def standin_layer(w: torch.Tensor, parts: list[int] | None = None) -> torch.nn.Module:
    """A BF16 linear as vLLM's UnquantizedLinearMethod leaves it, at one rank."""
    from vllm.model_executor.layers.linear import UnquantizedLinearMethod

    layer = torch.nn.Module()
    layer.register_parameter("weight", torch.nn.Parameter(w.clone(), requires_grad=False))
    layer.quant_method = UnquantizedLinearMethod()
    layer.output_size, layer.input_size = w.shape
    layer.output_partition_sizes = parts or [w.shape[0]]
    layer.params_dtype = torch.bfloat16
    return layer


def one_rank() -> None:
    """vLLM's parameters ask the tensor-parallel group for rank and size; there is none."""
    from vllm.model_executor import parameter

    parameter.get_tensor_model_parallel_rank = lambda: 0
    parameter.get_tensor_model_parallel_world_size = lambda: 1


def swapped(helper, name: str, w: torch.Tensor, fmt: str, group: int):
    layer = standin_layer(w)
    helper.swap_linear(name, layer, fmt, group)
    return layer


def dequantized(helper, w: torch.Tensor, fmt: str, group: int) -> torch.Tensor:
    """The weight the swap packs, read back through vLLM's own unpacking (float32)."""
    if fmt == "int8":
        return helper.int8_wna16_dequantized(helper.int8_wna16(w, group), group)
    return helper.nvfp4_dequantized(helper.nvfp4(w))


def error_over_bound(y: torch.Tensor, x: torch.Tensor, w_deq: torch.Tensor) -> float:
    """max |y - x w^T| / bound, the product in float64; inf where y is not finite."""
    if not torch.isfinite(y).all():
        return math.inf
    x64, w64 = x.double(), w_deq.double()
    exact = x64 @ w64.T
    bound = SLACK * BF16_UNIT * (x64.abs() @ w64.abs().T + exact.abs()) + 1e-30
    return float(((y.double() - exact).abs() / bound).max())


def eager_and_graph(layer, w_deq: torch.Tensor, k: int, rows: int, generator) -> dict:
    apply = layer.quant_method.apply
    x = torch.randn(rows, k, generator=generator, device="cuda").to(torch.bfloat16)
    eager = error_over_bound(apply(layer, x), x, w_deq)
    cublas = error_over_bound(torch.nn.functional.linear(x, w_deq.to(torch.bfloat16)), x, w_deq)
    static_x = torch.randn(rows, k, generator=generator, device="cuda").to(torch.bfloat16)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            apply(layer, static_x)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_y = apply(layer, static_x)
    fresh = torch.randn(rows, k, generator=generator, device="cuda").to(torch.bfloat16)
    static_x.copy_(fresh)
    static_y.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    replayed = error_over_bound(static_y, fresh, w_deq)
    return {"m": rows, "eager": eager, "cublas_bf16": cublas, "graph": replayed,
            "passed": max(eager, replayed) <= 1.0}


def graph_time_us(products, rows: int, k: int) -> float:
    """Median over REPLAYS of one graph holding every product in `products`, per product."""
    x = torch.randn(rows, k, device="cuda").to(torch.bfloat16)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for product in products:
            product(x)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for product in products:
            product(x)
    for _ in range(3):
        graph.replay()
    times = []
    for _ in range(REPLAYS):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000.0)
    return statistics.median(times) / len(products)


def copies_for(weight_bytes: int) -> int:
    return max(2, min(MAX_COPIES, math.ceil(MIN_STREAMED / weight_bytes)))


def timing(helper, name: str, w: torch.Tensor, fmt: str, group: int) -> dict:
    n, k = w.shape
    per_value = 1.0 if fmt == "int8" else 0.5
    quant_copies = copies_for(int(n * k * per_value))
    layers = [swapped(helper, name, w, fmt, group) for _ in range(quant_copies)]
    out = {}
    for rows in ROWS:
        quant = graph_time_us([lambda x, l=layer: l.quant_method.apply(l, x) for layer in layers],
                              rows, k)
        out[rows] = quant
    del layers
    bf16_copies = copies_for(n * k * 2)
    weights = [w.clone() for _ in range(bf16_copies)]
    result = []
    for rows in ROWS:
        base = graph_time_us([lambda x, ww=ww: torch.nn.functional.linear(x, ww)
                              for ww in weights], rows, k)
        result.append({"m": rows, "us": round(out[rows], 2), "bf16_us": round(base, 2),
                       "ratio": round(out[rows] / base, 3), "copies": quant_copies,
                       "bf16_copies": bf16_copies})
    del weights
    return result


# ----------------------------------------------------------------------------- faults


def _int8_scale_layout(tensors: dict) -> dict:
    """The (N, K/g) scales read as if stored (K/g, N)."""
    scale = tensors["weight_scale"]
    return {**tensors, "weight_scale": scale.t().contiguous().reshape(scale.shape)}


def _int8_pack_order(tensors: dict) -> dict:
    """The four 8-bit values of each int32 packed in the reverse order."""
    packed = tensors["weight_packed"].contiguous()
    as_bytes = packed.view(torch.uint8).reshape(*packed.shape, 4).flip(-1)
    return {**tensors, "weight_packed": as_bytes.reshape(packed.shape[0], -1).view(torch.int32)}


def _nvfp4_scale_layout(tensors: dict) -> dict:
    scale = tensors["weight_scale"]
    return {**tensors, "weight_scale": scale.t().contiguous().reshape(scale.shape)}


def _nvfp4_pack_order(tensors: dict) -> dict:
    """The high nibble first instead of the low."""
    packed = tensors["weight_packed"]
    return {**tensors, "weight_packed": (packed >> 4) | ((packed & 0xF) << 4)}


FAULTS = {
    "int8 scales in the wrong layout": ("int8", 128, "int8_wna16", _int8_scale_layout),
    "int8 values packed in the wrong order": ("int8", 128, "int8_wna16", _int8_pack_order),
    "nvfp4 block scales in the wrong layout": ("nvfp4", 16, "nvfp4", _nvfp4_scale_layout),
    "nvfp4 nibbles in the wrong order": ("nvfp4", 16, "nvfp4", _nvfp4_pack_order),
}


def planted(helper, fault: str, w: torch.Tensor, generator) -> dict:
    fmt, group, packer, corrupt = FAULTS[fault]
    honest = getattr(helper, packer)
    w_deq = dequantized(helper, w, fmt, group)
    setattr(helper, packer, lambda *args: corrupt(honest(*args)))
    try:
        layer = swapped(helper, f"fault:{fault}", w, fmt, group)
    finally:
        setattr(helper, packer, honest)
    check = eager_and_graph(layer, w_deq, w.shape[1], 8, generator)
    return {"fault": fault, "shape": FAULT_SHAPE, **check, "failed_as_it_should": not check["passed"]}


# ----------------------------------------------------------------------------- run


def run(doc: dict) -> None:
    """Fills `doc` as it goes, so that a run cut short still reports what it saw."""
    from vllm.config import set_current_vllm_config

    one_rank()
    helper = helper_module()
    generator = torch.Generator(device="cuda").manual_seed(53)
    doc.update({"device": torch.cuda.get_device_name(0), "torch": torch.__version__,
           "capability": list(torch.cuda.get_device_capability(0)),
           "helper": helper.__file__, "rows": list(ROWS), "bound": f"{SLACK:g} x 2^-9 x "
           "(|x| |w|^T + |x w^T|), the product in float64", "shapes": {}, "faults": []})
    with set_current_vllm_config(marlin_config()):
        for index, (name, (n, k)) in enumerate(GPU_SHAPES.items()):
            started = time.monotonic()
            w = weight(n, k, index).cuda()
            entry = {"n": n, "k": k, "formats": {}}
            for label, (fmt, group) in FORMATS.items():
                layer = swapped(helper, name, w, fmt, group)
                w_deq = dequantized(helper, w, fmt, group)
                kernel = type(layer.scheme.kernel).__name__
                checks = [eager_and_graph(layer, w_deq, k, rows, generator) for rows in ROWS]
                del layer
                entry["formats"][label] = {
                    "kernel": kernel, "marlin": kernel == MARLIN[fmt], "checks": checks,
                    "timing": timing(helper, name, w, fmt, group),
                    "passed": kernel == MARLIN[fmt] and all(c["passed"] for c in checks)}
                torch.cuda.empty_cache()
            doc["shapes"][name] = entry
            worst = max(c["graph"] for f in entry["formats"].values() for c in f["checks"])
            log(f"{name} ({n}x{k}): worst error/bound {worst:.3f}, "
                f"{time.monotonic() - started:.1f} s")
            if name == FAULT_SHAPE:
                for fault in FAULTS:
                    doc["faults"].append(planted(helper, fault, w, generator))
                    log(f"fault '{fault}': error/bound "
                        f"{doc['faults'][-1]['eager']:.3g}")
            del w
            torch.cuda.empty_cache()
    doc["passed"] = all(f["passed"] for s in doc["shapes"].values()
                        for f in s["formats"].values()) and \
        len(doc["faults"]) == len(FAULTS) and all(f["failed_as_it_should"] for f in doc["faults"])


def _stopped(signum, _frame):
    raise SystemExit(f"stopped by signal {signum}")


def main(out_path: str) -> int:
    signal.signal(signal.SIGTERM, _stopped)  # `timeout` ends the run: write what was seen
    doc: dict = {"passed": False}
    try:
        run(doc)
    except BaseException as error:
        text = "".join(traceback.format_exception(error))
        doc["error"] = text if len(text) < 4000 else f"{text[:2000]}\n...\n{text[-2000:]}"
        doc["passed"] = False
    finally:
        Path(out_path).write_text(json.dumps(doc, indent=1))
    log(f"{'passed' if doc['passed'] else 'FAILED'}; {out_path}")
    return 0 if doc["passed"] else 1


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
