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
ADAPTIVE_VERIFY = _on("GLM53_ADAPTIVE_VERIFY")
SKIP_MTP_WEIGHTS = _on("GLM53_SKIP_MTP_WEIGHTS")


def _adaptive_verify_tau() -> float:
    raw = os.environ.get("GLM53_ADAPTIVE_VERIFY_TAU", "0.3")
    try:
        tau = float(raw)
    except ValueError:
        tau = float("nan")
    if not 0.0 <= tau <= 1.0:
        raise ValueError(f"GLM53_ADAPTIVE_VERIFY_TAU={raw!r}: the drafter confidence a draft "
                         "needs to be verified is a number in [0, 1]; set ADAPTIVE_VERIFY_TAU so")
    return tau


def _adaptive_verify_max() -> int | None:
    raw = os.environ.get("GLM53_ADAPTIVE_VERIFY_MAX", "")
    if raw == "":
        return None
    if not raw.isdigit():
        raise ValueError(f"GLM53_ADAPTIVE_VERIFY_MAX={raw!r}: the most drafts verified a step is "
                         "a whole number from 0 to the speculative tokens; set ADAPTIVE_VERIFY_MAX so")
    return int(raw)


ADAPTIVE_VERIFY_TAU = _adaptive_verify_tau() if ADAPTIVE_VERIFY else None
ADAPTIVE_VERIFY_MAX = _adaptive_verify_max() if ADAPTIVE_VERIFY else None


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
    return adaptive_verify_tail_slots(slot_mapping, num_tokens)


_MTP_PREFIXES: dict[int, tuple[str, ...]] = {}


def _mtp_weight_prefixes() -> tuple[str, ...]:
    """Checkpoint names of the target's MTP layers (numbered from num_hidden_layers on)."""
    from vllm.config import get_current_vllm_config

    config = get_current_vllm_config()
    if id(config) not in _MTP_PREFIXES:
        spec = getattr(config, "speculative_config", None)
        if spec is not None and "mtp" in str(getattr(spec, "method", "")):
            raise ValueError(
                "GLM53_SKIP_MTP_WEIGHTS=1: the drafter is the checkpoint's MTP head, whose "
                "weights this would skip; set SKIP_MTP_WEIGHTS=0 with SPEC=mtp"
            )
        hf_config = config.model_config.hf_config
        first = int(hf_config.num_hidden_layers)
        count = int(getattr(hf_config, "num_nextn_predict_layers", 0) or 0)
        _MTP_PREFIXES[id(config)] = tuple(
            f"{root}layers.{layer}." for layer in range(first, first + count) for root in ("model.", "")
        )
    return _MTP_PREFIXES[id(config)]


def skip_mtp_weight(weight_name: str) -> bool:
    """Whether the loader skips this tensor unread: the MTP layers' weights (13.84 GiB on
    GLM-5.3-Flash), which the main model drops after reading when the drafter is not MTP."""
    return SKIP_MTP_WEIGHTS and weight_name.startswith(_mtp_weight_prefixes())


def router_dtype(dtype: torch.dtype) -> torch.dtype:
    """The MoE router GEMM's output dtype: fp32 with GLM53_ROUTER_FP32=1."""
    return torch.float32 if ROUTER_FP32 else dtype


def indexer_workspace_factor(served: int) -> int:
    """Indexer prefill gather workspace, in entries per max_model_len token (1 when opted in)."""
    return 1 if INDEXER_WS_FACTOR else served


# Adaptive verify: a greedy request verifies only its drafter's confident prefix, at fixed
# shapes. The drafts past it become -1 (the rejection sampler rejects them before they
# can be accepted); the rows holding them reuse their anchor row's experts at weight 0 and
# get tail slot -1. Rows up to the first masked draft see only unmasked inputs, so the
# tokens a step emits are those of verifying the prefix alone. Requests sampled at a
# temperature verify every draft: a -1 draft's resample would draw from the residual
# max(p - q, 0) of the drafter's cached distribution, not from p.


class _AdaptiveVerifyState:
    def __init__(self, scores: torch.Tensor, num_speculative_tokens: int, max_num_reqs: int) -> None:
        limit = num_speculative_tokens if ADAPTIVE_VERIFY_MAX is None else ADAPTIVE_VERIFY_MAX
        if limit > num_speculative_tokens:
            raise ValueError(
                f"GLM53_ADAPTIVE_VERIFY_MAX={limit}: above the {num_speculative_tokens} speculative "
                "tokens a step drafts; set ADAPTIVE_VERIFY_MAX to at most that"
            )
        self.limit = limit
        self.scores = scores
        # every draft verified until the drafter has reported on the request
        self.verify_len = torch.full((max_num_reqs,), num_speculative_tokens, dtype=torch.int32,
                                     device=scores.device)


_STATE: _AdaptiveVerifyState | None = None
# Per-row routing for the target's MoE layers, sized by the first (largest: the memory
# profile's) forward so CUDA graphs captured later read these same buffers.
_ROW_SOURCE: torch.Tensor | None = None
_ROW_KEEP: torch.Tensor | None = None
_ROW_IDENTITY: torch.Tensor | None = None  # what _ROW_SOURCE is reset to before each forward


def _selector_scores(speculator) -> torch.Tensor | None:
    """The realized DFlash2 selector scores ``[reqs, k, top_k]`` of the last drafting step."""
    scores = getattr(speculator, "_selector_scores", None)  # 0.28.0 to 0.30.0 and v9
    if scores is None:
        scores = getattr(getattr(speculator, "candidate_sampler", None), "scores", None)  # 0.33.0
    return scores


def adaptive_verify_record(speculator, input_batch) -> None:
    """After drafting: each request's confident prefix, the drafts its next step verifies.

    A draft's confidence is the selector's probability of its choice (greedy: the largest
    softmax of its realized scores); the prefix ends at the first draft below tau.
    """
    global _STATE
    if not ADAPTIVE_VERIFY or speculator is None:
        return
    if _STATE is None:
        scores = _selector_scores(speculator)
        if scores is None:
            raise RuntimeError(
                f"GLM53_ADAPTIVE_VERIFY=1: the drafter {type(speculator).__name__} reports no "
                "selector confidence (only DFlash2 does); set ADAPTIVE_VERIFY=0 with this drafter"
            )
        _STATE = _AdaptiveVerifyState(scores, scores.shape[1], scores.shape[0])
    num_reqs = int(input_batch.num_reqs)
    confidence = torch.softmax(_STATE.scores[:num_reqs].float(), dim=-1).amax(dim=-1)
    prefix = (confidence >= ADAPTIVE_VERIFY_TAU).to(torch.int32).cumprod(dim=1).sum(dim=1)
    _STATE.verify_len[input_batch.idx_mapping[:num_reqs].long()] = prefix.clamp(max=_STATE.limit).to(torch.int32)


def adaptive_verify_masked(expanded_idx_mapping, expanded_local_pos, temperature):
    """Per logits row: whether the draft it holds is past its request's confident prefix."""
    if _STATE is None:
        return None
    req = expanded_idx_mapping.long()
    draft = expanded_local_pos.long() - 1  # the draft a row holds; -1 at the anchor row
    greedy = temperature.index_select(0, req) == 0
    return (draft >= 0) & (draft >= _STATE.verify_len.index_select(0, req)) & greedy


def adaptive_verify_drafts(draft_sampled, expanded_idx_mapping, expanded_local_pos, temperature):
    """The drafts the rejection sampler checks: -1 past the confident prefix."""
    masked = adaptive_verify_masked(expanded_idx_mapping, expanded_local_pos, temperature)
    if masked is None:
        return draft_sampled
    return draft_sampled.masked_fill(masked, -1)


def adaptive_verify_rows(input_batch, sampler, vllm_config) -> None:
    """Before the target's forward: the rows holding masked drafts take their anchor row's
    experts at weight 0 (written in place into the routing buffers)."""
    if _ROW_SOURCE is None:
        return
    _ROW_SOURCE.copy_(_ROW_IDENTITY)
    _ROW_KEEP.fill_(1.0)
    # sequence-parallel MoE routes a slice of the rows on each rank: row numbers would not
    # match, so the routing stays as served there (the masked drafts are still rejected)
    if getattr(vllm_config.parallel_config, "use_sequence_parallel_moe", False):
        return
    if sampler is None or _STATE is None:
        return
    masked = adaptive_verify_masked(input_batch.expanded_idx_mapping, input_batch.expanded_local_pos,
                                    sampler.sampling_states.temperature.gpu)
    rows = input_batch.logits_indices.long()
    if rows.numel() == 0 or masked is None:
        return
    local = input_batch.expanded_local_pos.long()
    anchor = rows.index_select(0, torch.arange(rows.shape[0], device=rows.device) - local)
    fits = rows < _ROW_SOURCE.shape[0]
    _ROW_SOURCE.scatter_(0, rows[fits], torch.where(masked, anchor, rows)[fits])
    _ROW_KEEP.scatter_(0, rows[fits], (~masked[fits]).to(_ROW_KEEP.dtype))


def adaptive_verify_route(topk_weights: torch.Tensor, topk_ids: torch.Tensor):
    """The router's choice with masked rows on their anchor's experts at weight 0."""
    global _ROW_SOURCE, _ROW_KEEP, _ROW_IDENTITY
    if not ADAPTIVE_VERIFY:
        return topk_weights, topk_ids
    rows = topk_ids.shape[0]
    if _ROW_SOURCE is None:
        _ROW_IDENTITY = torch.arange(rows, device=topk_ids.device)
        _ROW_SOURCE = _ROW_IDENTITY.clone()
        _ROW_KEEP = torch.ones(rows, dtype=torch.float32, device=topk_ids.device)
    if rows > _ROW_SOURCE.shape[0]:
        return topk_weights, topk_ids  # more rows than the buffers: route as served (lossless)
    source = _ROW_SOURCE[:rows]
    keep = _ROW_KEEP[:rows].to(topk_weights.dtype).unsqueeze(1)
    return topk_weights.index_select(0, source) * keep, topk_ids.index_select(0, source)


def adaptive_verify_tail_slots(slot_mapping: torch.Tensor, num_tokens: int) -> torch.Tensor:
    """Tail slot -1 (never stashed) for the rows holding masked drafts."""
    if ADAPTIVE_VERIFY and _ROW_KEEP is not None and num_tokens <= _ROW_KEEP.shape[0]:
        head = slot_mapping[:num_tokens]
        head.masked_fill_(_ROW_KEEP[:num_tokens] == 0, -1)
    return slot_mapping
