"""A tiny Glm5Next checkpoint, made at test time from a seed (here on CPU, or on the GPU
machine: torch and safetensors only, so nothing is carried), for the GPU tier's part d.

Its config keeps every layer kind GLM-5.3-Flash has and shrinks only the counts:
- layer 0 KDA with a dense MLP; layer 1 MLA with the sparse indexer and its kpool ring, MoE;
  layer 2 KDA, MoE; layer 3 MLA, MoE; mHC with 4 residual streams throughout;
- the per-head sizes the kernels fix stay as the checkpoint has them: the indexer's 128-dim
  keys (FP8 with UE8M0 scales, 16 heads padded to 32 by vLLM), MLA without RoPE on a
  512-dim latent, KDA's 128-dim heads;
- the routed experts are ModelOpt NVFP4 (W4A16: fp4 values, E4M3 scales per 16, a global per
  half), everything else bf16 and left out of quantization by the config's `ignore`.

Two variants (`VARIANTS`): `equal` writes one global scale for each expert's gate and up
halves (as a fused-aware export does); `unequal` quantizes each half on its own with the up
half's amax set to PLANTED_RATIOS times the gate's, so the globals differ by those ratios (the
case v8_moe_scales fixes: stock vLLM folds the up half with the gate's global).

`checkpoint_tensors` gives the checkpoint's names (the ones Glm5Next's load_weights maps:
q_a_proj and kv_a_proj_with_mqa, wk and weights_proj, KDA's six input projections, the
experts per expert); tests/vllm/test_glm5next_tiny.py loads them into vLLM 0.30.0's own
Glm5NextForCausalLM on CPU, every parameter of it filled.

    python3 tests/gpu/glm5next_models.py OUT_DIR equal|unequal|drafter [TOKENIZER_DIR]
"""

from __future__ import annotations

import functools
import json
import sys
from pathlib import Path

import torch

REPO_ROOT = Path(__file__).resolve().parents[2]
if str(REPO_ROOT) not in sys.path:  # run as a script on the GPU machine
    sys.path.insert(0, str(REPO_ROOT))

VARIANTS = ("equal", "unequal")
SEED = 38
VOCAB, HIDDEN = 640, 256  # the engine tier's tokenizer (tests/engine/tiny_models.py)
EXPERTS, TOPK, MOE_WIDTH = 8, 2, 256
GROUP = 16  # NVFP4's block
E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
E4M3_MAX = 448.0
# up global / gate global per expert in the `unequal` variant: equal, a few percent, the field's
# range both ways (tests/vllm/probes/moe_global_scales.py plants the same kinds)
PLANTED_RATIOS = (1.0, 1.01, 0.99, 1.3, 2.0, 0.5, 4.0, 0.25)
LAYER_TYPES = ("linear_attention", "deepseek_sparse_attention", "linear_attention",
               "deepseek_sparse_attention")
MLP_TYPES = ("dense", "sparse", "sparse", "sparse")
KDA_HEADS, KDA_HEAD_DIM = 4, 128
MLA_HEADS, Q_LORA, KV_LORA, NOPE_DIM, V_DIM = 16, 256, 512, 256, 256
INDEX_HEADS, INDEX_DIM, INDEX_TOPK, INDEX_KPOOL = 16, 128, 2048, 4
STREAMS = 4
# output projections scaled so each layer moves the residual stream by a fraction of itself
OUT_GAIN = 0.25


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def config(variant: str, pad_id: int = 0, eos_ids: tuple[int, ...] = (1,)) -> dict:
    if variant not in VARIANTS:
        raise ValueError(f"variant {variant!r}: use one of {', '.join(VARIANTS)}")
    return {
        "architectures": ["Glm5NextForCausalLM"], "model_type": "glm5_next_text",
        "made_by": "tests/gpu/glm5next_models.py", "variant": variant, "seed": SEED,
        "vocab_size": VOCAB, "hidden_size": HIDDEN, "intermediate_size": 2 * HIDDEN,
        "num_hidden_layers": len(LAYER_TYPES), "layer_types": list(LAYER_TYPES),
        "mlp_layer_types": list(MLP_TYPES), "pad_token_id": pad_id, "eos_token_id": list(eos_ids),
        "bos_token_id": None, "torch_dtype": "bfloat16", "max_position_embeddings": 16384,
        "num_attention_heads": MLA_HEADS, "num_key_value_heads": MLA_HEADS,
        "q_lora_rank": Q_LORA, "kv_lora_rank": KV_LORA, "qk_nope_head_dim": NOPE_DIM,
        "qk_rope_head_dim": 0, "v_head_dim": V_DIM, "mla_use_nope": True,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
        "linear_attn_config": {"head_dim": KDA_HEAD_DIM, "num_heads": KDA_HEADS,
                               "short_conv_kernel_size": 4, "gate_lower_bound": -5.0},
        "n_routed_experts": EXPERTS, "num_experts_per_tok": TOPK, "n_shared_experts": 1,
        "moe_intermediate_size": MOE_WIDTH, "scoring_func": "sigmoid", "n_group": 1,
        "topk_group": 1, "routed_scaling_factor": 2.5, "norm_topk_prob": True,
        "index_head_dim": INDEX_DIM, "index_topk": INDEX_TOPK, "index_n_heads": INDEX_HEADS,
        "index_kpool": INDEX_KPOOL, "hc_mult": STREAMS, "num_nextn_predict_layers": 0,
        "quantization_config": {
            "quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": GROUP,
            "producer": {"name": "modelopt", "version": "0.47.0"},
            "ignore": ["lm_head", "model.embed_tokens", "*.self_attn.*", "*.shared_experts.*",
                       "*.mlp.gate", "model.layers.0.mlp.*"]},
    }


def nvfp4(weight: torch.Tensor, global_scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(packed uint8 [rows, cols/2] low nibble first, E4M3 block scales [rows, cols/16]) of a
    float64 weight under GLOBAL_SCALE, ModelOpt's way: block scale = E4M3(amax / 6 / global),
    values rounded to the nearest e2m1 of weight / (block scale x global)."""
    blocks = weight.reshape(weight.shape[0], -1, GROUP)
    scales = (blocks.abs().amax(-1) / 6.0 / global_scale).clamp(max=E4M3_MAX)
    scales = scales.to(torch.float8_e4m3fn)
    step = scales.double().unsqueeze(-1) * global_scale
    scaled = torch.where(step > 0, blocks / step.clamp_min(1e-300), torch.zeros_like(blocks))
    # the nearest e2m1 code, a tie to the smaller one: the midpoints between the codes
    midpoints = torch.tensor(E2M1, dtype=torch.float64)
    index = torch.bucketize(scaled.abs(), (midpoints[1:] + midpoints[:-1]) / 2)
    nibbles = (index | ((scaled < 0).long() << 3)).reshape(weight.shape[0], -1)
    return (nibbles[:, 0::2] | (nibbles[:, 1::2] << 4)).to(torch.uint8), scales


def nvfp4_dequantized(packed: torch.Tensor, scales: torch.Tensor,
                      global_scale: float) -> torch.Tensor:
    """float64 weight the checkpoint means: e2m1 x block scale x this half's own global."""
    grid = torch.tensor(E2M1, dtype=torch.float64)
    nibbles = torch.stack([packed & 0xF, packed >> 4], -1).flatten(-2).long()
    values = grid[nibbles & 7] * (1 - 2 * (nibbles >> 3)).double()
    return values * scales.double().repeat_interleave(GROUP, -1) * global_scale


def _expert_halves(generator, ratio: float, shared_global: bool):
    gate = torch.randn(MOE_WIDTH, HIDDEN, generator=generator, dtype=torch.float64) * 0.05
    up = torch.randn(MOE_WIDTH, HIDDEN, generator=generator, dtype=torch.float64)
    up *= ratio * gate.abs().max() / up.abs().max()  # the globals' ratio is the planted one
    globals_ = [w.abs().max().item() / (6.0 * E4M3_MAX) for w in (gate, up)]
    if shared_global:
        globals_ = [max(globals_)] * 2
    return (gate, globals_[0]), (up, globals_[1])


@functools.cache  # made once a process: a caller must copy before changing it
def checkpoint_tensors(variant: str, seed: int = SEED) -> dict[str, torch.Tensor]:
    """Every tensor of the tiny checkpoint by its checkpoint name (bf16, or ModelOpt NVFP4
    for the routed experts)."""
    cfg = config(variant)
    generator = torch.Generator().manual_seed(seed + VARIANTS.index(variant))
    out: dict[str, torch.Tensor] = {}

    def dense(name, rows, cols, gain=1.0):
        w = torch.randn(rows, cols, generator=generator) * (gain / cols ** 0.5)
        out[name] = w.to(torch.bfloat16)

    def ones(name, size):
        out[name] = torch.ones(size, dtype=torch.bfloat16)

    def small(name, *shape, dtype=torch.float32, gain=0.02):
        out[name] = (torch.randn(*shape, generator=generator) * gain).to(dtype)

    out["model.embed_tokens.weight"] = torch.randn(VOCAB, HIDDEN, generator=generator).to(
        torch.bfloat16)
    dense("lm_head.weight", VOCAB, HIDDEN, gain=4.0)
    ones("model.norm.weight", HIDDEN)
    ratios = PLANTED_RATIOS if variant == "unequal" else (1.0,) * EXPERTS
    mix = (2 + STREAMS) * STREAMS  # pre, post and the streams' mixing matrix
    for layer, (kind, mlp) in enumerate(zip(LAYER_TYPES, MLP_TYPES)):
        p = f"model.layers.{layer}"
        for site in ("attn", "ffn"):
            small(f"{p}.hc_{site}_fn", mix, STREAMS * HIDDEN)
            out[f"{p}.hc_{site}_base"] = torch.zeros(mix)
            out[f"{p}.hc_{site}_scale"] = torch.ones(3)
        ones(f"{p}.input_layernorm.weight", HIDDEN)
        ones(f"{p}.post_attention_layernorm.weight", HIDDEN)
        a = f"{p}.self_attn"
        if kind == "linear_attention":
            width = KDA_HEADS * KDA_HEAD_DIM
            for name, rows in (("q_proj", width), ("k_proj", width), ("v_proj", width),
                               ("b_proj", KDA_HEADS), ("f_a_proj", KDA_HEAD_DIM),
                               ("g_a_proj", KDA_HEAD_DIM)):
                dense(f"{a}.{name}.weight", rows, HIDDEN)
            dense(f"{a}.f_b_proj.weight", width, KDA_HEAD_DIM)
            dense(f"{a}.g_b_proj.weight", width, KDA_HEAD_DIM)
            for name in ("q_conv1d", "k_conv1d", "v_conv1d"):
                small(f"{a}.{name}.weight", width, 1, 4, dtype=torch.bfloat16, gain=0.5)
            out[f"{a}.dt_bias"] = torch.zeros(width)
            out[f"{a}.A_log"] = torch.zeros(1, 1, KDA_HEADS, 1)
            ones(f"{a}.o_norm.weight", KDA_HEAD_DIM)
            dense(f"{a}.o_proj.weight", HIDDEN, width, gain=OUT_GAIN)
        else:
            dense(f"{a}.q_a_proj.weight", Q_LORA, HIDDEN)
            dense(f"{a}.kv_a_proj_with_mqa.weight", KV_LORA, HIDDEN)
            ones(f"{a}.q_a_layernorm.weight", Q_LORA)
            ones(f"{a}.kv_a_layernorm.weight", KV_LORA)
            dense(f"{a}.q_b_proj.weight", MLA_HEADS * NOPE_DIM, Q_LORA)
            dense(f"{a}.kv_b_proj.weight", MLA_HEADS * (NOPE_DIM + V_DIM), KV_LORA)
            dense(f"{a}.o_proj.weight", HIDDEN, MLA_HEADS * V_DIM, gain=OUT_GAIN)
            i = f"{a}.indexer"
            dense(f"{i}.wq_b.weight", INDEX_HEADS * INDEX_DIM, Q_LORA)
            dense(f"{i}.wk.weight", INDEX_DIM, HIDDEN)
            dense(f"{i}.weights_proj.weight", INDEX_HEADS, HIDDEN)
            ones(f"{i}.k_norm.weight", INDEX_DIM)
            out[f"{i}.k_norm.bias"] = torch.zeros(INDEX_DIM, dtype=torch.bfloat16)
            small(f"{i}.index_kpool_compress_ape", INDEX_KPOOL, INDEX_DIM)
            small(f"{i}.index_kpool_compress_gate", INDEX_DIM, HIDDEN, dtype=torch.bfloat16)
        m = f"{p}.mlp"
        if mlp == "dense":
            dense(f"{m}.gate_proj.weight", cfg["intermediate_size"], HIDDEN)
            dense(f"{m}.up_proj.weight", cfg["intermediate_size"], HIDDEN)
            dense(f"{m}.down_proj.weight", HIDDEN, cfg["intermediate_size"], gain=OUT_GAIN)
            continue
        dense(f"{m}.gate.weight", EXPERTS, HIDDEN)
        dense(f"{m}.shared_experts.gate_proj.weight", MOE_WIDTH, HIDDEN)
        dense(f"{m}.shared_experts.up_proj.weight", MOE_WIDTH, HIDDEN)
        dense(f"{m}.shared_experts.down_proj.weight", HIDDEN, MOE_WIDTH, gain=OUT_GAIN)
        for expert, ratio in enumerate(ratios):
            e = f"{m}.experts.{expert}"
            halves = _expert_halves(generator, ratio, shared_global=variant == "equal")
            down = torch.randn(HIDDEN, MOE_WIDTH, generator=generator, dtype=torch.float64)
            down *= OUT_GAIN / MOE_WIDTH ** 0.5
            halves += ((down, down.abs().max().item() / (6.0 * E4M3_MAX)),)
            for name, (weight, global_scale) in zip(("gate_proj", "up_proj", "down_proj"),
                                                    halves):
                packed, scales = nvfp4(weight, global_scale)
                out[f"{e}.{name}.weight"] = packed
                out[f"{e}.{name}.weight_scale"] = scales
                out[f"{e}.{name}.weight_scale_2"] = torch.tensor(global_scale,
                                                                 dtype=torch.float32)
                out[f"{e}.{name}.input_scale"] = torch.tensor(1.0, dtype=torch.float32)
    return out


def intended_expert(tensors: dict[str, torch.Tensor], layer: int, expert: int) -> dict:
    """float64 gate, up and down of one expert as the checkpoint means them (each half its
    own global): the weights check 4's float64 reference computes with."""
    e = f"model.layers.{layer}.mlp.experts.{expert}"
    return {name: nvfp4_dequantized(tensors[f"{e}.{name}.weight"],
                                    tensors[f"{e}.{name}.weight_scale"],
                                    tensors[f"{e}.{name}.weight_scale_2"].item())
            for name in ("gate_proj", "up_proj", "down_proj")}


def moe_float64(x: torch.Tensor, tensors: dict[str, torch.Tensor], layer: int) -> torch.Tensor:
    """The routed experts of LAYER in float64 on the checkpoint's intended weights: sigmoid
    scores, top-k renormalized, times routed_scaling_factor, SiLU(gate) x up, down."""
    cfg = config("equal")
    x = x.double()
    scores = torch.sigmoid(x @ tensors[f"model.layers.{layer}.mlp.gate.weight"].double().T)
    weights, ids = scores.topk(TOPK, -1)
    weights = weights / weights.sum(-1, keepdim=True) * cfg["routed_scaling_factor"]
    out = torch.zeros_like(x)
    for expert in ids.unique().tolist():
        w = intended_expert(tensors, layer, expert)
        rows, slot = (ids == expert).nonzero(as_tuple=True)
        h = torch.nn.functional.silu(x[rows] @ w["gate_proj"].T) * (x[rows] @ w["up_proj"].T)
        out.index_add_(0, rows, (h @ w["down_proj"].T) * weights[rows, slot, None])
    return out


DRAFT_K = 7  # the recipe's k: 8 block positions, 8 conv taps
DRAFT_TAPS = (1, 3)  # the target's MLA layers: aux hidden states from two of its layers


def drafter_tensors(seed: int = SEED, mask_id: int = 0) -> dict[str, torch.Tensor]:
    """The engine tier's DFlash2 drafter (tests/engine/dflash2_models.py, built for k = 3)
    widened to k = DRAFT_K: its convolutions' extra taps are zero, its fc reads the
    len(DRAFT_TAPS) tapped layers of this target (zero weights, so context keys score 0 as
    there), and its next-token table is a seeded permutation. Nothing ties that table to
    this target's greedy tokens, so acceptance is measured, not designed (docs/gpu-tier.md)."""
    from tests.engine import dflash2_models as engine

    generator = torch.Generator().manual_seed(seed)
    others = [t for t in torch.randperm(VOCAB, generator=generator).tolist() if t != mask_id]
    table = others[:mask_id] + [others[0]] + others[mask_id:]  # never the mask token itself
    made = engine.drafter_tensors(table, mask_id=mask_id, target_hidden=HIDDEN,
                                  code=(0.0,) * engine.K)
    out = {name: torch.from_numpy(array) for name, array in made.items()}
    out["fc.weight"] = torch.zeros(engine.H, HIDDEN * len(DRAFT_TAPS))
    groups = engine.H // engine.GROUP
    for conv in ("attention_conv", "mlp_conv"):
        name = f"layers.0.{conv}"
        base = torch.zeros(2, DRAFT_K + 1, engine.H)
        base[:, :engine.K + 1] = out[f"{name}.base_kernel"]
        out[f"{name}.base_kernel"] = base
        rows = out[f"{name}.kernel_projection.weight"].reshape(2, engine.K + 1, groups, -1)
        wide = torch.zeros(2, DRAFT_K + 1, groups, rows.shape[-1])
        wide[:, :engine.K + 1] = rows
        out[f"{name}.kernel_projection.weight"] = wide.reshape(-1, rows.shape[-1])
    return {name: tensor.to(torch.bfloat16) for name, tensor in out.items()}


def drafter_config(mask_id: int = 0) -> dict:
    from tests.engine import dflash2_models as engine

    target = config("equal")
    made = engine.drafter_config(target, mask_id, is_causal=False)
    made["dflash_config"].update(target_layer_ids=list(DRAFT_TAPS), block_size=DRAFT_K + 1,
                                 conv_kernel_size=DRAFT_K + 1)
    made.update(torch_dtype="bfloat16", dtype="bfloat16", made_by="tests/gpu/glm5next_models.py")
    return made


def _tokenizer(out: Path, tokenizer: Path | None) -> tuple[int, tuple[int, ...]]:
    """Copy TOKENIZER's files (a model directory with them) into OUT: its pad and eos ids."""
    if tokenizer is None:
        return 0, (1,)
    import shutil

    for name in TOKENIZER_FILES:
        shutil.copyfile(tokenizer / name, out / name)
    source = json.loads((tokenizer / "config.json").read_text())
    eos = source["eos_token_id"]
    return source["pad_token_id"], tuple(eos if isinstance(eos, list) else [eos])


def write_drafter(out: Path, seed: int = SEED, tokenizer: Path | None = None) -> Path:
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    pad_id, _ = _tokenizer(out, tokenizer)
    (out / "config.json").write_text(json.dumps(drafter_config(pad_id), indent=1))
    save_file({k: v.contiguous() for k, v in drafter_tensors(seed, pad_id).items()},
              str(out / "model.safetensors"), metadata={"format": "pt"})
    return out


def write(out: Path, variant: str, seed: int = SEED, tokenizer: Path | None = None) -> Path:
    """The checkpoint in OUT; with TOKENIZER (a model directory), its tokenizer files and
    pad and eos ids too."""
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    pad_id, eos_ids = _tokenizer(out, tokenizer)
    (out / "config.json").write_text(json.dumps(config(variant, pad_id, eos_ids), indent=1))
    save_file({k: v.contiguous() for k, v in checkpoint_tensors(variant, seed).items()},
              str(out / "model.safetensors"), metadata={"format": "pt"})
    return out


if __name__ == "__main__":
    if len(sys.argv) not in (3, 4) or sys.argv[2] not in (*VARIANTS, "drafter"):
        sys.exit("usage: glm5next_models.py OUT_DIR equal|unequal|drafter [TOKENIZER_DIR]")
    where, kind = Path(sys.argv[1]), sys.argv[2]
    source = Path(sys.argv[3]) if len(sys.argv) == 4 else None
    print(write_drafter(where, tokenizer=source) if kind == "drafter" else
          write(where, kind, tokenizer=source))
