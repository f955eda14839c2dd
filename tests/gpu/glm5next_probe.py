"""Can Glm5Next be served on this GPU with vLLM 0.30.0's wheel? (run on the GPU machine
after part a is installed, before the CUDA library `_C` arrives)

Glm5Next's forward needs, beyond vLLM's `_C`: its sparse indexer's top-k logits from DeepGEMM's
FP8 MQA kernels (`fp8_fp4_mqa_logits`, `fp8_fp4_paged_mqa_logits` in
model_executor/layers/sparse_attn_indexer_kpool.py), sparse MLA attention (FlashMLA), the
selection kernel library DeepSelect, FlashKDA for KDA prefill (or Triton), and TileLang for the
mHC kernels (or vLLM's native torch path). This imports each of the wheel's libraries under
this machine's torch and records what loads and what fails, with the error; vLLM's own import
and platform come first. Prints one JSON document.

    python3 tests/gpu/glm5next_probe.py OUT.json
"""

from __future__ import annotations

import importlib
import json
import sys
import traceback
from pathlib import Path

LIBRARIES = {
    "DeepGEMM (the indexer's FP8 MQA logits)": "vllm.third_party.deep_gemm",
    "FlashMLA (sparse MLA attention)": "vllm._flashmla_C",
    "FlashMLA extension": "vllm._flashmla_extension_C",
    "DeepSelect": "vllm._deepselect_C",
    "FlashKDA (KDA prefill)": "vllm._flashkda_C",
    "fused MoE ops (Marlin MoE's alignment, top-k; part moe)": "vllm._moe_C_stable_libtorch",
}


def attempt(module: str) -> dict:
    try:
        importlib.import_module(module)
    except Exception as error:  # the error itself is the finding
        lines = traceback.format_exception_only(type(error), error)
        return {"loads": False, "error": "".join(lines).strip()[-600:]}
    return {"loads": True}


def main(out_path: str) -> int:
    import torch

    doc = {"torch": torch.__version__, "device": torch.cuda.get_device_name(0),
           "capability": list(torch.cuda.get_device_capability(0))}
    import vllm
    from vllm.platforms import current_platform
    from vllm.utils.import_utils import has_deep_gemm, has_tilelang

    doc.update({"vllm": vllm.__version__, "vllm_file": vllm.__file__,
                "platform": type(current_platform).__name__,
                "has_deep_gemm (find_spec only)": has_deep_gemm(),
                "has_tilelang": has_tilelang()})
    doc["libraries"] = {name: attempt(module) for name, module in LIBRARIES.items()}
    # the MoE layer package first, as the model registry imports them (the model module
    # imported alone meets a circular import)
    fused_moe = attempt("vllm.model_executor.layers.fused_moe")
    doc["glm5next_model_imports"] = attempt("vllm.models.glm5next.nvidia.model") \
        if fused_moe["loads"] else fused_moe
    Path(out_path).write_text(json.dumps(doc, indent=1))
    print(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
