"""On PYTHONPATH of the GPU tier's `gate-int8` server only. Layer v13's target weight groups
name Glm5Next's classes, which the tiny Qwen3 target does not have (Glm5Next cannot be
served on the H200: docs/tests.md says which kernel stops it). This points the groups at the
Qwen3 classes that hold the same kinds of linears, once the helper module is imported, so the
swap itself (quantize, pack, vLLM's scheme, the Marlin repack, the engine's forward and CUDA
graphs) runs unchanged in a real CUDA engine."""

import importlib.abc
import importlib.util
import sys

HELPER = "vllm.model_executor.model_loader.glm53_weight_groups"
GROUPS = {
    "attn": ("Qwen3Attention", ("qkv_proj", "o_proj")),
    "mlp": ("Qwen2MLP", ("gate_up_proj", "down_proj")),  # qwen3.py imports it as Qwen3MLP
    "lm_head": ("Qwen3ForCausalLM", ("lm_head",)),
}
ROOTS = ("Qwen3ForCausalLM",)


class _PointGroupsAtQwen3(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != HELPER:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        run_module = spec.loader.exec_module

        def exec_module(module):
            run_module(module)
            module.GROUPS = GROUPS
            module.TARGET_ROOTS = ROOTS
            print(f"gpu tier: {HELPER} groups pointed at {sorted(GROUPS)} of {ROOTS}",
                  file=sys.stderr, flush=True)

        spec.loader.exec_module = exec_module
        return spec


sys.meta_path.insert(0, _PointGroupsAtQwen3())
