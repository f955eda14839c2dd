"""Plan Glm5Next's KV cache with vLLM's own planning code, with and without drafter layers.

Run with PYTHONPATH set to a vLLM 0.30.0 or fork-shaped tree (patched by v11 or not). The specs are
shaped like GLM-5.3-Flash at tensor parallel 2: 11 MLA layers with a DSA indexer and
its kpool tail each, 34 KDA (Mamba-type) states, and optionally 5 drafter sliding
layers of window 2048. Prints one JSON object describing groups, tensor layout, bytes
per block and the maximum-memory estimate, or the error raised, for each case named
on the command line (target, drafter, two-page-sizes; real-pages and real-pages-drafter:
the published TP=2 page sizes at block 2304, five MLA layers).
"""

import dataclasses
import json
import sys
from types import SimpleNamespace

import torch
import vllm.platforms
from vllm.platforms.cpu import CpuPlatform

vllm.platforms._current_platform = CpuPlatform()

from vllm.v1.core import kv_cache_utils as utils
from vllm.v1 import kv_cache_interface
from vllm.v1.kv_cache_interface import (
    MambaSpec,
    MLAAttentionSpec,
    SlidingWindowSpec,
)
from vllm.v1.kv_cache_layout import KVCacheLayout

BLOCK = 1024  # the hybrid attention block, large enough that a KDA state fits an MLA page
KV_PIN = 4_445_787_956  # the recipe's --kv-cache-memory-bytes
MLA_LAYERS = [2, 6, 10, 14, 18, 22, 26, 30, 34, 38, 42]


# The published TP=2 pages (the seed's PR #1): an MLA page of 1,198,080 bytes is 520 bytes a
# token at the seed's --block-size 2304; 6,370,560 bytes per block is 5 x (1,198,080 + 76,032),
# five MLA layers with their indexers (76,032 = 576 states of 132 bytes).
REAL_BLOCK = 2304
# 0.33.0 replaced it (CircularBufferSpec); tests/vllm/probes/glm5next_prefix_reuse.py imports this module there.
KpoolTailSpec = getattr(kv_cache_interface, "KpoolTailSpec", None)
REAL_MLA_LAYERS = [2, 6, 10, 14, 18]


def target_specs(block=BLOCK, mla_layers=MLA_LAYERS, real_pages=False, with_tail=True) -> dict:
    specs = {}
    for i in mla_layers:
        if real_pages:
            specs[f"model.layers.{i}.self_attn.attn"] = MLAAttentionSpec(
                block_size=block, num_kv_heads=1, head_size=520, dtype=torch.uint8,
            )
        else:
            specs[f"model.layers.{i}.self_attn.attn"] = MLAAttentionSpec(
                block_size=block, num_kv_heads=1, head_size=656, dtype=torch.uint8,
                cache_dtype_str="fp8_ds_mla",
            )
        # DSA indexer: one 132-byte state per 4 tokens (33 B a token).
        specs[f"model.layers.{i}.self_attn.indexer.k_cache"] = MLAAttentionSpec(
            block_size=block, num_kv_heads=1, head_size=132, dtype=torch.uint8,
            tokens_per_state=4,
        )
        if with_tail:
            specs[f"model.layers.{i}.self_attn.indexer.tail"] = KpoolTailSpec(
                block_size=block, num_kv_heads=1, head_size=16, dtype=torch.uint8,
                sliding_window=4,
            )
    last = max(mla_layers) + 1
    for i in (i for i in range(min(45, last + 4)) if i not in mla_layers):
        specs[f"model.layers.{i}.self_attn"] = MambaSpec(
            block_size=block,
            shapes=((3, 2048), (16, 128, 64)),
            dtypes=(torch.float32, torch.float32),
            num_speculative_blocks=5,
        )
    return specs


def drafter_specs(head_sizes=(128,) * 5, block=BLOCK) -> dict:
    return {
        f"draft.layers.{45 + i}.self_attn.attn": SlidingWindowSpec(
            block_size=block, num_kv_heads=4, head_size=size, dtype=torch.bfloat16,
            sliding_window=2048,
        )
        for i, size in enumerate(head_sizes)
    }


def vllm_config():
    return SimpleNamespace(
        scheduler_config=SimpleNamespace(disable_hybrid_kv_cache_manager=False, max_num_batched_tokens=8192),
        attention_config=SimpleNamespace(hisparse_config=None),
        parallel_config=SimpleNamespace(pipeline_parallel_size=1, decode_context_parallel_size=1),
        cache_config=SimpleNamespace(
            num_gpu_blocks_override=None, prefix_cache_retention_interval=None, mamba_cache_mode="align",
            get_resolved_kv_cache_layout=lambda: KVCacheLayout.BLHNC,
        ),
        model_config=SimpleNamespace(max_model_len=327680),
        max_in_flight_tokens=8192,
        speculative_config=None,
    )


def bytes_per_block(config, groups) -> int:
    """The pool's bytes per block: 0.30.0's _get_kv_cache_bytes_per_block(groups), or
    the 0.27.1-era _pool_bytes_per_block(vllm_config, groups) the fork shape keeps."""
    if hasattr(utils, "_get_kv_cache_bytes_per_block"):
        return utils._get_kv_cache_bytes_per_block(groups)
    return utils._pool_bytes_per_block(config, groups)


def describe(specs: dict) -> dict:
    config = vllm_config()
    errors = (ValueError, NotImplementedError, AssertionError)
    try:
        bespoke = utils._get_kv_cache_groups_glm5_next(config, dict(specs)) is not None
    except errors as error:
        bespoke = f"{type(error).__name__}: {error}"
    try:
        groups = utils.get_kv_cache_groups(config, dict(specs))
        kv_config = utils.get_kv_cache_config_from_groups(config, groups, KV_PIN)
    except errors as error:
        return {"bespoke_groups": bespoke, "error": f"{type(error).__name__}: {error}"}
    return {
        "bespoke_groups": bespoke,
        "groups": [
            {
                "layers": list(group.layer_names),
                "type": type(group.kv_cache_spec).__name__,
                "block_size": group.kv_cache_spec.block_size,
                "spec": repr(group.kv_cache_spec),
            }
            for group in groups
        ],
        "num_blocks": kv_config.num_blocks,
        # Whichever KVCacheTensor form the tree has (0.30.0: layers/layer_stride; 0.27.1
        # and the fork: shared_by), field by field.
        "tensors": [dataclasses.asdict(t) for t in kv_config.kv_cache_tensors],
        "bytes_per_block": bytes_per_block(config, groups),
        "max_memory_bytes": utils._max_memory_usage_bytes_from_groups(config, groups),
    }


def main():
    report = {"vllm_file": vllm.__file__}
    for case in sys.argv[1:]:
        specs = target_specs()
        if case.startswith("real-pages"):
            specs = target_specs(REAL_BLOCK, REAL_MLA_LAYERS, real_pages=True)
        if case in ("drafter", "real-pages-drafter"):
            specs.update(drafter_specs(block=specs[next(iter(specs))].block_size))
        elif case == "two-page-sizes":
            specs.update(drafter_specs(head_sizes=(128, 128, 128, 128, 64)))
        report[case] = describe(specs)
    json.dump(report, sys.stdout)
    print()


if __name__ == "__main__":
    main()
