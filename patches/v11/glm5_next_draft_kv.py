# SPDX-License-Identifier: Apache-2.0
"""A KV-cache group of its own for a drafter's sliding-window layers beside Glm5Next.

Installed beside vllm/v1/core/kv_cache_utils.py by the GLM-5.3-Flash DGX Spark
recipe's v11 layer, which puts the decorators below on the planner's shared seams:
the Glm5Next grouping, its layout recogniser and every function that reads that
layout (the pool's bytes per block, the KV cache config, the maximum-memory
estimate). Glm5Next's bespoke grouping aliases Mamba/KDA states onto MLA pages and
the kpool tail onto indexer pages; a DFlash drafter adds ``SlidingWindowSpec``
layers that fit neither, which made the grouping give up. The drafter's layers get
one group here, at a quarter of the attention block (at least 16 tokens): smaller
blocks cost block ids but save pool bytes for a 2,048-token window. The base's own
planner plans the target exactly as before; the decorators add the drafter's pages
to the pool's bytes per block and to the estimate, and one tensor per drafter layer,
built in whichever ``KVCacheTensor`` form this vLLM has (one shared allocation with
offsets, or one allocation per tensor). With no drafter layers every decorator is
the identity, so grouping, layout and pool are exactly what they were.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from collections.abc import Callable, Sequence
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


def tensor_form() -> str:
    """``"layers"`` (one shared allocation, vLLM 0.30.0) or ``"shared_by"`` (one
    allocation per tensor, vLLM 0.27.1/0.28.0 and forks of that era), by KVCacheTensor's fields."""
    names = {field.name for field in dataclasses.fields(KVCacheTensor)}
    if {"layers", "layer_stride", "block_stride", "offset"} <= names:
        return "layers"
    if "shared_by" in names:
        return "shared_by"
    raise TypeError(f"KVCacheTensor has fields {sorted(names)}; the drafter's KV group cannot place its tensors")


def draft_kv_cache_tensors(
    groups: Sequence[KVCacheGroupSpec], num_blocks: int, size: int, offset: int
) -> list[KVCacheTensor]:
    """One tensor per drafter layer. Shared-allocation form: laid out from ``offset``
    one layer after another in an allocation of ``size`` bytes; otherwise each layer
    its own allocation of its pages."""
    form = tensor_form()
    tensors = []
    for group in draft_groups(groups):
        page = group.kv_cache_spec.page_size_bytes
        for name in group.layer_names:
            if form == "layers":
                tensors.append(KVCacheTensor(
                    size=size, layers=[name], layer_stride=page * num_blocks,
                    block_stride=page, offset=offset,
                ))
            else:
                tensors.append(KVCacheTensor(size=page * num_blocks, shared_by=[name]))
            offset += page * num_blocks
    return tensors


def _pool_bytes(layout: tuple) -> int:
    """The target's bytes per block from Glm5Next's layout 8-tuple."""
    _, _, mla_names, idx_names, mla_page, idx_page, _, _ = layout
    return len(mla_names) * mla_page + len(idx_names) * idx_page


def _drafter_layout(fn: Callable, groups: Sequence[KVCacheGroupSpec]) -> tuple | None:
    """Glm5Next's layout of ``groups`` when they hold a drafter group, else None."""
    if not draft_groups(groups):
        return None
    return fn.__globals__["_glm5_next_tensor_layout"](groups)


def glm5_next_groups_with_draft(fn: Callable) -> Callable:
    """For ``_get_kv_cache_groups_glm5_next(vllm_config, kv_cache_spec)``."""

    @functools.wraps(fn)
    def wrapper(vllm_config, kv_cache_spec):
        target, draft = split_draft_specs(kv_cache_spec)
        return with_draft_group(fn(vllm_config, target if draft else kv_cache_spec), draft)

    return wrapper


def glm5_next_layout_past_draft(fn: Callable) -> Callable:
    """For ``_glm5_next_tensor_layout(kv_cache_groups)``: the drafter's group is not the target's."""

    @functools.wraps(fn)
    def wrapper(kv_cache_groups):
        if not draft_groups(kv_cache_groups):
            return fn(kv_cache_groups)
        return fn(without_draft_groups(kv_cache_groups))

    return wrapper


def bytes_per_block_with_draft(fn: Callable) -> Callable:
    """For a function returning the pool's bytes per block from ``kv_cache_groups``."""
    signature = inspect.signature(fn)

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        groups = signature.bind(*args, **kwargs).arguments["kv_cache_groups"]
        result = fn(*args, **kwargs)
        if _drafter_layout(fn, groups) is None:
            return result
        return result + draft_bytes_per_block(groups)

    return wrapper


def _planned_with_draft(plan: Callable) -> Callable:
    """A seam decorator for a planner of ``kv_cache_groups``: without a drafter group the
    planner runs as it is; with one, PLAN(fn, bound, groups, target_bytes) plans it, BOUND
    being the planner's arguments with the drafter's groups taken out."""

    @functools.wraps(plan)
    def decorator(fn: Callable) -> Callable:
        signature = inspect.signature(fn)

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            bound = signature.bind(*args, **kwargs)
            groups = bound.arguments["kv_cache_groups"]
            layout = _drafter_layout(fn, groups)
            if layout is None:
                return fn(*args, **kwargs)
            bound.arguments["kv_cache_groups"] = without_draft_groups(groups)
            return plan(fn, bound, groups, _pool_bytes(layout))

        return wrapper

    return decorator


@_planned_with_draft
def kv_cache_config_with_draft(fn: Callable, bound: inspect.BoundArguments,
                               groups: Sequence[KVCacheGroupSpec], target_bytes: int):
    """For ``get_kv_cache_config_from_groups(vllm_config, kv_cache_groups, available_memory)``:
    the base plans the target for as many blocks as target and drafter fit together,
    then the drafter's tensors follow the target's."""
    num_blocks = bound.arguments["available_memory"] // (target_bytes + draft_bytes_per_block(groups))
    bound.arguments["available_memory"] = num_blocks * target_bytes
    config = fn(*bound.args, **bound.kwargs)
    target_size = target_bytes * config.num_blocks
    size = (target_bytes + draft_bytes_per_block(groups)) * config.num_blocks
    tensors = list(config.kv_cache_tensors)
    if tensor_form() == "layers":  # one shared allocation: it grows by the drafter's region
        tensors = [replace(t, size=size) if t.size == target_size else t for t in tensors]
    tensors += draft_kv_cache_tensors(groups, config.num_blocks, size, target_size)
    return replace(config, kv_cache_tensors=tensors, kv_cache_groups=groups)


@_planned_with_draft
def max_memory_with_draft(fn: Callable, bound: inspect.BoundArguments,
                          groups: Sequence[KVCacheGroupSpec], target_bytes: int):
    """For ``_max_memory_usage_bytes_from_groups(vllm_config, kv_cache_groups)``: the
    drafter's pages are added to the target's, at the pool's bytes per block."""
    target_pages = cdiv(fn(*bound.args, **bound.kwargs), target_bytes)
    pages = target_pages + draft_max_pages(bound.arguments["vllm_config"], groups)
    return pages * (target_bytes + draft_bytes_per_block(groups))
