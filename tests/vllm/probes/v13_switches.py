"""Exercise layer v13's patched vLLM functions on CPU torch, with the switches the caller set.

Run with PYTHONPATH set to a v13-patched 0.30.0 or fork-shaped tree and GLM53_* in the
environment. Prints one JSON object: the kpool tail spec's block size (and the refusal of
a ring that does not divide the block size), the V2 tail slots against the positions
path, the indexer workspace size and the router dtype.
"""

import json
import os
from types import SimpleNamespace

import torch
import vllm.platforms
from vllm.platforms.cpu import CpuPlatform

vllm.platforms._current_platform = CpuPlatform()

import vllm.glm53_v13_switches as switches
from vllm.models.glm5next.nvidia.attention import Glm5NextTailCache
from vllm.v1.attention.backends.mla import indexer


def config(block_size, k, max_model_len=327_680):
    return SimpleNamespace(
        cache_config=SimpleNamespace(block_size=block_size),
        speculative_config=SimpleNamespace(num_speculative_tokens=k) if k else None,
        model_config=SimpleNamespace(max_model_len=max_model_len),
    )


def tail_block(block_size, k):
    cache = SimpleNamespace(_index_kpool=4, head_dim=128, cache_config=SimpleNamespace(block_size=block_size))
    try:
        return Glm5NextTailCache.get_kv_cache_spec(cache, config(block_size, k)).block_size
    except ValueError as error:
        return f"ValueError: {error}"


def v2_slots(ring):
    """Three requests mid-decode and one prefilling: slots without positions vs with them."""
    seq_lens = torch.tensor([37, 52, 9, 130])
    query_lens = torch.tensor([8, 8, 5, 20])
    query_start_loc = torch.cat([torch.zeros(1, dtype=torch.int64), query_lens.cumsum(0)])
    positions = torch.cat([torch.arange(s - q, s) for s, q in zip(seq_lens.tolist(), query_lens.tolist())])
    block_table = torch.tensor([[3, 0], [5, 0], [1, 0], [7, 0]])
    n = int(query_lens.sum())
    row = torch.full((n + 4,), -7, dtype=torch.int64)  # the persistent row, padded past the batch
    metadata = SimpleNamespace(num_actual_tokens=n, num_reqs=4, query_start_loc=query_start_loc,
                               seq_lens=seq_lens, block_table_tensor=block_table)
    got = switches.kpool_tail_slots_without_positions(row, metadata, ring)
    want = indexer.compute_kpool_tail_slot_mapping(
        torch.full((n + 4,), -7, dtype=torch.int64), block_table, query_start_loc, positions, n, 4, ring)
    return {"equal": torch.equal(got, want), "in_place": got.data_ptr() == row.data_ptr(),
            "padding_kept": row[n:].tolist() == [-7] * 4}


print(json.dumps({
    "switches": {name: os.environ.get(name) for name in sorted(os.environ) if name.startswith("GLM53_")},
    "kpool_tail_fix": switches.KPOOL_TAIL_FIX,
    "tail_block": {f"k{k}-b{b}": tail_block(b, k) for k, b in ((7, 2304), (4, 2304), (5, 2304), (0, 2304), (7, 2300))},
    "v2_slots": v2_slots(16),
    "workspace_entries": indexer.get_max_prefill_buffer_size(config(2304, 7)),
    "router_dtype": str(switches.router_dtype(torch.bfloat16)),
}))
