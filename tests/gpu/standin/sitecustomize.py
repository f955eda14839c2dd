"""On PYTHONPATH of the GPU tier's Glm5Next servers only (tests/gpu/run d). Two kernel
families of Glm5Next's forward cannot run on the GPU machine, and each is replaced as soon as
its vLLM module is imported, before any other module binds its names:
- DeepGEMM's compiled module does not load under the machine's torch 2.11 (docs/gpu-tier.md),
  and the sparse indexer has no other path to its MQA logits in vLLM 0.30.0: the float32
  stand-in of tests/gpu/mqa_logits_reference.py takes those two functions, and the indexer's
  own modules (alone) are told DeepGEMM is present, which they check before building.
- TileLang is not installed there (0.30.0 wants tilelang 0.1.12, over 64 MiB with its solver),
  and on CUDA the MHC ops call TileLang alone: tests/gpu/mhc_fallback.py points them at the
  path vLLM itself takes where TileLang is absent (its torch and Triton MHC kernels).
Every other kernel of the forward is vLLM's own CUDA path.

Two hooks of tests/gpu/engine_hooks.py are installed only where a server's environment asks:
GPU_TIER_STOCK_MOE=1 (stock vLLM's MoE scale reading) and GPU_TIER_AUX_DUMP=FILE (the drafter's
auxiliary hidden states saved once).

Every process of a server dumps its threads' stacks to its log on SIGUSR1
(tests/gpu/glm5next_engine.py sends it to a server still not ready just before its deadline)."""

import faulthandler
import importlib.util
import os
import signal

HERE = os.path.dirname(os.path.abspath(__file__))
faulthandler.register(signal.SIGUSR1, all_threads=True)


def _edit_on_import():
    """tests/gpu/edit_on_import.py (the GPU tier's one import hook), from its file."""
    spec = importlib.util.spec_from_file_location(
        "gpu_edit_on_import", os.path.join(HERE, os.pardir, "edit_on_import.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


hooks = _edit_on_import()
# vLLM module -> (file beside this package, its function that takes the loaded module)
REPLACEMENTS = {
    "vllm.utils.deep_gemm": ("mqa_logits_reference.py", "install"),
    "vllm.model_executor.layers.mhc": ("mhc_fallback.py", "install"),
    # mqa_logits_reference.INDEXER_MODULES (tests/vllm/test_glm5next_tiny.py holds them equal)
    "vllm.model_executor.layers.sparse_attn_indexer": ("mqa_logits_reference.py",
                                                       "install_presence"),
    "vllm.model_executor.layers.sparse_attn_indexer_kpool": ("mqa_logits_reference.py",
                                                             "install_presence"),
    "vllm.v1.attention.backends.mla.indexer": ("mqa_logits_reference.py", "install_presence"),
}
if os.environ.get("GPU_TIER_STOCK_MOE") == "1":
    REPLACEMENTS["vllm.model_executor.layers.quantization.modelopt"] = ("engine_hooks.py",
                                                                        "bypass_moe_fix")
if os.environ.get("GPU_TIER_AUX_DUMP"):
    REPLACEMENTS["vllm.v1.worker.gpu.spec_decode.dflash.speculator"] = (
        "engine_hooks.py", "dump_aux_hidden_states")


def _replacement(file_name: str, function: str):
    """The edit that hands the module to FUNCTION of FILE_NAME, loaded when it is needed."""
    return lambda module: getattr(hooks.beside(file_name), function)(module)


hooks.install({name: _replacement(*replacement) for name, replacement in REPLACEMENTS.items()})
