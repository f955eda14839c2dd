"""The checkpoint modules vLLM 0.30.0 fuses into one kernel for Glm5Next, as one table.

A fused group is a parent module's shards (`model.layers.3.mlp.gate_proj` and `.up_proj`)
that vLLM loads into one parameter and runs as one GEMM. In NVFP4 each shard carries its own
per-tensor global scale, and vLLM keeps one per fused layer, so shards exported with
unequal globals are served off by their ratio. The table says which groups exist; the
checkpoint scan (recipekit/checkpoint_scan.py) judges them, and the vllm tier
(tests/vllm/test_fused_groups.py) fails when the pinned tree fuses otherwise.

Where the table comes from (vLLM 0.30.0, `vllm/models/glm5next/nvidia/`): Glm5Next defines
no `packed_modules_mapping`; what it fuses is the `stacked_params_mapping` of
`Glm5NextModel.load_weights` (model.py; `Glm5NextMTP.load_weights` in mtp.py fuses a subset)
and, for the routed experts, `fused_moe_make_expert_params_mapping(ckpt_gate_proj_name=
"gate_proj", ckpt_up_proj_name="up_proj")`, which loads both halves into `w13_`. vLLM 0.30.0
builds the KDA `in_proj_qkvbfg_a` and the indexer's `wk_weights_proj` in 16 bits
(quant_config=None); they are judged all the same, for a base that quantizes them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class FusedKind:
    key: str  # the report's JSON key
    label: str  # the report's words for it
    fused: str  # vLLM's fused parameter (w13) or module (gate_up_proj, ...)
    shards: tuple[str, ...]  # the checkpoint's module names, in vLLM's shard order
    parent: re.Pattern  # the parent module paths this kind covers (fullmatch)
    # vLLM builds the fused module only where this config.json key is not null (the MLA's
    # fused_qkv_a_proj exists only with a q_lora_rank); "": always
    needs_config: str = ""

    @property
    def routed_experts(self) -> bool:
        return self.fused == "w13"


_ANY = re.compile(r".+")

# The order is the report's, and the first kind whose shard and parent match a module takes
# it: routed experts and shared experts before the dense MLP, whose gate/up pair is any other.
KINDS = (
    FusedKind("experts", "routed experts gate/up", "w13", ("gate_proj", "up_proj"),
              re.compile(r".+\.experts\.[0-9]+")),
    FusedKind("shared_gate_up", "shared experts gate_up", "gate_up_proj",
              ("gate_proj", "up_proj"), re.compile(r".+\.shared_experts")),
    FusedKind("dense_gate_up", "dense MLP gate_up", "gate_up_proj", ("gate_proj", "up_proj"),
              _ANY),
    FusedKind("mla_qkv_a", "MLA fused_qkv_a", "fused_qkv_a_proj",
              ("q_a_proj", "kv_a_proj_with_mqa"), _ANY, needs_config="q_lora_rank"),
    FusedKind("indexer_wk", "indexer wk_weights", "wk_weights_proj", ("wk", "weights_proj"),
              _ANY),
    FusedKind("kda_in_proj", "KDA in_proj_qkvbfg_a", "in_proj_qkvbfg_a",
              ("q_proj", "k_proj", "v_proj", "b_proj", "f_a_proj", "g_a_proj"), _ANY),
)


def merged_linears() -> dict[str, tuple[str, ...]]:
    """{fused module: its shards} of the merged linears, as vLLM's stacked_params_mapping
    lists them (the routed experts are the fused MoE's, not a linear)."""
    return {kind.fused: kind.shards for kind in KINDS if not kind.routed_experts}


def kind_of(module: str, built: set[str] | None = None) -> tuple[FusedKind, str, str] | None:
    """(kind, parent, shard) of a checkpoint module that vLLM fuses with others, else None.
    BUILT: the kinds' keys whose fused module this model builds (default: all)."""
    parent, _, shard = module.rpartition(".")
    for kind in KINDS:
        if (shard in kind.shards and kind.parent.fullmatch(parent)
                and (built is None or kind.key in built)):
            return kind, parent, shard
    return None


def built_kinds(config: dict) -> set[str]:
    """The kinds whose fused module vLLM builds for a model of this config.json (a key it
    needs, null at the top or in text_config, leaves that kind's shards unfused)."""
    sections = [config]
    if isinstance(config.get("text_config"), dict):  # a multimodal wrapper's language model
        sections.append(config["text_config"])
    built = set()
    for kind in KINDS:
        if kind.needs_config and any(kind.needs_config in section
                                     and section[kind.needs_config] is None
                                     for section in sections):
            continue
        built.add(kind.key)
    return built
