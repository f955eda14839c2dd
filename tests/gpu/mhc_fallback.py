"""Glm5Next's MHC ops without TileLang, for the GPU tier's servers only (tests/gpu/standin).

In vLLM 0.30.0 every MHC op's `forward_cuda` calls a TileLang kernel and nothing else, while
its `forward_hip` takes, where TileLang and AITER are both absent, vLLM's own torch reference
(`forward_native`) or its Triton kernel (`hc_head_triton`). On a CUDA machine without
TileLang, AITER is absent too, so pointing `forward_cuda` at `forward_hip` runs exactly that
fallback. This replaces no arithmetic of ours: it picks which of vLLM's paths runs."""

from __future__ import annotations

import sys

FALLBACK = ("tests/gpu/mhc_fallback.py: vLLM's own MHC path without TileLang (forward_hip: "
            "its torch reference and Triton hc_head) in place of the TileLang kernels")


def install(mhc) -> None:
    """Point every MHC op of `mhc` (vllm.model_executor.layers.mhc) that has a TileLang-free
    path at it, refuse if TileLang or AITER would be taken after all, and say so on stderr."""
    if mhc.HAS_TILELANG_MHC or mhc.HAS_AITER_MHC:
        raise RuntimeError("tests/gpu/mhc_fallback.py: TileLang or AITER is present here, so "
                           "forward_hip would not take vLLM's torch/Triton path; drop the "
                           "fallback from tests/gpu/standin")
    ops = sorted(name for name, value in vars(mhc).items()
                 if isinstance(value, type) and issubclass(value, mhc.CustomOp)
                 and value is not mhc.CustomOp and "forward_hip" in vars(value))
    for name in ops:
        op = getattr(mhc, name)
        op.forward_cuda = op.forward_hip
    print(f"gpu tier: MHC fallback installed for {', '.join(ops)}: {FALLBACK}",
          file=sys.stderr, flush=True)
