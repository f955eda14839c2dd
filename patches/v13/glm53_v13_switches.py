"""GLM-5.3-Flash recipe, layer v13: the run-time switches of its change groups.

Each switch is read once, at import, from the environment the launcher sets identically
on every rank; a switch is on only when its variable is exactly "1", so with nothing set
the patched code does what v11's did. Installed by the recipe's layer v13 (patches/v13).
"""

import os

import torch


def _on(name: str) -> bool:
    return os.environ.get(name) == "1"


KPOOL_TAIL_FIX = _on("GLM53_KPOOL_TAIL_FIX")
ROUTER_FP32 = _on("GLM53_ROUTER_FP32")
INDEXER_WS_FACTOR = _on("GLM53_INDEXER_WS_FACTOR")


def next_power_of_two(value: int) -> int:
    return 1 << max(0, int(value) - 1).bit_length()


def kpool_ring(kpool: int, num_speculative_tokens: int) -> int:
    """Tail-ring slots per request: room for one pool plus every draft of a verify step.

    A verify step stashes all k drafts before any is accepted; a ring of kpool slots lets a
    rejected draft overwrite a committed slot of the pool still being filled.
    """
    return max(kpool, next_power_of_two(num_speculative_tokens + kpool - 1))


def kpool_tail_block_size(kpool: int, vllm_config) -> int:
    """The tail spec's block size: kpool as served, the ring with the fix on."""
    if not KPOOL_TAIL_FIX:
        return kpool
    spec = getattr(vllm_config, "speculative_config", None)
    k = int(getattr(spec, "num_speculative_tokens", 0) or 0) if spec is not None else 0
    ring = kpool_ring(kpool, k)
    block_size = vllm_config.cache_config.block_size
    if block_size % ring:
        raise ValueError(
            f"GLM53_KPOOL_TAIL_FIX=1: the kpool tail ring ({ring} slots for kpool {kpool} and "
            f"{k} speculative tokens) must divide the block size ({block_size}); choose a "
            "block size that is a multiple of it, or set KPOOL_TAIL_FIX=0"
        )
    return ring


def kpool_seed_geometry(tail_kv_cache: torch.Tensor, kpool: int, head_dim: int) -> dict:
    """Where the prefill seed kernel writes: the tail view's own strides with the fix on,
    the packed ``[block, 2, kpool, head_dim]`` arithmetic the served kernel assumed without it."""
    if KPOOL_TAIL_FIX:
        return {
            "TAIL_BLOCK_ELEMS": tail_kv_cache.stride(0),
            "KPOOL_HEAD": tail_kv_cache.stride(1),
            "RING": tail_kv_cache.shape[2],
        }
    return {"TAIL_BLOCK_ELEMS": 2 * kpool * head_dim, "KPOOL_HEAD": kpool * head_dim, "RING": kpool}


def kpool_tail_slots_without_positions(slot_mapping, common_attn_metadata, ring: int):
    """Tail slots ``block * ring + pos % ring`` when the runner passes no positions (V2).

    A token's position is ``seq_lens[r] - (query_start_loc[r + 1] - t)`` for token ``t`` of
    request ``r``; the slots are written in place into the persistent slot-mapping row, so
    a FULL CUDA-graph replay reads them.
    """
    num_tokens = int(common_attn_metadata.num_actual_tokens)
    num_reqs = int(common_attn_metadata.num_reqs)
    if num_tokens == 0 or num_reqs == 0:
        return slot_mapping
    query_start_loc = common_attn_metadata.query_start_loc
    tokens = torch.arange(num_tokens, device=slot_mapping.device)
    req = torch.searchsorted(query_start_loc, tokens, right=True) - 1
    req = req.clamp_(min=0, max=num_reqs - 1)
    seq_lens = common_attn_metadata.seq_lens[:num_reqs].to(torch.int64)
    ends = query_start_loc[1 : num_reqs + 1].to(torch.int64)
    pos = seq_lens.index_select(0, req) - (ends.index_select(0, req) - tokens)
    block = common_attn_metadata.block_table_tensor[:num_reqs, 0].index_select(0, req).to(torch.int64)
    slot_mapping[:num_tokens] = (block * ring + torch.remainder(pos, ring)).to(slot_mapping.dtype)
    return slot_mapping


def router_dtype(dtype: torch.dtype) -> torch.dtype:
    """The MoE router GEMM's output dtype: fp32 with GLM53_ROUTER_FP32=1."""
    return torch.float32 if ROUTER_FP32 else dtype


def indexer_workspace_factor(served: int) -> int:
    """Indexer prefill gather workspace, in entries per max_model_len token (1 when opted in)."""
    return 1 if INDEXER_WS_FACTOR else served
