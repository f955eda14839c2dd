"""Four tiny GLM-5.3-Flash-shaped checkpoints for the checkpoint scan, made at test time.

Module names and tensor layouts are the ones vLLM 0.30.0's Glm5Next loader and its ModelOpt
and compressed-tensors NVFP4 methods read (recipekit/checkpoint_scan.py names the code):
layer 0 dense, layers 1-2 MoE with four routed experts each (eight gate/up pairs), and
in two of them an MTP-like layer 3. Sizes are shrunk (hidden 32, expert width 16) so each
checkpoint is a few tens of KB. Every global scale is a power of two, so every ratio the
scan computes is exact.

- modelopt_unequal (LibertAIDAI-like): ModelOpt 0.45 W4A16_NVFP4 declared in
  hf_quant_config.json; dense MLP, attention, shared experts, router BF16; three of the
  eight experts have an up `weight_scale_2` other than the gate's: x2 (layer 1 expert 1),
  x1/4 (layer 2 expert 0, the largest, ratio 4) and x1/2 (layer 2 expert 3).
- nvidia_like: ModelOpt 0.47 NVFP4 (W4A4: input scales) in config.json; dense MLP NVFP4;
  gate and up scales equal everywhere; layer 3 (MTP-like) all BF16.
- compressed_tensors (RedHat-like): nvfp4-pack-quantized with `weight_global_scale`, the
  reciprocal of the decode scale; two experts differ: layer 1 expert 2 (global up = global
  gate / 4, so the up half decodes with 4x the gate's scale: up/gate 4, the largest) and
  layer 2 expert 1 (global up = 2 x global gate: up/gate 1/2); layer 3 (MTP-like) FP8.
- modelopt_merged: ModelOpt 0.47 W4A16_NVFP4 with every merged linear Glm5Next fuses in
  NVFP4 (recipekit/fused_groups.py): layer 0 MLA attention (q_a_proj + kv_a_proj_with_mqa,
  the indexer's wk + weights_proj) and a dense MLP whose up global is the gate's / 2;
  layers 1-2 KDA attention (q, k, v, b, f_a, g_a; layer 1's v_proj global is the others' / 4,
  the largest ratio), routed experts all equal, shared experts (layer 2's gate global is
  twice its up's); vLLM 0.30.0 itself builds the KDA and indexer projections in 16 bits,
  the scan judges them all the same. MERGED_UNEQUAL says which; `equal=True` makes every
  global the same, `drop` leaves tensors out and `scales` sets globals, for the scan's
  refusals.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

HIDDEN = 32
WIDTH = 16  # dense, expert and shared-expert intermediate size
EXPERTS = 4
GROUP = 16  # NVFP4 block
GATE_SCALE = 2.0 ** -10  # a ModelOpt decode scale; compressed-tensors stores 1 / it
UNEQUAL_UP = {(1, 1): 2.0, (2, 0): 0.25, (2, 3): 0.5}  # (layer, expert) -> up / gate
CT_UNEQUAL_UP = {(1, 2): 4.0, (2, 1): 0.5}  # (layer, expert) -> up / gate of the decode scales


def bf16(out: int, inputs: int) -> dict[str, torch.Tensor]:
    return {"weight": torch.zeros(out, inputs, dtype=torch.bfloat16)}


def modelopt_nvfp4(out: int, inputs: int, scale_2: float, w4a4: bool) -> dict[str, torch.Tensor]:
    tensors = {"weight": torch.zeros(out, inputs // 2, dtype=torch.uint8),
               "weight_scale": torch.ones(out, inputs // GROUP).to(torch.float8_e4m3fn),
               "weight_scale_2": torch.tensor(scale_2, dtype=torch.float32)}
    if w4a4:
        tensors["input_scale"] = torch.tensor(1.0, dtype=torch.float32)
    return tensors


def ct_nvfp4(out: int, inputs: int, decode_scale: float) -> dict[str, torch.Tensor]:
    return {"weight_packed": torch.zeros(out, inputs // 2, dtype=torch.uint8),
            "weight_scale": torch.ones(out, inputs // GROUP).to(torch.float8_e4m3fn),
            "weight_global_scale": torch.tensor([1.0 / decode_scale], dtype=torch.float32),
            "input_global_scale": torch.tensor([1.0], dtype=torch.float32)}


def fp8(out: int, inputs: int) -> dict[str, torch.Tensor]:
    return {"weight": torch.zeros(out, inputs).to(torch.float8_e4m3fn),
            "weight_scale": torch.ones(1, 1, dtype=torch.float32)}


def _add(tensors: dict, module: str, params: dict[str, torch.Tensor]) -> None:
    for name, tensor in params.items():
        tensors[f"{module}.{name}"] = tensor


def _mlp(tensors: dict, prefix: str, make) -> None:
    """gate_proj, up_proj, down_proj of one MLP; MAKE(out, inputs, half) gives a module's tensors."""
    _add(tensors, f"{prefix}.gate_proj", make(WIDTH, HIDDEN, "gate"))
    _add(tensors, f"{prefix}.up_proj", make(WIDTH, HIDDEN, "up"))
    _add(tensors, f"{prefix}.down_proj", make(HIDDEN, WIDTH, "down"))


def _layer(tensors: dict, layer: int, attention, dense, expert, shared) -> None:
    """One decoder layer: attention (o_proj), a norm, and a dense MLP or a MoE block."""
    prefix = f"model.layers.{layer}"
    _add(tensors, f"{prefix}.self_attn.o_proj", attention(HIDDEN, HIDDEN, "o"))
    _add(tensors, f"{prefix}.input_layernorm", {"weight": torch.ones(HIDDEN, dtype=torch.bfloat16)})
    if dense is not None:
        _mlp(tensors, f"{prefix}.mlp", dense)
        return
    _add(tensors, f"{prefix}.mlp.gate", {
        "weight": torch.zeros(EXPERTS, HIDDEN, dtype=torch.bfloat16),
        "e_score_correction_bias": torch.zeros(EXPERTS, dtype=torch.float32)})
    for number in range(EXPERTS):
        _mlp(tensors, f"{prefix}.mlp.experts.{number}",
             lambda out, inputs, half, number=number: expert(layer, number, out, inputs, half))
    _mlp(tensors, f"{prefix}.mlp.shared_experts", shared)


def _ends(tensors: dict) -> None:
    _add(tensors, "model.embed_tokens", bf16(64, HIDDEN))
    _add(tensors, "model.norm", {"weight": torch.ones(HIDDEN, dtype=torch.bfloat16)})
    _add(tensors, "lm_head", bf16(64, HIDDEN))


def _bf16(out, inputs, half):
    return bf16(out, inputs)


def _write(directory: Path, config: dict, tensors: dict, shards: int, index: bool,
           extra_files: dict[str, dict] | None = None) -> Path:
    """The tensors split over SHARDS files in name order (with an index when INDEX)."""
    directory.mkdir(parents=True)
    (directory / "config.json").write_text(json.dumps(config, indent=1))
    for name, content in (extra_files or {}).items():
        (directory / name).write_text(json.dumps(content, indent=1))
    names = sorted(tensors)
    weight_map = {}
    for number in range(shards):
        shard = f"model-{number + 1:05d}-of-{shards:05d}.safetensors"
        part = names[number::shards]
        save_file({name: tensors[name] for name in part}, str(directory / shard),
                  metadata={"format": "pt"})
        weight_map.update({name: shard for name in part})
    if index:
        (directory / "model.safetensors.index.json").write_text(
            json.dumps({"metadata": {}, "weight_map": weight_map}, indent=1))
    return directory


GLM_CONFIG = {"architectures": ["Glm5NextForCausalLM"], "hidden_size": HIDDEN,
              "moe_intermediate_size": WIDTH, "n_routed_experts": EXPERTS}


def modelopt_unequal(root: Path) -> Path:
    tensors: dict[str, torch.Tensor] = {}

    def expert(layer, number, out, inputs, half):
        scale = GATE_SCALE * (UNEQUAL_UP.get((layer, number), 1.0) if half == "up" else 1.0)
        return modelopt_nvfp4(out, inputs, scale, w4a4=False)

    _layer(tensors, 0, _bf16, _bf16, None, None)
    for layer in (1, 2):
        _layer(tensors, layer, _bf16, None, expert, _bf16)
    _ends(tensors)
    legacy = {"producer": {"name": "modelopt", "version": "0.45.0"},
              "quantization": {"quant_algo": "W4A16_NVFP4", "kv_cache_quant_algo": None,
                               "group_size": GROUP, "exclude_modules": ["lm_head"]}}
    return _write(root / "modelopt-unequal", GLM_CONFIG, tensors, shards=2, index=True,
                  extra_files={"hf_quant_config.json": legacy})


def nvidia_like(root: Path) -> Path:
    tensors: dict[str, torch.Tensor] = {}

    def nvfp4(out, inputs, half):
        return modelopt_nvfp4(out, inputs, GATE_SCALE, w4a4=True)

    def expert(layer, number, out, inputs, half):
        return nvfp4(out, inputs, half)

    def mtp_expert(layer, number, out, inputs, half):
        return bf16(out, inputs)

    _layer(tensors, 0, _bf16, nvfp4, None, None)
    for layer in (1, 2):
        _layer(tensors, layer, _bf16, None, expert, _bf16)
    _layer(tensors, 3, _bf16, None, mtp_expert, _bf16)
    _ends(tensors)
    config = {**GLM_CONFIG, "quantization_config": {
        "quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": GROUP,
        "producer": {"name": "modelopt", "version": "0.47.0"},
        "ignore": ["lm_head", "model.embed_tokens", "*.self_attn.*", "*.shared_experts.*",
                   "*.mlp.gate"]}}
    return _write(root / "nvidia-like", config, tensors, shards=3, index=False)


def compressed_tensors(root: Path) -> Path:
    tensors: dict[str, torch.Tensor] = {}

    def expert(layer, number, out, inputs, half):
        scale = GATE_SCALE * (CT_UNEQUAL_UP.get((layer, number), 1.0) if half == "up" else 1.0)
        return ct_nvfp4(out, inputs, scale)

    def mtp_fp8(out, inputs, half):
        return fp8(out, inputs)

    def mtp_expert(layer, number, out, inputs, half):
        return fp8(out, inputs)

    _layer(tensors, 0, _bf16, _bf16, None, None)
    for layer in (1, 2):
        _layer(tensors, layer, _bf16, None, expert, _bf16)
    _layer(tensors, 3, mtp_fp8, None, mtp_expert, mtp_fp8)
    _ends(tensors)
    nvfp4_args = {"num_bits": 4, "type": "float", "strategy": "tensor_group", "group_size": GROUP,
                  "symmetric": True, "dynamic": False}
    config = {**GLM_CONFIG, "quantization_config": {
        "quant_method": "compressed-tensors", "format": "nvfp4-pack-quantized",
        "version": "0.12.2",
        "config_groups": {"group_0": {"targets": ["Linear"], "weights": nvfp4_args,
                                      "input_activations": {**nvfp4_args, "dynamic": "local"}}},
        "ignore": ["lm_head", "re:.*self_attn.*", "re:.*shared_experts.*", "re:.*mlp.gate$"]}}
    return _write(root / "compressed-tensors", config, tensors, shards=2, index=True)


KDA_SHARDS = ("q_proj", "k_proj", "v_proj", "b_proj", "f_a_proj", "g_a_proj")
# tensor -> its global over GATE_SCALE in modelopt_merged; every other global is GATE_SCALE
MERGED_UNEQUAL = {"model.layers.0.mlp.up_proj.weight_scale_2": 0.5,
                  "model.layers.1.self_attn.v_proj.weight_scale_2": 0.25,
                  "model.layers.2.mlp.shared_experts.gate_proj.weight_scale_2": 2.0}


def modelopt_merged(root: Path, name: str = "modelopt-merged", equal: bool = False,
                    drop: tuple[str, ...] = (), scales: dict[str, object] | None = None,
                    config: dict | None = None) -> Path:
    tensors: dict[str, torch.Tensor] = {}

    def nvfp4(out, inputs, half=None):
        return modelopt_nvfp4(out, inputs, GATE_SCALE, w4a4=False)

    def expert(layer, number, out, inputs, half):
        return nvfp4(out, inputs)

    _add(tensors, "model.layers.0.self_attn.q_a_proj", nvfp4(WIDTH, HIDDEN))
    _add(tensors, "model.layers.0.self_attn.kv_a_proj_with_mqa", nvfp4(WIDTH, HIDDEN))
    _add(tensors, "model.layers.0.self_attn.q_b_proj", nvfp4(HIDDEN, WIDTH))
    _add(tensors, "model.layers.0.self_attn.kv_b_proj", nvfp4(HIDDEN, WIDTH))
    _add(tensors, "model.layers.0.self_attn.indexer.wk", nvfp4(WIDTH, HIDDEN))
    _add(tensors, "model.layers.0.self_attn.indexer.weights_proj", nvfp4(WIDTH, HIDDEN))
    _layer(tensors, 0, nvfp4, nvfp4, None, None)
    for layer in (1, 2):
        for shard in KDA_SHARDS:
            _add(tensors, f"model.layers.{layer}.self_attn.{shard}", nvfp4(WIDTH, HIDDEN))
        _layer(tensors, layer, _bf16, None, expert, nvfp4)
    _ends(tensors)
    for tensor, over_gate in ({} if equal else MERGED_UNEQUAL).items():
        tensors[tensor] = torch.tensor(GATE_SCALE * over_gate, dtype=torch.float32)
    for tensor, value in (scales or {}).items():
        tensors[tensor] = value if isinstance(value, torch.Tensor) else torch.tensor(
            value, dtype=torch.float32)
    for tensor in drop:
        del tensors[tensor]
    quant = {"quant_method": "modelopt", "quant_algo": "W4A16_NVFP4", "group_size": GROUP,
             "producer": {"name": "modelopt", "version": "0.47.0"},
             "ignore": ["lm_head", "model.embed_tokens", "*.mlp.gate"]}
    return _write(root / name, {**GLM_CONFIG, "q_lora_rank": WIDTH, **(config or {}),
                                "quantization_config": quant}, tensors, shards=2, index=True)


MAKERS = {"modelopt-unequal": modelopt_unequal, "nvidia-like": nvidia_like,
          "compressed-tensors": compressed_tensors, "modelopt-merged": modelopt_merged}
