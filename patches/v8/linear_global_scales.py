"""Each shard's global scale honoured in a merged ModelOpt NVFP4 linear (installed by the chain's
v8 image as ``vllm/model_executor/layers/quantization/glm53_linear_scales.py``).

vLLM fuses the shards of a merged linear (q/k/v into qkv; gate/up into gate_up; Glm5Next's
fused_qkv_a, KDA's in_proj) into one GEMM, and its ModelOpt NVFP4 linear keeps one global for
them all, ``weight_scale_2.max()``, leaving each shard's block scales as they are: a shard
exported with a smaller global decodes inflated by ``kept / own`` (vLLM logs once that "the
global weight scale differs across parallel layers" and goes on). The output of a linear is
linear in each shard's rows, so the exact repair is on the output: each shard's columns times
``own / kept``, in float32, rounded once to the output's dtype, before the bias. The bias is
added from a copy taken before the kernel's own preparation (Marlin permutes the layer's bias
into its tile order and adds it inside the GEMM), so the kernel runs without it. A layer whose
shards share one global is not touched (bit-identical to stock vLLM); the decorators are no-ops
on every layer without a global per shard.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

SCALE_ATTR = "glm53_shard_output_scale"  # per output column, float32: own / kept
BIAS_ATTR = "glm53_shard_output_bias"  # the layer's bias as loaded, before a kernel reorders it


@dataclass
class ShardReport:
    """What the fix found across a model's merged NVFP4 linears."""

    layers: int = 0
    unequal: int = 0
    largest_ratio: float = 1.0

    def line(self) -> str:
        return (f"{self.unequal} of {self.layers} merged NVFP4 linears with unequal shard "
                f"globals scaled exactly on their output (largest kept/own ratio "
                f"{self.largest_ratio:.4g})")


MODEL_REPORT = ShardReport()


def shard_output_scale(globals_: torch.Tensor, sizes: list[int]) -> torch.Tensor | None:
    """Per output column, each shard's own global over the kept one (vLLM's max), float32;
    None where every shard shares one global."""
    own = globals_.detach().float().reshape(-1)
    if bool((own == own[0]).all()):
        return None
    if len(sizes) != own.numel():
        raise RuntimeError(f"glm53_linear_scales: {own.numel()} shard globals for "
                           f"{len(sizes)} output partitions; the fix cannot map them")
    factors = own / own.max()
    return factors.repeat_interleave(torch.tensor(sizes, device=own.device))


def _log(layer, report_line: str) -> None:
    from vllm.logger import init_logger  # here, not at the top: the helper unit-tests without vLLM

    init_logger(__name__).info(
        "ModelOpt NVFP4 merged linear %s: unequal shard global scales, each shard's output "
        "scaled by own/kept; the model so far: %s",
        getattr(layer, "prefix", None) or type(layer).__name__, report_line)


def honour_shard_global_scales(process_weights_after_loading):
    """Decorates a ModelOpt linear method's process_weights_after_loading: reads each shard's
    global before vLLM keeps their max, and leaves the per-column ratio on the layer."""

    @functools.wraps(process_weights_after_loading)
    def wrapper(self, layer, *args, **kwargs):
        # a base with pre-processed (kernel-format) checkpoints names the test in the module
        pre_processed = process_weights_after_loading.__globals__.get("is_weights_pre_processed")
        if pre_processed and pre_processed():
            return process_weights_after_loading(self, layer, *args, **kwargs)
        globals_ = getattr(layer, "weight_scale_2", None)
        sizes = getattr(layer, "output_partition_sizes", None)
        scale = None
        if globals_ is not None and sizes is not None and globals_.numel() > 1 \
                and globals_.dtype.is_floating_point:
            scale = shard_output_scale(globals_.data, list(sizes))
        bias = getattr(layer, "bias", None)
        loaded_bias = bias.detach().clone() if scale is not None and bias is not None else None
        result = process_weights_after_loading(self, layer, *args, **kwargs)
        if globals_ is not None and sizes is not None and globals_.numel() > 1:
            MODEL_REPORT.layers += 1
        if scale is not None:
            if getattr(layer, "_retain_weight_for_gather", False):
                raise RuntimeError("glm53_linear_scales: a gathered NVFP4 projection with unequal "
                                   "shard globals: its gather path would bypass the fix")
            layer.register_buffer(SCALE_ATTR, scale, persistent=False)
            if loaded_bias is not None:
                layer.register_buffer(BIAS_ATTR, loaded_bias, persistent=False)
            MODEL_REPORT.unequal += 1
            MODEL_REPORT.largest_ratio = max(MODEL_REPORT.largest_ratio,
                                             float(1 / scale.min()))
            _log(layer, MODEL_REPORT.line())
        return result

    return wrapper


def scale_shard_outputs(apply):
    """Decorates a ModelOpt linear method's apply: the GEMM without its bias, each shard's
    columns times own/kept (float32 math, one rounding), then the bias."""

    @functools.wraps(apply)
    def wrapper(self, layer, x, bias=None, *args, **kwargs):
        scale = getattr(layer, SCALE_ATTR, None)
        if scale is None:
            return apply(self, layer, x, bias, *args, **kwargs)
        if bias is not None and bias is not getattr(layer, "bias", None):
            raise RuntimeError("glm53_linear_scales: a bias other than the layer's own reached a "
                               "merged linear with unequal shard globals; its layout is unknown")
        out = apply(self, layer, x, None, *args, **kwargs)
        out.mul_(scale)
        return out if bias is None else out.add_(getattr(layer, BIAS_ATTR))

    return wrapper
