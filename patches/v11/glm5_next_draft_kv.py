# SPDX-License-Identifier: Apache-2.0
"""A KV-cache group of its own for a drafter's sliding-window layers beside Glm5Next.

Installed beside vllm/v1/core/kv_cache_utils.py by the GLM-5.3-Flash DGX Spark
recipe's v11 layer. Glm5Next's bespoke grouping aliases Mamba/KDA states onto MLA
pages and the kpool tail onto indexer pages; a DFlash drafter adds
``SlidingWindowSpec`` layers that fit neither, which made the grouping give up. The
drafter's layers get one group here, at a quarter of the attention block (at least
16 tokens): smaller blocks cost block ids but save pool bytes for a 2,048-token
window. Each drafter layer gets its own tensor region after the indexer region, and
its pages count in the pool's bytes per block and in the maximum-memory estimate.
With no drafter layers every function here is the identity (or zero), so the
grouping, the layout and the pool are exactly what they were.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from vllm.utils.math_utils import cdiv
from vllm.v1.kv_cache_interface import (
    KVCacheGroupSpec,
    KVCacheSpec,
    KVCacheTensor,
    SlidingWindowSpec,
)

DRAFT_BLOCK_DIVISOR = 4
MIN_DRAFT_BLOCK_SIZE = 16


def is_draft_spec(spec: KVCacheSpec) -> bool:
    """A drafter layer: a plain sliding-window spec (KpoolTailSpec and
    SlidingWindowMLASpec subclass it but belong to the target)."""
    return type(spec) is SlidingWindowSpec


def split_draft_specs(
    kv_cache_spec: dict[str, KVCacheSpec],
) -> tuple[dict[str, KVCacheSpec], dict[str, SlidingWindowSpec]]:
    """(the target's specs, the drafter's sliding-window specs)."""
    target = {n: s for n, s in kv_cache_spec.items() if not is_draft_spec(s)}
    draft = {n: s for n, s in kv_cache_spec.items() if is_draft_spec(s)}
    return target, draft  # type: ignore[return-value]


def draft_block_size(attention_block_size: int) -> int:
    return max(MIN_DRAFT_BLOCK_SIZE, attention_block_size // DRAFT_BLOCK_DIVISOR)


def with_draft_group(
    groups: list[KVCacheGroupSpec] | None,
    draft_specs: dict[str, SlidingWindowSpec],
) -> list[KVCacheGroupSpec] | None:
    """``groups`` plus one group holding every drafter layer (unchanged without any)."""
    if groups is None or not draft_specs:
        return groups
    pages = sorted({spec.page_size_bytes for spec in draft_specs.values()})
    if len(pages) != 1:
        raise ValueError(
            f"the drafter's sliding-window layers have KV pages of {pages} bytes; "
            "Glm5Next's drafter KV group needs one page size, so serve a drafter "
            "whose layers share heads, head size, dtype and window"
        )
    windows = sorted({spec.sliding_window for spec in draft_specs.values()})
    if len(set(draft_specs.values())) != 1:
        raise ValueError(
            f"the drafter's sliding-window layers differ (windows {windows}); "
            "Glm5Next's drafter KV group needs identical layer specs"
        )
    attention_block = groups[0].kv_cache_spec.block_size
    spec = replace(next(iter(draft_specs.values())), block_size=draft_block_size(attention_block))
    return [*groups, KVCacheGroupSpec(list(draft_specs), spec)]


def draft_groups(groups: Sequence[KVCacheGroupSpec]) -> list[KVCacheGroupSpec]:
    return [group for group in groups if is_draft_spec(group.kv_cache_spec)]


def without_draft_groups(groups: Sequence[KVCacheGroupSpec]) -> list[KVCacheGroupSpec]:
    return [group for group in groups if not is_draft_spec(group.kv_cache_spec)]


def draft_bytes_per_block(groups: Sequence[KVCacheGroupSpec]) -> int:
    """Bytes one block id takes in the drafter's region of the pool."""
    return sum(
        len(group.layer_names) * group.kv_cache_spec.page_size_bytes
        for group in draft_groups(groups)
    )


def draft_max_pages(vllm_config: Any, groups: Sequence[KVCacheGroupSpec]) -> int:
    """Block ids one request can hold in the drafter's group."""
    return sum(
        cdiv(
            group.kv_cache_spec.max_memory_usage_bytes(vllm_config),
            group.kv_cache_spec.page_size_bytes,
        )
        for group in draft_groups(groups)
    )


def draft_kv_cache_tensors(
    groups: Sequence[KVCacheGroupSpec], num_blocks: int, size: int, offset: int
) -> list[KVCacheTensor]:
    """One tensor per drafter layer, laid out from ``offset`` one layer after another."""
    tensors = []
    for group in draft_groups(groups):
        page = group.kv_cache_spec.page_size_bytes
        for name in group.layer_names:
            tensors.append(
                KVCacheTensor(
                    size=size,
                    layers=[name],
                    layer_stride=page * num_blocks,
                    block_stride=page,
                    offset=offset,
                )
            )
            offset += page * num_blocks
    return tensors
