"""Build vLLM's own Glm5NextForCausalLM on CPU from the GPU tier's tiny checkpoint and load
it with the model's own load_weights; print one JSON object per model directory given.

Run with PYTHONPATH set to a vLLM 0.30.0 tree. What the CPU cannot do is replaced for the
construction alone, each named here: vLLM's compiled ops are looked up, never run (`_AnyOp`);
the CPU platform refuses sparse MLA, so the backend asked for is FlashMLA's sparse one (the
class is built, its kernels never run); the NVFP4 MoE backend choice (CUDA-only) is Marlin's;
the workspace manager lives on the CPU.

With tests/gpu/standin first on PYTHONPATH (as part d's servers have it), each JSON object
also says which module the indexer's DeepGEMM names are bound to once the model is built.

    python glm5next_tiny_build.py MODEL_DIR...
"""

import json
import sys
import tempfile

import torch
import vllm.platforms
from vllm.platforms.cpu import CpuPlatform

vllm.platforms._current_platform = CpuPlatform()

from vllm.config import CacheConfig, ModelConfig, VllmConfig, set_current_vllm_config  # noqa: E402
from vllm.distributed import init_distributed_environment, initialize_model_parallel  # noqa: E402
from vllm.model_executor.layers.fused_moe.oracle.nvfp4 import NvFp4MoeBackend  # noqa: E402
from vllm.model_executor.layers.quantization import modelopt  # noqa: E402
from vllm.models.glm5next.nvidia import model as glm  # noqa: E402
from vllm.transformers_utils.configs.glm5_next import Glm5NextTextConfig  # noqa: E402
from vllm.v1.worker.workspace import init_workspace_manager  # noqa: E402

SPARSE_BACKEND = "vllm.v1.attention.backends.mla.flashmla_sparse.FlashMLASparseBackend"


class _AnyOp:
    """vLLM's _C ops on a CPU build: looked up at construction, never called here."""

    def __getattr__(self, name):
        return lambda *args, **kwargs: None


def build(model_dir: str, first: bool) -> dict:
    from safetensors.torch import load_file

    config = json.loads(open(f"{model_dir}/config.json").read())
    text = Glm5NextTextConfig(**config)
    vllm_config = VllmConfig(
        model_config=ModelConfig(model=model_dir, skip_tokenizer_init=True, dtype="bfloat16",
                                 max_model_len=4096),
        # prefix caching off from the start: vLLM's CPU platform turns it off later for MLA
        # on a CPU without AMX, after the hybrid config set a mamba block size for it, and
        # the config then refuses itself (an AMD CPU, 2026-12-06); construction needs neither
        cache_config=CacheConfig(block_size=64, enable_prefix_caching=False))
    with set_current_vllm_config(vllm_config):
        if first:
            initialize_model_parallel(1, 1)
        model = glm.Glm5NextForCausalLM(vllm_config=vllm_config, prefix="")
        tensors = load_file(f"{model_dir}/model.safetensors")
        loaded = model.load_weights(iter(tensors.items()))
    params = dict(model.named_parameters())
    layers = []
    for index, layer in enumerate(model.model.layers):
        attention = layer.self_attn
        layers.append({
            "kda": text.is_kda_layer(index), "attention": type(attention).__name__,
            "indexer": type(getattr(attention, "indexer", None)).__name__,
            "mlp": type(layer.mlp).__name__, "mhc": bool(getattr(layer, "mhc", False)),
            "experts_method": type(getattr(getattr(getattr(layer.mlp, "experts", None),
                                                   "routed_experts", None),
                                           "quant_method", None)).__name__})
    globals_ = {name: params[name].detach().float().tolist() for name in params
                if name.endswith("w13_weight_scale_2")}
    return {"model": model_dir, "variant": config.get("variant"),
            "layer_types": text.layers_block_type, "layers": layers,
            "parameters": len(params), "not_loaded": sorted(set(params) - set(loaded)),
            "unknown": sorted(set(loaded) - set(params)), "w13_weight_scale_2": globals_,
            "checkpoint_tensors": len(tensors), "deep_gemm_names": deep_gemm_names()}


def deep_gemm_names() -> dict:
    """Where the indexer's kernels resolve: vLLM's own deep_gemm module, or a stand-in."""
    import vllm.utils.deep_gemm as deep_gemm
    from vllm.v1.attention.backends.mla import indexer

    names = {f"deep_gemm.{name}": getattr(deep_gemm, name).__module__
             for name in ("fp8_fp4_mqa_logits", "fp8_fp4_paged_mqa_logits",
                          "get_paged_mqa_logits_metadata", "fp8_gemm_nt")}
    names["indexer.get_paged_mqa_logits_metadata"] = \
        indexer.get_paged_mqa_logits_metadata.__module__
    from vllm.model_executor.layers import sparse_attn_indexer, sparse_attn_indexer_kpool

    for module in (deep_gemm, indexer, sparse_attn_indexer, sparse_attn_indexer_kpool):
        names[f"{module.__name__}.has_deep_gemm"] = module.has_deep_gemm.__module__
    return names


def main(model_dirs: list[str]) -> None:
    init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo",
                                 distributed_init_method=f"file://{tempfile.mktemp()}")
    torch.ops._C = _AnyOp()
    CpuPlatform.get_attn_backend_cls = classmethod(lambda cls, *a, **k: SPARSE_BACKEND)
    modelopt.select_nvfp4_moe_backend = lambda *a, **k: (NvFp4MoeBackend.MARLIN, object)
    init_workspace_manager(torch.device("cpu"))
    for number, model_dir in enumerate(model_dirs):
        print(json.dumps(build(model_dir, first=number == 0)), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
