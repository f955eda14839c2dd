"""Layer v13's weight groups on vLLM 0.30.0's own CUDA kernels (run on the GPU machine).

For each shape of GLM-5.3-Flash's swapped linears at TP=2 and each format layer v13 uses
(INT8 weight-only at group 64 and 128: CompressedTensorsWNA16 on GPTQ-Marlin; NVFP4 weight-only
with the drafter's amax and the target's searched block scales: CompressedTensorsW4A4Fp4 in
its A16 form on Marlin FP4), a stand-in linear is swapped exactly as the engine swaps it (the
installed helper's `swap_linear`: quantize, pack, vLLM's `create_weights` and
`process_weights_after_loading`, the Marlin repack), under the kernel choice
`--linear-backend marlin` makes, and the kernel class vLLM chose must be the one each lever
is claimed to run on (EXPECTED_KERNELS). Then, at the verify step's row counts M:

- dense rows (randn, bf16): vLLM's `apply` eagerly and replayed from a CUDA graph on new input
  into a poisoned output, and cuBLAS's BF16 product of the same dequantized weight;
- probes: every input column read alone (one-hot rows, M at a time), so every weight, every
  block scale and the global scale are each seen in an output of their own;
- each output judged against the float64 product of the dequantized weight by
  tests/gpu/bounds.py's bound (bf16's rounding, a sqrt(K) bound with a stated false-fail
  rate; docs/gpu-tier.md says why);
- time: per product, CUDA-graph replays of COPIES products over distinct weights (together
  several times the L2 cache, so every product reads its weight from memory, as a decode step
  does), against BF16 `F.linear` of the same shape, median of REPLAYS.

Plants (PLANTS: the output scaled by 1.01, the global scale off by 1%, one block's scale off
by one E4M3 code) go through the same swap and checks on every shape and M and must fail
there; the layout faults (LAYOUT_FAULTS) on one shape. Prints progress on stderr; writes one
JSON document.

    python3 tests/gpu/kernels.py OUT.json

Building the cases (`cases`, `build`) touches no GPU: the vllm tier runs it on CPU against the
current helper, with tests/gpu/kernel_emulation.py standing in for Marlin
(tests/vllm/test_gpu_kernels_cpu.py), so a helper whose signature moved fails CI.
"""

from __future__ import annotations

import json
import math
import signal
import statistics
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

REPO_ROOT = Path(__file__).resolve().parents[2]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from tests.gpu import bounds  # noqa: E402
from tests.vllm.probes.weight_groups_roundtrip import SHAPES, weight  # noqa: E402

# Beyond the CPU probe's shapes: KDA's merged input projection at TP=2 (q, k, v of 64 heads x
# 128 halved, 32 betas, f_a and g_a of 128 replicated: 12,576 rows, not a multiple of Marlin's
# 64-row tile, so vLLM pads it) and the whole lm_head shard (154,880 / 2 rows), the largest read
GPU_SHAPES = {**SHAPES, "kda_in.in_proj_qkvbfg_a": (12576, 4096), "lm_head": (77440, 4096)}


@dataclass(frozen=True)
class Format:
    kind: str    # swap_linear's fmt: int8 or nvfp4
    group: int   # inputs per scale
    scales: str  # NVFP4 block scales (swap_linear's nvfp4_scales; INT8 ignores it)


# the engine's own choices (patches/v13/weight_groups.py): target groups pass the target's
# NVFP4 scales whatever their format; the drafter's NVFP4 uses amax block scales
FORMATS = {"int8-g64": Format("int8", 64, "searched"),
           "int8-g128": Format("int8", 128, "searched"),
           "nvfp4-amax": Format("nvfp4", 16, "amax"),          # DRAFT_WEIGHTS=nvfp4 (default)
           "nvfp4-searched": Format("nvfp4", 16, "searched")}  # TARGET_WEIGHT_FORMAT=nvfp4
# the kernel class each lever is claimed to run on (docs/gpu-tier.md); another fails its case
EXPECTED_KERNELS = {"int8": "MarlinLinearKernel", "nvfp4": "MarlinNvFp4LinearKernel"}
ROWS = (1, 2, 8, 16)  # the verify step's rows: k + 1 at k = 7 is 8, two sequences 16
PROBE_CHUNK = 512  # probe outputs judged this many rows at a time (bounds the float64 temporaries)
L2_BYTES = 60 << 20  # the H200's L2 (KINDS.md, read by torch on the machine)
MIN_STREAMED = 4 * L2_BYTES
MAX_COPIES = 32
REPLAYS = 30
FAULT_SHAPE = "mla.o_proj"
FAULT_ROWS = 8


def log(message: str) -> None:
    print(f"gpu kernels: {message}", file=sys.stderr, flush=True)


def helper_module():
    """The weight-group module layer v13 installs, as the engine imports it."""
    from vllm.model_executor.model_loader import glm53_weight_groups

    return glm53_weight_groups


def marlin_config(device: str = "cuda"):
    """The vLLM config `--linear-backend marlin` (the launcher's flag) gives the kernels, on
    DEVICE (named: on the CPU vLLM infers none)."""
    from vllm.config import DeviceConfig, KernelConfig, VllmConfig

    return VllmConfig(device_config=DeviceConfig(device=device),
                      kernel_config=KernelConfig(linear_backend="marlin"))


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


# ----------------------------------------------------------------------------- cases


@dataclass(frozen=True)
class Case:
    linear: str
    n: int
    k: int
    label: str  # a FORMATS key
    seed: int

    @property
    def fmt(self) -> Format:
        return FORMATS[self.label]


def cases(shapes: dict[str, tuple[int, int]] = GPU_SHAPES) -> list[Case]:
    """Every (linear, format) the tier checks, in order; each linear's weight seeded by its
    place in SHAPES."""
    return [Case(name, n, k, label, index) for index, (name, (n, k)) in enumerate(shapes.items())
            for label in FORMATS]


def packer_name(fmt: Format) -> str:
    """The helper function that quantizes and packs FMT (the plants replace it for a swap)."""
    return "int8_wna16" if fmt.kind == "int8" else "nvfp4"


def swapped(helper, name: str, w: torch.Tensor, fmt: Format) -> torch.nn.Module:
    layer = standin_layer(w)
    helper.swap_linear(name, layer, fmt.kind, fmt.group, fmt.scales)
    return layer


def dequantized(helper, w: torch.Tensor, fmt: Format) -> torch.Tensor:
    """The weight the swap packs, read back through vLLM's own unpacking (float32)."""
    if fmt.kind == "int8":
        return helper.int8_wna16_dequantized(helper.int8_wna16(w, fmt.group), fmt.group)
    return helper.nvfp4_dequantized(helper.nvfp4(w, fmt.scales))


def kernel_class(layer: torch.nn.Module) -> str:
    """The class of the kernel vLLM's scheme chose for the swapped layer."""
    return type(layer.scheme.kernel).__name__


@dataclass
class Built:
    layer: torch.nn.Module
    w_deq: torch.Tensor  # what the kernel should compute with (the honest packing's, float32)
    kernel: str
    apply: Callable[[torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class Plant:
    """A fault planted in a swapped layer: its packed tensors corrupted before the swap
    (`tensors`), or its output scaled (`output_scale`)."""
    kinds: tuple[str, ...]  # the formats it applies to
    tensors: Callable[[dict], dict] | None = None
    output_scale: float | None = None


def _global_scale_off(tensors: dict) -> dict:
    """The global scale's divisor 1% high: every weight read 1% low."""
    return {**tensors, "weight_global_scale": tensors["weight_global_scale"] * 1.01}


def _block_scale_off_by_one_code(tensors: dict) -> dict:
    """Row 0's largest block scale one E4M3 code up (down at the largest code, 448): a block
    of 16 weights off by 1/16 to 1/8, the rest of the tensor as it was."""
    codes = tensors["weight_scale"].view(torch.uint8).clone()
    block = int(codes[0].argmax())
    codes[0, block] += 1 if int(codes[0, block]) < 0x7E else -1
    return {**tensors, "weight_scale": codes.view(torch.float8_e4m3fn)}


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


# must fail on every shape, format they apply to, and M
PLANTS = {
    "output scaled by 1.01": Plant(("int8", "nvfp4"), output_scale=1.01),
    "global scale off by 1%": Plant(("nvfp4",), tensors=_global_scale_off),
    "one block scale off by one E4M3 code": Plant(("nvfp4",), tensors=_block_scale_off_by_one_code),
}
# layout faults, on FAULT_SHAPE at FAULT_ROWS (each fails by 30-50x its bound: no need for more)
LAYOUT_FAULTS = {
    "int8 scales in the wrong layout": ("int8-g128", _int8_scale_layout),
    "int8 values packed in the wrong order": ("int8-g128", _int8_pack_order),
    "nvfp4 block scales in the wrong layout": ("nvfp4-amax", _nvfp4_scale_layout),
    "nvfp4 nibbles in the wrong order": ("nvfp4-amax", _nvfp4_pack_order),
}


def build(helper, name: str, w: torch.Tensor, fmt: Format,
          corrupt: Callable[[dict], dict] | None = None,
          output_scale: float | None = None) -> Built:
    """The swapped layer as the engine builds it, the dequantized weight it must compute
    with (from the honest packing), the kernel vLLM chose, and its product; CORRUPT replaces
    the packed tensors for this swap, OUTPUT_SCALE scales its output (the plants)."""
    w_deq = dequantized(helper, w, fmt)
    packer = packer_name(fmt)
    honest = getattr(helper, packer)
    if corrupt is not None:
        setattr(helper, packer, lambda *args: corrupt(honest(*args)))
    try:
        layer = swapped(helper, name, w, fmt)
    finally:
        setattr(helper, packer, honest)

    def apply(x: torch.Tensor) -> torch.Tensor:
        y = layer.quant_method.apply(layer, x)
        return y if output_scale is None else (y.float() * output_scale).to(y.dtype)

    return Built(layer, w_deq, kernel_class(layer), apply)


def plant_build(helper, name: str, w: torch.Tensor, fmt: Format, plant: Plant) -> Built:
    return build(helper, name, w, fmt, plant.tensors, plant.output_scale)


# ----------------------------------------------------------------------------- checks


def worst(y: torch.Tensor, x: torch.Tensor, w_deq: torch.Tensor) -> float:
    """The statistic judged: max over the output of |error| / bound (bounds.py)."""
    return float(bounds.error_over_bound(y, x, w_deq).max())


error_over_bound = worst  # the name the kernel checks had before the sqrt(K) bound


def graph_replayed(apply, rows: int, k: int, generator, device) -> tuple[torch.Tensor,
                                                                         torch.Tensor]:
    """APPLY captured in a CUDA graph on one input, replayed on new input into a poisoned
    output: (the new input, what the replay wrote)."""
    static_x = torch.randn(rows, k, generator=generator, device=device).to(torch.bfloat16)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            apply(static_x)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_y = apply(static_x)
    fresh = torch.randn(rows, k, generator=generator, device=device).to(torch.bfloat16)
    static_x.copy_(fresh)
    static_y.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    return fresh, static_y


def probed(apply, w_deq: torch.Tensor, rows: int, stop_above: float | None = None) -> float:
    """Every input column read alone: one-hot rows, ROWS at a time, each output judged; the
    worst error / bound (with STOP_ABOVE, the first chunk's worst beyond it, a plant's
    failure being all that is asked of it)."""
    k = w_deq.shape[1]
    eye = torch.eye(k, dtype=torch.bfloat16, device=w_deq.device)
    found = 0.0
    for start in range(0, k, PROBE_CHUNK):
        stop = min(k, start + PROBE_CHUNK)
        outputs = torch.cat([apply(eye[first:min(stop, first + rows)])
                             for first in range(start, stop, rows)])
        found = max(found, worst(outputs, eye[start:stop], w_deq))
        if stop_above is not None and found > stop_above:
            break
    return found


def check_rows(built: Built, rows: int, generator, device, graph: bool,
               plant: bool = False, whole: bool = False) -> dict:
    """Built's product at ROWS rows: dense (eager, graph, cuBLAS's BF16 of the same weight)
    and probes. An honest kernel passes when each is within the bound; a plant when it is
    not (checked cheapest first, stopping at its first failure unless WHOLE: then its worst
    error / bound over everything, as for an honest kernel)."""
    k = built.w_deq.shape[1]
    x = torch.randn(rows, k, generator=generator, device=device).to(torch.bfloat16)
    judged = {"eager": worst(built.apply(x), x, built.w_deq)}
    out = {"m": rows}
    if not plant:
        w_bf16 = built.w_deq.to(torch.bfloat16)
        out["cublas_bf16"] = worst(torch.nn.functional.linear(x, w_bf16), x, built.w_deq)
    stop_early = plant and not whole
    if graph and not (stop_early and judged["eager"] > 1.0):
        fresh, replayed = graph_replayed(built.apply, rows, k, generator, device)
        judged["graph"] = worst(replayed, fresh, built.w_deq)
    if not (stop_early and max(judged.values()) > 1.0):
        judged["probes"] = probed(built.apply, built.w_deq, rows, 1.0 if stop_early else None)
    out.update(judged, worst=max(judged.values()))
    out["passed"] = out["worst"] <= 1.0 and out.get("cublas_bf16", 0.0) <= 1.0
    return out


# ----------------------------------------------------------------------------- timing


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


def timing(helper, name: str, w: torch.Tensor, fmt: Format) -> list[dict]:
    n, k = w.shape
    per_value = 1.0 if fmt.kind == "int8" else 0.5
    quant_copies = copies_for(int(n * k * per_value))
    layers = [swapped(helper, name, w, fmt) for _ in range(quant_copies)]
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


# ----------------------------------------------------------------------------- run


def check_case(helper, case: Case, w: torch.Tensor, generator, device, graph: bool,
               expected: dict[str, str], timed: bool, whole_plants: bool = False) -> dict:
    """One (linear, format): the honest kernel within the bound at every M, the kernel class
    the one expected, and every plant of its format failing at every M."""
    built = build(helper, case.linear, w, case.fmt)
    checks = [check_rows(built, rows, generator, device, graph) for rows in ROWS]
    entry = {"kernel": built.kernel, "expected_kernel": expected[case.fmt.kind],
             "checks": checks, "plants": {}}
    del built
    for plant_name, plant in PLANTS.items():
        if case.fmt.kind not in plant.kinds:
            continue
        planted = plant_build(helper, f"plant:{plant_name}", w, case.fmt, plant)
        entry["plants"][plant_name] = [
            check_rows(planted, rows, generator, device, graph, plant=True, whole=whole_plants)
            for rows in ROWS]
        del planted
    if timed:
        entry["timing"] = timing(helper, case.linear, w, case.fmt)
    entry["plants_fail"] = all(not c["passed"] for runs in entry["plants"].values()
                               for c in runs)
    entry["passed"] = (entry["kernel"] == entry["expected_kernel"]
                       and all(c["passed"] for c in checks) and entry["plants_fail"])
    return entry


def layout_fault(helper, fault: str, w: torch.Tensor, generator, device, graph: bool) -> dict:
    label, corrupt = LAYOUT_FAULTS[fault]
    built = build(helper, f"fault:{fault}", w, FORMATS[label], corrupt)
    check = check_rows(built, FAULT_ROWS, generator, device, graph, plant=True)
    return {"fault": fault, "format": label, **check, "failed_as_it_should": not check["passed"]}


def run(doc: dict, helper=None, device: str = "cuda",
        shapes: dict[str, tuple[int, int]] = GPU_SHAPES,
        expected: dict[str, str] = EXPECTED_KERNELS, graph: bool = True,
        timed: bool = True, fault_shape: str = FAULT_SHAPE, whole_plants: bool = False) -> None:
    """Fills `doc` as it goes, so that a run cut short still reports what it saw. On the GPU
    machine as `main` calls it (each plant checked until it fails); on CPU (graph and timing
    off, each plant's worst over everything) by the vllm tier's test."""
    from vllm.config import set_current_vllm_config

    one_rank()
    helper = helper or helper_module()
    generator = torch.Generator(device=device).manual_seed(53)
    doc.update({"device": torch.cuda.get_device_name(0) if device == "cuda" else device,
                "torch": torch.__version__, "helper": helper.__file__, "rows": list(ROWS),
                "bound": f"tests/gpu/bounds.py: bf16, z = {bounds.Z:g} "
                         f"(false fail <= {bounds.FALSE_FAIL_PER_OUTPUT:.1e} per output)",
                "shapes": {}, "faults": []})
    if device == "cuda":
        doc["capability"] = list(torch.cuda.get_device_capability(0))
    with set_current_vllm_config(marlin_config(device)):
        by_linear: dict[str, list[Case]] = {}
        for case in cases(shapes):
            by_linear.setdefault(case.linear, []).append(case)
        for name, its_cases in by_linear.items():
            started = time.monotonic()
            first = its_cases[0]
            w = weight(first.n, first.k, first.seed).to(device)
            entry = doc["shapes"][name] = {"n": first.n, "k": first.k, "formats": {}}
            for case in its_cases:
                entry["formats"][case.label] = check_case(helper, case, w, generator, device,
                                                          graph, expected, timed, whole_plants)
                if device == "cuda":
                    torch.cuda.empty_cache()
            honest = max(c["worst"] for f in entry["formats"].values() for c in f["checks"])
            planted = min(c["worst"] for f in entry["formats"].values()
                          for runs in f["plants"].values() for c in runs)
            log(f"{name} ({first.n}x{first.k}): worst error/bound {honest:.3f}, plants at least "
                f"{planted:.2f}, {time.monotonic() - started:.1f} s")
            if name == fault_shape:
                for fault in LAYOUT_FAULTS:
                    doc["faults"].append(layout_fault(helper, fault, w, generator, device, graph))
                    log(f"fault '{fault}': error/bound {doc['faults'][-1]['worst']:.3g}")
            del w
    doc["passed"] = verdict(doc, shapes)


def verdict(doc: dict, shapes: dict[str, tuple[int, int]] = GPU_SHAPES) -> bool:
    """Passed only when every planned (linear, format) of SHAPES was checked at every M with
    at least one plant, all passed (plants failing), and every layout fault failed: a run
    that judged less than planned fails."""
    planned = {(case.linear, case.label) for case in cases(shapes)}
    entries = {(name, label): entry for name, shape in doc.get("shapes", {}).items()
               for label, entry in shape.get("formats", {}).items()}
    complete = set(entries) == planned and all(
        len(entry["checks"]) == len(ROWS) and entry["plants"] and
        all(len(runs) == len(ROWS) for runs in entry["plants"].values())
        for entry in entries.values())
    faults = doc.get("faults", [])
    return complete and all(entry["passed"] for entry in entries.values()) and \
        sorted(f["fault"] for f in faults) == sorted(LAYOUT_FAULTS) and \
        all(f["failed_as_it_should"] for f in faults)


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
