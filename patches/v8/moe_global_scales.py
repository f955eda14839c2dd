"""Each half's global scale honoured in a ModelOpt NVFP4 fused MoE (installed by the chain's
v8 image as ``vllm/model_executor/layers/quantization/glm53_moe_scales.py``).

vLLM's ``ModelOptNvFp4FusedMoE.process_weights_after_loading`` hands the fused gate+up GEMM one
global scale per expert, the gate's (``w13_weight_scale_2[:, 0]``): an expert whose up
projection was exported with another global decodes its up half off by ``up / gate``
(vLLM #54974, #54150). The kernels take one global per expert, so before vLLM reads it this
module picks one global G per expert and folds each half's ratio ``own / G`` into that half's
E4M3 block scales: the fp4 payload is untouched, and a half whose ratio is a power of two keeps
its block scales exactly. G is searched per expert among each half's global times 2^-1, 2^0,
2^1 (no block scale may pass E4M3's 448): the one whose folded weights err least against the
checkpoint's, in each block ``sum(fp4^2) * (s' * G - s * own)^2``. An expert whose two globals
are equal is not touched, so a checkpoint with equal scales loads bit-identical to stock vLLM.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import torch

E4M3_MAX = 448.0
# an E2M1 nibble's value: bit 3 is the sign, bits 0-2 index this grid
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
# the global candidates: each half's own times these (a power of two keeps that half exact)
CANDIDATE_SHIFTS = (0, -1, 1)
EXPERTS_AT_ONCE = 16  # bounds the working memory of the search to a few experts' scales


@dataclass
class FoldReport:
    """What one layer's fold did (or, summed, a model's)."""

    layers: int = 0
    experts: int = 0
    folded: int = 0
    largest_ratio: float = 1.0
    chosen: dict[str, int] = field(default_factory=dict)  # "gate", "up", "gate*2^-1", ...

    def add(self, other: FoldReport) -> None:
        self.layers += other.layers
        self.experts += other.experts
        self.folded += other.folded
        self.largest_ratio = max(self.largest_ratio, other.largest_ratio)
        for name, count in other.chosen.items():
            self.chosen[name] = self.chosen.get(name, 0) + count

    def line(self) -> str:
        chosen = ", ".join(f"{name} {count}" for name, count in sorted(self.chosen.items()))
        return (f"{self.folded} of {self.experts} experts in {self.layers} layers folded "
                f"(largest gate/up ratio {self.largest_ratio:.4g}; global chosen: "
                f"{chosen or 'none'})")


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
    return new_scales, new_globals, report


def fold_layer_(layer: torch.nn.Module) -> FoldReport:
    """Fold a loaded ModelOpt NVFP4 MoE layer's w13 scales in place."""
    new_scales, new_globals, report = fold(
        layer.w13_weight_scale.data, layer.w13_weight_scale_2.data, layer.w13_weight.data)
    if report.folded:
        layer.w13_weight_scale.data.copy_(new_scales)
        layer.w13_weight_scale_2.data.copy_(new_globals)
    return report


def _log(report: FoldReport) -> None:
    from vllm.logger import init_logger  # here, not at the top: the helper unit-tests without vLLM

    MODEL_REPORT.add(report)
    if report.folded:
        init_logger(__name__).info(
            "ModelOpt NVFP4 MoE: unequal gate/up global scales folded into block scales; "
            "this layer: %s; the model so far: %s", report.line(), MODEL_REPORT.line())


def fold_w13_global_scales(process_weights_after_loading):
    """Decorates ModelOptNvFp4FusedMoE.process_weights_after_loading: folds first."""

    @functools.wraps(process_weights_after_loading)
    def wrapper(self, layer):
        # a base with pre-processed (kernel-format) checkpoints names the test in the module
        pre_processed = process_weights_after_loading.__globals__.get("is_weights_pre_processed")
        gated = getattr(self.moe, "is_act_and_mul", False)
        scales_2 = getattr(layer, "w13_weight_scale_2", None)
        if gated and not (pre_processed and pre_processed()) and scales_2 is not None \
                and scales_2.dim() == 2 and scales_2.shape[1] == 2:
            _log(fold_layer_(layer))
        return process_weights_after_loading(self, layer)

    return wrapper
