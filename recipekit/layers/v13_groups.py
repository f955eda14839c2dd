"""Layer v13's change groups: what each edits, which variable gates it, what a base provides.

Every edit is an exact substring of the pinned 0.30.0 text (the fork-era Glm5Next) that
must be found exactly ``count`` times, replaced by code of ours that asks the switches
module (patches/v13/glm53_v13_switches.py, installed as ``vllm.glm53_v13_switches``)
whether its group is on. Off, every replacement computes what the served code computed,
so v13 with nothing set behaves as v11. ``GROUPS`` is the one list of groups: a new group
is one more entry there.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from recipekit.tree import TreeView

SWITCHES = "vllm/glm53_v13_switches.py"
KPOOL_KERNELS = "vllm/models/glm5next/nvidia/ops/kpool_compress.py"
TAIL_CACHE = "vllm/models/glm5next/nvidia/attention.py"
INDEXER = "vllm/v1/attention/backends/mla/indexer.py"
# Glm5NextMoE's gate: 0.30.0 and the fork keep the model under nvidia/, 0.33.0 under common/.
MODELS = ("vllm/models/glm5next/nvidia/model.py", "vllm/models/glm5next/common/model.py")
REJECTION_SAMPLER = "vllm/v1/worker/gpu/spec_decode/rejection_sampler.py"
MODEL_RUNNER = "vllm/v1/worker/gpu/model_runner.py"
ROUTER = "vllm/model_executor/layers/fused_moe/router/base_router.py"
WEIGHT_FILTER = "vllm/model_executor/model_loader/ep_weight_filter.py"


@dataclass(frozen=True)
class Edit:
    """``anchor`` (found ``count`` times) becomes ``replacement``."""

    anchor: str
    replacement: str
    count: int = 1
    marker: str = ""  # what shows the edit is in the tree, when not the replacement itself

    @property
    def evidence(self) -> str:
        return self.marker or self.replacement


@dataclass(frozen=True)
class Either:
    """One change that bases word differently: the first option whose anchor (or evidence)
    the file holds the expected number of times."""

    options: tuple[Edit, ...]


def imports(*names: str) -> Edit:
    """Our switches imported right after the file's ``import torch``."""
    line = f"from vllm.glm53_v13_switches import {', '.join(names)}\n"
    return Edit("\nimport torch\n", f"\nimport torch\n\n{line}", marker=f"\n{line}")


@dataclass(frozen=True)
class Group:
    """One change group of v13, gated at run time by ``variable`` (on only when exactly "1")."""

    id: str
    variable: str
    summary: str
    edits: dict[str | tuple[str, ...], tuple[Edit | Either, ...]]  # file -> its edits (a tuple of candidate files: the first present)
    provided_by: Callable[[TreeView], str | None] = lambda view: None


def _kpool_ring_upstream(view: TreeView) -> str | None:
    for path in (KPOOL_KERNELS,):
        text = view.read_text(path) or ""
        ours = "glm53_v13_switches" in text  # our own ring (this layer) is not the base's
        if not ours and "blk = t // RING" in text and "        RING=tail_kv_cache.shape[2],\n" in text:
            indexer = view.read_text(INDEXER) or ""
            v2 = (
                "its tail metadata builder still maps slots only when the runner passes positions "
                "(the V2 runner's positions bug is not addressed there)"
                if "        if positions is not None:\n" in indexer
                else "its tail metadata builder's V2 handling was not recognised"
            )
            return (
                f"provided by the base: {path} has upstream's tail ring (PR #57477: RING, the "
                "seed kernel addressed through the tail view's strides, a ring of "
                "kpool * next_power_of_2(cdiv(kpool + k, kpool)) slots); " + v2
            )
    return None


def _workspace_factor_upstream(view: TreeView) -> str | None:
    text = view.read_text(INDEXER) or ""
    if "sparse_mla_prefill_workspace_factor" in text:
        return (
            "provided by the base: get_max_prefill_buffer_size reads "
            "attention_config.sparse_mla_prefill_workspace_factor (set it through "
            "--attention-config instead)"
        )
    return None


KPOOL_TAIL_FIX = Group(
    id="kpool-tail",
    variable="GLM53_KPOOL_TAIL_FIX",
    summary=(
        "the sparse indexer's per-request tail ring holds R = max(kpool, next power of two "
        ">= k + kpool - 1) slots, so rejected drafts never overwrite committed ones; the "
        "prefill seed writes through the tail view's strides; on the V2 runner slots come "
        "from seq_lens and query_start_loc, written in place for FULL graph replay"
    ),
    edits={
        KPOOL_KERNELS: (
            imports("kpool_seed_geometry"),
            Edit(
                "    KPOOL: tl.constexpr,\n    BLOCK_D: tl.constexpr,\n):\n",
                "    KPOOL: tl.constexpr,\n    BLOCK_D: tl.constexpr,\n"
                "    TAIL_BLOCK_ELEMS: tl.constexpr,\n    KPOOL_HEAD: tl.constexpr,\n"
                "    RING: tl.constexpr,\n):\n",
            ),
            Edit("    blk = t // KPOOL  # t >= 0 here", "    blk = t // RING  # t >= 0 here"),
            Edit("    if ahead >= 0 and ahead // KPOOL == blk:\n", "    if ahead >= 0 and ahead // RING == blk:\n"),
            Edit(
                "    base = (blk * 2 * KPOOL + t % KPOOL) * HEAD_DIM\n",
                "    base = blk * TAIL_BLOCK_ELEMS + (t % RING) * HEAD_DIM\n",
            ),
            Edit(
                "    tl.store(tail_ptr + base + KPOOL * HEAD_DIM + offs, s, mask=m)\n",
                "    tl.store(tail_ptr + base + KPOOL_HEAD + offs, s, mask=m)\n",
            ),
            Edit(
                "        KPOOL=kpool,\n        BLOCK_D=triton.next_power_of_2(head_dim),\n",
                "        KPOOL=kpool,\n        BLOCK_D=triton.next_power_of_2(head_dim),\n"
                "        **kpool_seed_geometry(tail_kv_cache, kpool, head_dim),\n",
            ),
            Edit(
                "    KPOOL_HEAD: tl.constexpr,\n    HEAD_DIM: tl.constexpr,\n",
                "    KPOOL_HEAD: tl.constexpr,\n    RING: tl.constexpr,\n    HEAD_DIM: tl.constexpr,\n",
            ),
            Edit("        phys_slot = safe_pos % POOL_SIZE\n", "        phys_slot = safe_pos % RING\n"),
            Edit(
                "        block = tl.maximum(tail_slot, 0).to(tl.int64) // POOL_SIZE\n",
                "        block = tl.maximum(tail_slot, 0).to(tl.int64) // RING\n",
            ),
            Edit(
                "                phys = (pool_logical_start + pool_slot) % POOL_SIZE\n",
                "                phys = (pool_logical_start + pool_slot) % RING\n",
                count=2,
            ),
            Edit(
                "    assert tail_kv_cache.shape[2] == pool_size\n",
                "    ring = tail_kv_cache.shape[2]\n"
                "    assert ring >= pool_size and ring % pool_size == 0, (ring, pool_size)\n",
            ),
            Edit(
                "        TAIL_BLOCK_ELEMS=tail_kv_cache.stride(0),\n",
                "        TAIL_BLOCK_ELEMS=tail_kv_cache.stride(0),\n        RING=ring,\n",
            ),
        ),
        TAIL_CACHE: (
            imports("kpool_tail_block_size"),
            Edit(
                "        return KpoolTailSpec(\n            block_size=self._index_kpool,\n",
                "        return KpoolTailSpec(\n"
                "            block_size=kpool_tail_block_size(self._index_kpool, vllm_config),\n",
            ),
        ),
        INDEXER: (
            imports("KPOOL_TAIL_FIX", "kpool_tail_slots_without_positions"),
            Edit(
                "        positions = common_attn_metadata.positions\n        if positions is not None:\n",
                "        positions = common_attn_metadata.positions\n"
                "        if positions is None and KPOOL_TAIL_FIX:\n"
                "            slot_mapping = kpool_tail_slots_without_positions(\n"
                "                slot_mapping, common_attn_metadata, self.kv_cache_spec.block_size\n"
                "            )\n"
                "        elif positions is not None:\n",
            ),
            Edit(
                "                out=slot_mapping_buffer,\n",
                "                out=slot_mapping if KPOOL_TAIL_FIX else slot_mapping_buffer,\n",
            ),
        ),
    },
    provided_by=_kpool_ring_upstream,
)

ROUTER_FP32 = Group(
    id="router-fp32",
    variable="GLM53_ROUTER_FP32",
    summary="Glm5NextMoE's router GEMM returns fp32 logits (the gate's out_dtype)",
    edits={
        MODELS: (
            imports("router_dtype"),
            Edit(
                "        self.router_dtype = _get_moe_router_dtype(config)\n",
                "        self.router_dtype = router_dtype(_get_moe_router_dtype(config))\n",
            ),
        ),
    },
)

INDEXER_WS_FACTOR = Group(
    id="indexer-ws",
    variable="GLM53_INDEXER_WS_FACTOR",
    summary=(
        "the indexer's prefill gather workspace is max_model_len entries instead of 40 x "
        "max_model_len (1.61 GiB -> 41 MiB a rank at 327,680)"
    ),
    edits={
        INDEXER: (
            imports("indexer_workspace_factor"),
            Edit("    return max_model_len * 40\n", "    return max_model_len * indexer_workspace_factor(40)\n"),
        ),
    },
    provided_by=_workspace_factor_upstream,
)

_VERIFY_ARGS = (
    "                expanded_idx_mapping,\n"
    "                expanded_local_pos,\n"
    "                self.sampler.sampling_states.temperature.gpu,\n"
    "            ),\n"
)

ADAPTIVE_VERIFY = Group(
    id="adaptive-verify",
    variable="GLM53_ADAPTIVE_VERIFY",
    summary=(
        "a greedy request verifies only the DFlash2 drafter's confident prefix (selector "
        "confidence >= GLM53_ADAPTIVE_VERIFY_TAU, at most GLM53_ADAPTIVE_VERIFY_MAX drafts) "
        "at unchanged shapes: later drafts become -1 for the rejection sampler, their rows "
        "reuse the anchor row's experts at weight 0 and get tail slot -1"
    ),
    edits={
        REJECTION_SAMPLER: (
            imports("adaptive_verify_drafts"),
            Either((
                # 0.28.0 to 0.30.0 and the fork (v9): apply_sampling_params has used the drafts
                Edit(
                    "        sampled, num_sampled = rejection_sample(\n"
                    "            processed_logits,\n            draft_logits,\n            draft_sampled,\n",
                    "        sampled, num_sampled = rejection_sample(\n"
                    "            processed_logits,\n            draft_logits,\n"
                    "            adaptive_verify_drafts(\n                draft_sampled,\n" + _VERIFY_ARGS,
                ),
                # 0.33.0 passes the rejection kernels their own copy of the drafts
                Edit(
                    "        sampled, num_sampled = rejection_sample(\n"
                    "            processed_logits,\n            draft_logits,\n            verify_draft_sampled,\n",
                    "        sampled, num_sampled = rejection_sample(\n"
                    "            processed_logits,\n            draft_logits,\n"
                    "            adaptive_verify_drafts(\n                verify_draft_sampled,\n" + _VERIFY_ARGS,
                ),
            )),
        ),
        MODEL_RUNNER: (
            imports("adaptive_verify_record", "adaptive_verify_rows"),
            Edit(
                "            block_tables, slot_mappings = self.prepare_attn(input_batch)\n",
                "            block_tables, slot_mappings = self.prepare_attn(input_batch)\n"
                "            adaptive_verify_rows(input_batch, getattr(self, \"sampler\", None), self.vllm_config)\n",
            ),
            Edit(
                "            self.req_states.draft_tokens[input_batch.idx_mapping] = draft_tokens\n",
                "            self.req_states.draft_tokens[input_batch.idx_mapping] = draft_tokens\n"
                "            adaptive_verify_record(self.speculator, input_batch)\n",
            ),
        ),
        ROUTER: (
            imports("adaptive_verify_route"),
            Edit(
                "        # Capture logical ids before EPLB mapping.\n        if self.capture_fn is not None:\n",
                "        topk_weights, topk_ids = adaptive_verify_route(topk_weights, topk_ids)\n\n"
                "        # Capture logical ids before EPLB mapping.\n        if self.capture_fn is not None:\n",
            ),
        ),
    },
)

SKIP_MTP_WEIGHTS = Group(
    id="skip-mtp-weights",
    variable="GLM53_SKIP_MTP_WEIGHTS",
    summary=(
        "the weight loader skips the target's MTP-layer tensors unread (13.84 GiB on "
        "GLM-5.3-Flash) when the drafter is not the MTP head; with the MTP head it refuses"
    ),
    edits={
        WEIGHT_FILTER: (
            Edit("\nimport regex as re\n", "\nimport regex as re\n\n"
                 "from vllm.glm53_v13_switches import skip_mtp_weight\n",
                 marker="\nfrom vllm.glm53_v13_switches import skip_mtp_weight\n"),
            Edit(
                "    if local_expert_ids is None:\n        return False\n",
                "    if skip_mtp_weight(weight_name):\n        return True\n"
                "    if local_expert_ids is None:\n        return False\n",
            ),
        ),
    },
)

GROUPS: tuple[Group, ...] = (KPOOL_TAIL_FIX, ROUTER_FP32, INDEXER_WS_FACTOR, ADAPTIVE_VERIFY, SKIP_MTP_WEIGHTS)
