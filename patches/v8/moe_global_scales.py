"""Each half's global scale honoured in a ModelOpt NVFP4 fused MoE (installed by the chain's
v8 image as ``vllm/model_executor/layers/quantization/glm53_moe_scales.py``).

vLLM's ``ModelOptNvFp4FusedMoE.process_weights_after_loading`` hands the fused gate+up GEMM one
global scale per expert, the gate's (``w13_weight_scale_2[:, 0]``): an expert whose up
projection was exported with another global decodes its up half off by ``up / gate``
(vLLM #54974, #54150). Two routes put it right; per layer, the first that applies is taken:

- **exact** (Marlin W4A16, the recipe's default backend): the kernel keeps the gate's global,
  and each token-expert row of the first GEMM's output has its up half multiplied by that
  expert's ``up / gate`` in float32, before the activation. SiLU(gate) x up is linear in up,
  and a clamp (Glm5Next's ``swiglu_limit``) then sees the right values. Nothing is re-rounded
  but the product itself: one bfloat16 rounding, as the kernel's own output has.
- **fold** (every backend whose activation runs inside the kernel, with no 16-bit intermediate
  reachable from Python: the W4A4 FlashInfer, CuteDSL, CUTLASS and B12X kernels, batched
  Marlin): one global G per expert, each half's ratio ``own / G`` folded into that half's E4M3
  block scales. The fp4 payload is untouched, and a half whose ratio is a power of two keeps its
  block scales exactly; other ratios re-round each block scale to 3 mantissa bits. G is searched
  per expert among each half's global times 2^-1, 2^0, 2^1 (no block scale may pass E4M3's 448):
  the one whose folded weights err least against the checkpoint's, in each block
  ``sum(fp4^2) * (s' * G - s * own)^2``.

``GLM53_MOE_SCALE_ROUTE`` (``auto``, the default: exact where it applies, else fold; ``fold``;
``exact``, refused at load where it cannot apply) picks the route. An expert whose two globals
are equal is not touched by either, so a checkpoint with equal scales loads bit-identical to
stock vLLM.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass, field

import torch

E4M3_MAX = 448.0
# an E2M1 nibble's value: bit 3 is the sign, bits 0-2 index this grid
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
# the global candidates: each half's own times these (a power of two keeps that half exact)
CANDIDATE_SHIFTS = (0, -1, 1)
EXPERTS_AT_ONCE = 16  # bounds the working memory of the search to a few experts' scales
ROUTE_ENV = "GLM53_MOE_SCALE_ROUTE"
ROUTES = ("auto", "exact", "fold")
# where the exact route applies: the experts class whose apply hands its activation callback
# the first GEMM's 16-bit output, one row per (token, top-k slot)
EXACT_EXPERTS = ("vllm.model_executor.layers.fused_moe.experts.marlin_moe", "MarlinExperts")


@dataclass
class FoldReport:
    """What one layer's route did (or, summed, a model's): experts with unequal globals are
    ``folded`` (the fold) or ``scaled`` (the exact route)."""

    layers: int = 0
    experts: int = 0
    folded: int = 0
    scaled: int = 0
    largest_ratio: float = 1.0
    chosen: dict[str, int] = field(default_factory=dict)  # "gate", "up", "gate*2^-1", ...
    routes: dict[str, int] = field(default_factory=dict)  # layers per route

    def add(self, other: FoldReport) -> None:
        self.layers += other.layers
        self.experts += other.experts
        self.folded += other.folded
        self.scaled += other.scaled
        self.largest_ratio = max(self.largest_ratio, other.largest_ratio)
        for name, count in other.chosen.items():
            self.chosen[name] = self.chosen.get(name, 0) + count
        for name, count in other.routes.items():
            self.routes[name] = self.routes.get(name, 0) + count

    def line(self) -> str:
        chosen = ", ".join(f"{name} {count}" for name, count in sorted(self.chosen.items()))
        routes = ", ".join(f"{name} {count}" for name, count in sorted(self.routes.items()))
        parts = [f"{self.experts} experts in {self.layers} layers"]
        if self.scaled:
            parts.append(f"{self.scaled} scaled exactly on the up output")
        if self.folded:
            parts.append(f"{self.folded} folded into block scales (global chosen: "
                         f"{chosen or 'none'})")
        return (f"{'; '.join(parts)} (largest gate/up ratio {self.largest_ratio:.4g}; "
                f"layers per route: {routes or 'none'})")


MODEL_REPORT = FoldReport()  # the running total of this process's model


def block_energy(packed: torch.Tensor, blocks: int) -> torch.Tensor:
    """Sum of squared E2M1 values per block of a packed fp4 tensor (..., cols / 2) -> (..., blocks)."""
    grid = torch.tensor(E2M1_VALUES, dtype=torch.float32, device=packed.device) ** 2
    low, high = (packed & 0x7).long(), ((packed >> 4) & 0x7).long()
    squares = grid[low] + grid[high]
    return squares.reshape(*packed.shape[:-1], blocks, -1).sum(-1)


def _candidate_name(half: int, shift: int) -> str:
    name = ("gate", "up")[half]
    return name if shift == 0 else f"{name}*2^{shift}"


def choose_globals(block_scales: torch.Tensor, globals_: torch.Tensor,
                   energy: torch.Tensor | None = None) -> tuple[torch.Tensor, list[str]]:
    """Per expert, the global G that errs least once each half is folded, and its name.

    block_scales (n, 2, rows, blocks) float32 (E4M3 values), globals_ (n, 2) float32
    (gate, up), energy like block_scales or None (every block weighs the same).
    """
    weights = torch.ones_like(block_scales) if energy is None else energy
    intended = block_scales * globals_[:, :, None, None]
    best_error = torch.full((globals_.shape[0],), float("inf"), device=globals_.device)
    best = torch.zeros(globals_.shape[0], device=globals_.device)
    names: list[str] = [""] * globals_.shape[0]
    for half in (0, 1):
        for shift in CANDIDATE_SHIFTS:
            candidate = globals_[:, half] * 2.0 ** shift
            rescaled = block_scales * (globals_ / candidate[:, None])[:, :, None, None]
            feasible = rescaled.flatten(1).amax(1) <= E4M3_MAX
            folded = rescaled.to(torch.float8_e4m3fn).float() * candidate[:, None, None, None]
            error = ((folded - intended) ** 2 * weights).flatten(1).sum(1)
            error = torch.where(feasible, error, torch.full_like(error, float("inf")))
            better = error < best_error
            best_error = torch.where(better, error, best_error)
            best = torch.where(better, candidate, best)
            for index in better.nonzero().flatten().tolist():
                names[index] = _candidate_name(half, shift)
    if not torch.isfinite(best_error).all():
        raise ValueError("no global scale keeps every folded block scale within E4M3's range")
    return best, names


def fold(block_scales: torch.Tensor, globals_: torch.Tensor,
         packed: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, FoldReport]:
    """One layer's (block scales, globals) with each expert's halves on one global.

    block_scales (E, 2 * rows, blocks) float8_e4m3fn, gate rows first; globals_ (E, 2)
    float32 (gate, up); packed (E, 2 * rows, cols / 2) uint8, the fp4 payload that weighs
    each block's error (None: every block weighs the same). Returns new tensors (the inputs
    are not changed); experts with equal globals keep theirs bit for bit.
    """
    experts, rows2, blocks = block_scales.shape
    report = FoldReport(layers=1, experts=experts)
    new_scales, new_globals = block_scales.clone(), globals_.clone()
    unequal = (globals_[:, 0] != globals_[:, 1]).nonzero().flatten()
    for start in range(0, len(unequal), EXPERTS_AT_ONCE):
        index = unequal[start:start + EXPERTS_AT_ONCE]
        scales = block_scales[index].float().reshape(len(index), 2, rows2 // 2, blocks)
        energy = None
        if packed is not None:
            energy = block_energy(packed[index], blocks).reshape(scales.shape)
        own = globals_[index].float()
        chosen, names = choose_globals(scales, own, energy)
        rescaled = scales * (own / chosen[:, None])[:, :, None, None]
        new_scales[index] = rescaled.to(torch.float8_e4m3fn).reshape(len(index), rows2, blocks)
        new_globals[index] = chosen[:, None].expand(-1, 2).to(globals_.dtype)
        ratio = (own.amax(1) / own.amin(1)).amax().item()
        report.largest_ratio = max(report.largest_ratio, ratio)
        for name in names:
            report.chosen[name] = report.chosen.get(name, 0) + 1
    report.folded = len(unequal)
    if report.folded:
        report.routes = {"fold": 1}
    return new_scales, new_globals, report


def fold_layer_(layer: torch.nn.Module) -> FoldReport:
    """Fold a loaded ModelOpt NVFP4 MoE layer's w13 scales in place."""
    new_scales, new_globals, report = fold(
        layer.w13_weight_scale.data, layer.w13_weight_scale_2.data, layer.w13_weight.data)
    if report.folded:
        layer.w13_weight_scale.data.copy_(new_scales)
        layer.w13_weight_scale_2.data.copy_(new_globals)
    return report


def up_over_gate(globals_: torch.Tensor) -> torch.Tensor:
    """Per expert, the up half's global over the gate's (float32): what the exact route
    multiplies each up output row by, the kernel having decoded that half with the gate's."""
    return globals_[:, 1].float() / globals_[:, 0].float()


class UpHalfRatio:
    """An experts object's activation callback, wrapped: before it runs, the up half of each
    row of the first GEMM's output (gate columns first, one row per token and top-k slot) is
    multiplied by its expert's ``up / gate`` ratio. The multiply reads bfloat16 and float32
    and rounds once; it gathers on the device and never syncs the host, so a CUDA graph
    captures it."""

    def __init__(self, activation, ratios: torch.Tensor):
        self.activation = activation
        self.ratios = ratios

    def __call__(self, activation, output, input, *, topk_ids=None, expert_map=None, **kwargs):
        if topk_ids is None:  # no row-to-expert map: refuse rather than scale the wrong rows
            raise RuntimeError("glm53_moe_scales: the experts' activation was called without "
                               "topk_ids; the exact route cannot tell each row's expert")
        experts = topk_ids.reshape(-1).long()
        if expert_map is not None:  # global expert ids to this rank's; -1 rows are not computed
            experts = expert_map[experts].long().clamp_min(0)
        half = input.shape[-1] // 2
        input[..., half:].mul_(self.ratios[experts].unsqueeze(-1))
        return self.activation(activation, output, input, topk_ids=topk_ids,
                               expert_map=expert_map, **kwargs)


def requested_route() -> str:
    route = os.environ.get(ROUTE_ENV, "auto") or "auto"
    if route not in ROUTES:
        raise ValueError(f"{ROUTE_ENV}={route!r}: use one of {', '.join(ROUTES)}")
    return route


def exact_experts_class():
    import importlib  # here: the helper unit-tests without vLLM

    module, name = EXACT_EXPERTS
    return getattr(importlib.import_module(module), name)


def exact_route_problem(method) -> str | None:
    """Why the exact route cannot apply to this method's experts, or None when it can."""
    experts_cls = getattr(method, "experts_cls", None)
    exact_cls = exact_experts_class()
    if isinstance(experts_cls, type) and issubclass(experts_cls, exact_cls):
        return None
    name = getattr(experts_cls, "__name__", repr(experts_cls))
    return (f"experts {name} run the activation inside the kernel (no 16-bit intermediate "
            f"reachable): only {exact_cls.__name__} (Marlin W4A16) takes the exact route")


def choose_route(method) -> str:
    """``exact`` or ``fold`` for this method, from GLM53_MOE_SCALE_ROUTE and its backend."""
    route = requested_route()
    if route == "fold":
        return "fold"
    problem = exact_route_problem(method)
    if problem is None:
        return "exact"
    if route == "exact":
        raise RuntimeError(f"{ROUTE_ENV}=exact: {problem}; unset it (auto) to fold instead")
    return "fold"


def install_exact_route(method, ratios: torch.Tensor) -> None:
    """Wraps the built experts' activation with UpHalfRatio; refuses an experts object that is
    not the class the route was chosen for (a kernel built otherwise than planned)."""
    experts = method.moe_kernel.fused_experts
    exact_cls = exact_experts_class()
    if not isinstance(experts, exact_cls):
        raise RuntimeError(f"glm53_moe_scales: the exact route was chosen for "
                           f"{exact_cls.__name__} but vLLM built {type(experts).__name__}; "
                           f"set {ROUTE_ENV}=fold")
    experts.activation = UpHalfRatio(experts.activation, ratios)


def _log(report: FoldReport, layer_name: str | None) -> None:
    from vllm.logger import init_logger  # here, not at the top: the helper unit-tests without vLLM

    MODEL_REPORT.add(report)
    if report.folded or report.scaled:
        route = "exact (up output x up/gate)" if report.scaled else "fold (block scales)"
        init_logger(__name__).info(
            "ModelOpt NVFP4 MoE %s: unequal gate/up global scales, route %s; this layer: %s; "
            "the model so far: %s", layer_name or "layer", route, report.line(),
            MODEL_REPORT.line())


def honour_w13_global_scales(process_weights_after_loading):
    """Decorates ModelOptNvFp4FusedMoE.process_weights_after_loading: the fold before it, or
    the exact route's activation wrapper after it (the module's docstring says which)."""

    @functools.wraps(process_weights_after_loading)
    def wrapper(self, layer):
        # a base with pre-processed (kernel-format) checkpoints names the test in the module
        pre_processed = process_weights_after_loading.__globals__.get("is_weights_pre_processed")
        gated = getattr(self.moe, "is_act_and_mul", False)
        scales_2 = getattr(layer, "w13_weight_scale_2", None)
        if not gated or (pre_processed and pre_processed()) or scales_2 is None \
                or scales_2.dim() != 2 or scales_2.shape[1] != 2:
            return process_weights_after_loading(self, layer)
        unequal = (scales_2[:, 0] != scales_2[:, 1])
        if not bool(unequal.any()):
            return process_weights_after_loading(self, layer)
        layer_name = getattr(layer, "layer_name", None)
        if choose_route(self) == "fold":
            _log(fold_layer_(layer), layer_name)
            return process_weights_after_loading(self, layer)
        ratios = up_over_gate(scales_2.data)
        own = scales_2.data.float()
        result = process_weights_after_loading(self, layer)
        install_exact_route(self, ratios)
        _log(FoldReport(layers=1, experts=own.shape[0], scaled=int(unequal.sum()),
                        largest_ratio=float((own.amax(1) / own.amin(1)).amax()),
                        routes={"exact": 1}), layer_name)
        return result

    return wrapper
