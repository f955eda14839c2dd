"""On PYTHONPATH of the GPU tier's `gate-int8` server only. Layer v13's target weight groups
name Glm5Next's classes, which the tiny Qwen3 target does not have (Glm5Next cannot be
served on the H200: docs/tests.md says which kernel stops it). This points the groups at the
Qwen3 classes that hold the same kinds of linears, once the helper module is imported, so the
swap itself (quantize, pack, vLLM's scheme, the Marlin repack, the engine's forward and CUDA
graphs) runs unchanged in a real CUDA engine."""

import importlib.util
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
HELPER = "vllm.model_executor.model_loader.glm53_weight_groups"
GROUPS = {
    "attn": ("Qwen3Attention", ("qkv_proj", "o_proj")),
    "mlp": ("Qwen2MLP", ("gate_up_proj", "down_proj")),  # qwen3.py imports it as Qwen3MLP
    "lm_head": ("Qwen3ForCausalLM", ("lm_head",)),
}
ROOTS = ("Qwen3ForCausalLM",)


def _edit_on_import():
    """tests/gpu/edit_on_import.py (the GPU tier's one import hook), from its file."""
    spec = importlib.util.spec_from_file_location(
        "gpu_edit_on_import", os.path.join(HERE, os.pardir, "edit_on_import.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def point_groups_at_qwen3(module) -> None:
    module.GROUPS = GROUPS
    module.TARGET_ROOTS = ROOTS
    print(f"gpu tier: {HELPER} groups pointed at {sorted(GROUPS)} of {ROOTS}", file=sys.stderr,
          flush=True)


_edit_on_import().install({HELPER: point_groups_at_qwen3})
