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

Two more (`TOKENWISE`) are built so that part d's greedy tokens are known by design
(`tokenwise_design`): every attention output projection is zero, so each position's output is
a function of its own token alone (attention still computes, its kernels run, and a NaN it
made would still reach the logits). A float64 forward of that function for every token of the
vocabulary sets the lm_head so that token t is followed by `next_token[t]`, a table whose cycle
through the answers' path avoids near-ties of the router, and the DFlash2 drafter built from
the same table (`designed_drafter_tensors`) drafts right at positions 1 to DESIGN_RIGHT and
wrong after. `tokenwise` writes each expert's up half with its own global (TWIN_RATIOS times the
gate's, every ratio a ratio of E4M3 values) on power-of-two block scales; `twin` writes the same
intended weights with one global per expert, its up block scales multiplied by the ratio, which
E4M3 holds exactly. At FLIP_AT on the path the head also holds the hidden state stock vLLM
computes there (up read with the gate's global), so that stock's greedy choice differs by
design.

`checkpoint_tensors` gives the checkpoint's names (the ones Glm5Next's load_weights maps:
q_a_proj and kv_a_proj_with_mqa, wk and weights_proj, KDA's six input projections, the
experts per expert); tests/vllm/test_glm5next_tiny.py loads them into vLLM 0.30.0's own
Glm5NextForCausalLM on CPU, every parameter of it filled.

    python3 tests/gpu/glm5next_models.py OUT_DIR VARIANT|drafter [TOKENIZER_DIR]

(VARIANT: equal, unequal, tokenwise or twin.)
"""

from __future__ import annotations

import functools
import json
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

REPO_ROOT = Path(__file__).resolve().parents[2]
if str(REPO_ROOT) not in sys.path:  # run as a script on the GPU machine
    sys.path.insert(0, str(REPO_ROOT))

VARIANTS = ("equal", "unequal")  # random weights, attention alive (the "live" target)
TOKENWISE = ("tokenwise", "twin")  # attention outputs zero: the next token known by design
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
    if variant not in VARIANTS + TOKENWISE:
        raise ValueError(f"variant {variant!r}: use one of {', '.join(VARIANTS + TOKENWISE)}")
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
        "rms_norm_eps": RMS_EPS, "hc_eps": HC_EPS, "mhc_post_mult_value": HC_POST_MULT,
        "mhc_sinkhorn_iterations": HC_SINKHORN,
        "quantization_config": {
            "quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": GROUP,
            "producer": {"name": "modelopt", "version": "0.47.0"},
            "ignore": ["lm_head", "model.embed_tokens", "*.self_attn.*", "*.shared_experts.*",
                       "*.mlp.gate", "model.layers.0.mlp.*"]},
    }


def nvfp4(weight: torch.Tensor, global_scale: float,
          scales: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(packed uint8 [rows, cols/2] low nibble first, E4M3 block scales [rows, cols/16]) of a
    float64 weight under GLOBAL_SCALE, ModelOpt's way: block scale = E4M3(amax / 6 / global)
    unless SCALES (E4M3) are given, values rounded to the nearest e2m1 of weight / (block
    scale x global)."""
    blocks = weight.reshape(weight.shape[0], -1, GROUP)
    if scales is None:
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


@dataclass(frozen=True)
class Gains:
    """How strongly each part writes into the residual streams (a dense weight's rows are
    drawn N(0, 1) times gain / sqrt(its input width))."""

    embed: float = 1.0
    attention_out: float = OUT_GAIN
    mlp_out: float = OUT_GAIN
    shared_out: float = OUT_GAIN


LIVE_GAINS = Gains()


def _live_experts(variant: str):
    ratios = PLANTED_RATIOS if variant == "unequal" else (1.0,) * EXPERTS

    def draw(generator, expert: int) -> dict[str, tuple[torch.Tensor, torch.Tensor, float]]:
        halves = _expert_halves(generator, ratios[expert], shared_global=variant == "equal")
        down = torch.randn(HIDDEN, MOE_WIDTH, generator=generator, dtype=torch.float64)
        down *= OUT_GAIN / MOE_WIDTH ** 0.5
        halves += ((down, down.abs().max().item() / (6.0 * E4M3_MAX)),)
        return {name: (*nvfp4(weight, global_scale), global_scale)
                for name, (weight, global_scale) in zip(("gate_proj", "up_proj", "down_proj"),
                                                        halves)}

    return draw


@functools.cache  # made once a process: a caller must copy before changing it
def checkpoint_tensors(variant: str, seed: int = SEED) -> dict[str, torch.Tensor]:
    """Every tensor of the live tiny checkpoint (VARIANTS) by its checkpoint name (bf16, or
    ModelOpt NVFP4 for the routed experts)."""
    if variant not in VARIANTS:
        raise ValueError(f"variant {variant!r}: the live checkpoints are {', '.join(VARIANTS)}")
    generator = torch.Generator().manual_seed(seed + VARIANTS.index(variant))
    return _draw(generator, LIVE_GAINS, _live_experts(variant))


def _draw(generator, gains: Gains, experts) -> dict[str, torch.Tensor]:
    """The checkpoint's tensors drawn from GENERATOR in one fixed order; EXPERTS(generator,
    index) gives one routed expert's (packed, block scales, global) per projection."""
    cfg = config("equal")
    out: dict[str, torch.Tensor] = {}

    def dense(name, rows, cols, gain=1.0):
        w = torch.randn(rows, cols, generator=generator) * (gain / cols ** 0.5)
        out[name] = w.to(torch.bfloat16)

    def ones(name, size):
        out[name] = torch.ones(size, dtype=torch.bfloat16)

    def small(name, *shape, dtype=torch.float32, gain=0.02):
        out[name] = (torch.randn(*shape, generator=generator) * gain).to(dtype)

    out["model.embed_tokens.weight"] = (torch.randn(VOCAB, HIDDEN, generator=generator)
                                        * gains.embed).to(torch.bfloat16)
    dense("lm_head.weight", VOCAB, HIDDEN, gain=4.0)
    ones("model.norm.weight", HIDDEN)
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
            dense(f"{a}.o_proj.weight", HIDDEN, width, gain=gains.attention_out)
        else:
            dense(f"{a}.q_a_proj.weight", Q_LORA, HIDDEN)
            dense(f"{a}.kv_a_proj_with_mqa.weight", KV_LORA, HIDDEN)
            ones(f"{a}.q_a_layernorm.weight", Q_LORA)
            ones(f"{a}.kv_a_layernorm.weight", KV_LORA)
            dense(f"{a}.q_b_proj.weight", MLA_HEADS * NOPE_DIM, Q_LORA)
            dense(f"{a}.kv_b_proj.weight", MLA_HEADS * (NOPE_DIM + V_DIM), KV_LORA)
            dense(f"{a}.o_proj.weight", HIDDEN, MLA_HEADS * V_DIM, gain=gains.attention_out)
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
            dense(f"{m}.down_proj.weight", HIDDEN, cfg["intermediate_size"], gain=gains.mlp_out)
            continue
        dense(f"{m}.gate.weight", EXPERTS, HIDDEN)
        dense(f"{m}.shared_experts.gate_proj.weight", MOE_WIDTH, HIDDEN)
        dense(f"{m}.shared_experts.up_proj.weight", MOE_WIDTH, HIDDEN)
        dense(f"{m}.shared_experts.down_proj.weight", HIDDEN, MOE_WIDTH, gain=gains.shared_out)
        for expert in range(EXPERTS):
            e = f"{m}.experts.{expert}"
            for name, (packed, scales, global_scale) in experts(generator, expert).items():
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
    x = x.double()
    weights, ids, _ = route(x, tensors[f"model.layers.{layer}.mlp.gate.weight"].double())
    out = torch.zeros_like(x)
    for expert in ids.unique().tolist():
        w = intended_expert(tensors, layer, expert)
        rows, slot = (ids == expert).nonzero(as_tuple=True)
        h = torch.nn.functional.silu(x[rows] @ w["gate_proj"].T) * (x[rows] @ w["up_proj"].T)
        out.index_add_(0, rows, (h @ w["down_proj"].T) * weights[rows, slot, None])
    return out


# ----------------------------------------------------------------------------- tokenwise

TOKENWISE_SEED = 47
# up global / gate global per expert: each a ratio of E4M3 values (one, 9/8, 7/8, 5/4 and
# powers of two), so a power-of-two block scale times it is again an E4M3 value and the
# equal-scale twin holds the same weights exactly
TWIN_RATIOS = (1.0, 1.125, 0.875, 1.25, 2.0, 0.5, 4.0, 0.25)
TOKENWISE_GAINS = Gains(embed=0.3, attention_out=0.0, mlp_out=0.5, shared_out=0.1)
EXPERT_GAIN = 4.0  # the routed experts carry most of what a layer writes: the fix shows
HEAD_GAIN = 20.0  # a token's own logit: its head row is HEAD_GAIN / HIDDEN x its hidden state
ROUTING_GAP = 0.02  # a path token's 2nd and 3rd expert scores differ by this at every MoE
MARGIN_NATS = 4.0  # every designed greedy choice wins by this in float64; bf16 moves ~0.2
PATH_TOKENS = 96  # the designed cycle that part d's answers walk, the prompt's last first
FLIP_AT = 6  # the answer where stock vLLM's reading (up with the gate's global) differs
FLIP_COS = 0.7  # the flip token's stock hidden state is at most this close to its own
DESIGN_RIGHT = 5  # the designed drafter: right at positions 1..DESIGN_RIGHT, wrong after
RMS_EPS, HC_EPS, HC_POST_MULT, HC_SINKHORN = 1e-5, 1e-6, 2.0, 20  # written into config()


def _pow2_ceil(x: torch.Tensor) -> torch.Tensor:
    return torch.exp2(torch.ceil(torch.log2(x)))


def _tokenwise_experts(twin: bool):
    def draw(generator, expert: int) -> dict[str, tuple[torch.Tensor, torch.Tensor, float]]:
        ratio = TWIN_RATIOS[expert]
        gate = torch.randn(MOE_WIDTH, HIDDEN, generator=generator, dtype=torch.float64)
        up = torch.randn(MOE_WIDTH, HIDDEN, generator=generator, dtype=torch.float64)
        gate, up = gate / HIDDEN ** 0.5, up / HIDDEN ** 0.5
        down = torch.randn(HIDDEN, MOE_WIDTH, generator=generator, dtype=torch.float64)
        down *= EXPERT_GAIN / MOE_WIDTH ** 0.5
        # power-of-two globals with room for ratio 4 either way on the block scales
        gate_global = _pow2_ceil(gate.abs().max() * 8 / (6 * E4M3_MAX)).item()
        up_global = gate_global * ratio  # exact: ratio has three significant bits
        blocks = up.reshape(MOE_WIDTH, -1, GROUP).abs().amax(-1)
        up_scales = _pow2_ceil(blocks / (6 * up_global)).to(torch.float8_e4m3fn)
        packed, scales = nvfp4(up, up_global, scales=up_scales)
        if twin:
            moved = (scales.double() * ratio).to(torch.float8_e4m3fn)
            if not torch.equal(moved.double(), scales.double() * ratio):
                raise ValueError(f"expert {expert}: ratio {ratio} moves a block scale off E4M3")
            scales, up_global = moved, gate_global
        down_global = _pow2_ceil(down.abs().max() / (6 * E4M3_MAX)).item()
        return {"gate_proj": (*nvfp4(gate, gate_global), gate_global),
                "up_proj": (packed, scales, up_global),
                "down_proj": (*nvfp4(down, down_global), down_global)}

    return draw


def special_ids(tokenizer: Path) -> tuple[int, ...]:
    """Every added token of a tokenizer directory (chat markers, padding, tool tags): no
    designed table leads to one."""
    added = json.loads((tokenizer / "tokenizer.json").read_text())["added_tokens"]
    return tuple(sorted(token["id"] for token in added))


def _rms(x: torch.Tensor, eps: float = RMS_EPS) -> torch.Tensor:
    return x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps)


def mhc_pre_float64(streams: torch.Tensor, fn: torch.Tensor, scale: torch.Tensor,
                    base: torch.Tensor):
    """vLLM 0.30.0's mHC pre (kernels/mhc/torch.py's mhc_pre_torch) in float64: (post mix
    [T, n], stream mixing [T, n, n], layer input [T, hidden]) of streams [T, n, hidden]."""
    n = streams.shape[1]
    flat = streams.reshape(streams.shape[0], -1)
    mixes = (flat @ fn.double().T) * torch.rsqrt((flat * flat).mean(-1, keepdim=True) + RMS_EPS)
    scale, base = scale.double(), base.double()
    pre = torch.sigmoid(mixes[:, :n] * scale[0] + base[:n]) + HC_EPS
    post = torch.sigmoid(mixes[:, n:2 * n] * scale[1] + base[n:2 * n]) * HC_POST_MULT
    comb = mixes[:, 2 * n:].reshape(-1, n, n) * scale[2] + base[2 * n:].reshape(1, n, n)
    comb = torch.softmax(comb, -1) + HC_EPS
    comb = comb / (comb.sum(-2, keepdim=True) + HC_EPS)
    for _ in range(HC_SINKHORN - 1):
        comb = comb / (comb.sum(-1, keepdim=True) + HC_EPS)
        comb = comb / (comb.sum(-2, keepdim=True) + HC_EPS)
    return post, comb, (pre.unsqueeze(-1) * streams).sum(1)


def mhc_post_float64(x: torch.Tensor, streams: torch.Tensor, post: torch.Tensor,
                     comb: torch.Tensor) -> torch.Tensor:
    """vLLM 0.30.0's mHC post (mhc_post_torch) in float64: new streams [T, n, hidden]."""
    return torch.einsum("tij,tih->tjh", comb, streams) + post.unsqueeze(-1) * x.unsqueeze(1)


def route(x: torch.Tensor, router: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """vLLM's grouped top-k as Glm5Next's config sets it (one group, sigmoid scores, top
    TOPK renormalized, times routed_scaling_factor), in float64: (weights, expert ids, the gap
    between the TOPK-th and the next score)."""
    scores = torch.sigmoid(x @ router.T)
    top, ids = scores.topk(TOPK + 1, -1)
    weights = top[:, :TOPK] / top[:, :TOPK].sum(-1, keepdim=True)
    return (weights * config("equal")["routed_scaling_factor"], ids[:, :TOPK],
            top[:, TOPK - 1] - top[:, TOPK])


def _swiglu(x: torch.Tensor, gate: torch.Tensor, up: torch.Tensor,
            down: torch.Tensor) -> torch.Tensor:
    return (torch.nn.functional.silu(x @ gate.T) * (x @ up.T)) @ down.T


def intended_experts(tensors: dict[str, torch.Tensor]) -> dict[tuple[int, int], dict]:
    """intended_expert of every routed expert, by (layer, expert)."""
    return {(layer, expert): intended_expert(tensors, layer, expert)
            for layer, mlp in enumerate(MLP_TYPES) if mlp == "sparse"
            for expert in range(EXPERTS)}


def tokenwise_forward(tensors: dict[str, torch.Tensor], tokens: torch.Tensor,
                      stock: bool = False, experts: dict | None = None,
                      rounding: torch.dtype | None = None) -> dict[str, torch.Tensor]:
    """The tokenwise checkpoint's forward in float64 for each token of TOKENS on its own
    (every attention output is zero, so nothing else enters): `states` [layers, T, hidden],
    each layer's completed and contracted output (what layer v10 captures for a drafter),
    `hidden` the final normed state [T, hidden], `routing_gap` [T] the smallest gap between
    the 2nd and 3rd expert scores over the MoE layers. STOCK reads each expert's up half
    with its gate's global, as stock vLLM does. EXPERTS: intended_experts(tensors), if made.
    ROUNDING (bfloat16): round what vLLM keeps in the model's dtype (the streams, each layer's
    input and output) as it would, to estimate how far the engine's own answer may lie."""
    experts = experts or intended_experts(tensors)

    def kept(value: torch.Tensor) -> torch.Tensor:
        return value if rounding is None else value.to(rounding).double()

    w = {name: t.double() for name, t in tensors.items() if t.dtype is not torch.uint8}
    x = w["model.embed_tokens.weight"][tokens]
    streams = x.unsqueeze(1).expand(-1, STREAMS, -1)
    states, gaps = [], []
    for layer, mlp in enumerate(MLP_TYPES):
        p = f"model.layers.{layer}"
        post, comb, _ = mhc_pre_float64(streams, w[f"{p}.hc_attn_fn"], w[f"{p}.hc_attn_scale"],
                                        w[f"{p}.hc_attn_base"])
        streams = mhc_post_float64(torch.zeros_like(x), streams, post, comb)  # attention: 0
        streams = kept(streams)
        post, comb, inp = mhc_pre_float64(streams, w[f"{p}.hc_ffn_fn"], w[f"{p}.hc_ffn_scale"],
                                          w[f"{p}.hc_ffn_base"])
        inp = kept(_rms(kept(inp)) * w[f"{p}.post_attention_layernorm.weight"])
        m = f"{p}.mlp"
        if mlp == "dense":
            out = _swiglu(inp, w[f"{m}.gate_proj.weight"], w[f"{m}.up_proj.weight"],
                          w[f"{m}.down_proj.weight"])
        else:
            weights, ids, gap = route(inp, w[f"{m}.gate.weight"])
            gaps.append(gap)
            out = _swiglu(inp, w[f"{m}.shared_experts.gate_proj.weight"],
                          w[f"{m}.shared_experts.up_proj.weight"],
                          w[f"{m}.shared_experts.down_proj.weight"])
            for expert in ids.unique().tolist():
                e = dict(experts[layer, expert])
                if stock:
                    prefix = f"{m}.experts.{expert}"
                    e["up_proj"] = e["up_proj"] * (tensors[f"{prefix}.gate_proj.weight_scale_2"]
                                                   / tensors[f"{prefix}.up_proj.weight_scale_2"]
                                                   ).item()
                rows, slot = (ids == expert).nonzero(as_tuple=True)
                out = out.index_add(0, rows, _swiglu(inp[rows], e["gate_proj"], e["up_proj"],
                                                     e["down_proj"]) * weights[rows, slot, None])
        streams = kept(mhc_post_float64(kept(out), streams, post, comb))
        states.append(kept(streams.mean(1)))
    hidden = kept(_rms(states[-1]) * w["model.norm.weight"])
    return {"states": torch.stack(states), "hidden": hidden,
            "routing_gap": torch.stack(gaps, 1).amin(1)}


@dataclass(frozen=True)
class TokenwiseDesign:
    """The tokenwise checkpoints (`tensors[variant]`) and what float64 says they answer."""

    tensors: dict
    next_token: list[int]
    path: list[int]  # path[0] ends the prompt; each answer is the next entry
    stock_choice: int  # what stock vLLM answers after path[FLIP_AT]
    margins: list[float]  # float64 margin of the choice after each path entry
    stock_margins: list[float]  # the same for stock, up to and including path[FLIP_AT]
    routing_gaps: list[float]  # each path entry's smallest routing gap, intended
    flip_cos: float  # cos(intended, stock) final hidden state of path[FLIP_AT]
    following_table: int  # tokens of the vocabulary whose float64 choice is the table's

    def summary(self) -> dict:
        return {"path": self.path, "flip_at": FLIP_AT, "stock_choice": self.stock_choice,
                "min_margin_nats": min(self.margins),
                "min_stock_margin_nats": min(self.stock_margins),
                "min_routing_gap": min(self.routing_gaps), "flip_cos": self.flip_cos,
                "following_table": self.following_table, "vocab": VOCAB}


@functools.cache
def tokenwise_design(special: tuple[int, ...], seed: int = TOKENWISE_SEED) -> TokenwiseDesign:
    """Both tokenwise checkpoints, their table and the path the answers walk, designed in
    float64 (module docstring); refuses in one line when the seed gives no such design."""
    tensors = {variant: _draw(torch.Generator().manual_seed(seed), TOKENWISE_GAINS,
                              _tokenwise_experts(twin=variant == "twin"))
               for variant in TOKENWISE}
    experts = {variant: intended_experts(tensors[variant]) for variant in TOKENWISE}
    for key, mine in experts["tokenwise"].items():
        if any(not torch.equal(mine[k], experts["twin"][key][k]) for k in mine):
            raise ValueError(f"layer {key[0]} expert {key[1]}: the twin's weights differ")
    everything = torch.arange(VOCAB)
    ours = tokenwise_forward(tensors["tokenwise"], everything, experts=experts["tokenwise"])
    stock = tokenwise_forward(tensors["tokenwise"], everything, stock=True,
                              experts=experts["tokenwise"])
    hidden, stock_hidden = ours["hidden"], stock["hidden"]
    special_set = set(special)
    ordinary = [t for t in range(VOCAB) if t not in special_set]
    safe = [t for t in ordinary if min(ours["routing_gap"][t], stock["routing_gap"][t])
            >= ROUTING_GAP]
    cos = torch.nn.functional.cosine_similarity(hidden, stock_hidden, dim=-1)
    flip = min(safe, key=lambda t: cos[t].item())
    if cos[flip] > FLIP_COS:
        raise ValueError(f"seed {seed}: no routing-safe token's stock state is within cos "
                         f"{FLIP_COS} of its own (closest {cos[flip]:.3f})")
    # before the flip, stock must keep choosing the table: its state nearest its own token's
    similarity = stock_hidden @ hidden.T
    own = similarity[torch.arange(VOCAB), torch.arange(VOCAB)]
    rival = similarity.clone()
    rival[torch.arange(VOCAB), torch.arange(VOCAB)] = -torch.inf
    stock_lead = (own - rival.amax(-1)) * HEAD_GAIN / HIDDEN
    order = torch.randperm(len(safe), generator=torch.Generator().manual_seed(seed)).tolist()
    shuffled = [safe[i] for i in order if safe[i] != flip]
    before = [t for t in shuffled if stock_lead[t] >= 2 * MARGIN_NATS][:FLIP_AT]
    after = [t for t in shuffled if t not in before][:PATH_TOKENS - FLIP_AT - 1]
    path = before + [flip] + after
    if len(path) != PATH_TOKENS:
        raise ValueError(f"seed {seed}: {len(path)} routing-safe path tokens, {PATH_TOKENS} "
                         f"needed")
    rest = [t for t in ordinary if t not in set(path)]
    stock_choice = rest[0]
    table = torch.empty(VOCAB, dtype=torch.long)
    table[torch.tensor(path)] = torch.tensor(path[1:] + path[:1])
    others = torch.tensor(rest)[torch.randperm(len(rest),
                                               generator=torch.Generator().manual_seed(seed))]
    table[torch.tensor(rest)] = others
    table[torch.tensor(sorted(special_set))] = others[:len(special_set)]
    head = torch.zeros(VOCAB, HIDDEN, dtype=torch.float64)
    head.index_add_(0, table, hidden * HEAD_GAIN / HIDDEN)
    head[stock_choice] += stock_hidden[flip] * HEAD_GAIN / HIDDEN
    head = head.to(torch.bfloat16)
    for variant in TOKENWISE:
        tensors[variant]["lm_head.weight"] = head

    def choice(states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        top = (states @ head.double().T).topk(2, -1)
        return top.indices[:, 0], top.values[:, 0] - top.values[:, 1]

    chosen, margin = choice(hidden)
    stock_chosen, stock_margin = choice(stock_hidden)
    idx = torch.tensor(path)
    wanted_stock = table[idx[:FLIP_AT + 1]].clone()
    wanted_stock[FLIP_AT] = stock_choice
    if not (torch.equal(chosen[idx], table[idx]) and margin[idx].min() >= MARGIN_NATS):
        raise ValueError(f"seed {seed}: a path token's float64 choice is not the table's by "
                         f"{MARGIN_NATS} nats (least {margin[idx].min():.2f})")
    if not (torch.equal(stock_chosen[idx[:FLIP_AT + 1]], wanted_stock)
            and stock_margin[idx[:FLIP_AT + 1]].min() >= MARGIN_NATS):
        raise ValueError(f"seed {seed}: stock's float64 choices up to the flip are not the "
                         f"designed ones by {MARGIN_NATS} nats")
    return TokenwiseDesign(
        tensors=tensors, next_token=table.tolist(), path=path, stock_choice=stock_choice,
        margins=margin[idx].tolist(), stock_margins=stock_margin[idx[:FLIP_AT + 1]].tolist(),
        routing_gaps=ours["routing_gap"][idx].tolist(), flip_cos=cos[flip].item(),
        following_table=int((chosen == table).sum()))


DRAFT_K = 7  # the recipe's k: 8 block positions, 8 conv taps
DRAFT_TAPS = (1, 3)  # the target's MLA layers: aux hidden states from two of its layers


def _dflash2_drafter(table: list[int], mask_id: int,
                     code: tuple[float, ...]) -> dict[str, torch.Tensor]:
    """The engine tier's DFlash2 drafter (tests/engine/dflash2_models.py, built for k = 3)
    widened to k = DRAFT_K, drafting along TABLE: its convolutions' taps past 3 hold CODE
    (position j's draft is right while code[j - 1] is 0 and wrong at -1), its fc reads the
    len(DRAFT_TAPS) tapped layers of this target with zero weights (context keys score 0, as
    there)."""
    from tests.engine import dflash2_models as engine

    if len(code) != DRAFT_K:
        raise ValueError(f"code: {len(code)} positions, the drafter has {DRAFT_K}")
    made = engine.drafter_tensors(table, mask_id=mask_id, target_hidden=HIDDEN,
                                  code=code[:engine.K])
    out = {name: torch.from_numpy(array) for name, array in made.items()}
    out["fc.weight"] = torch.zeros(engine.H, HIDDEN * len(DRAFT_TAPS))
    groups = engine.H // engine.GROUP
    for conv in ("attention_conv", "mlp_conv"):
        name = f"layers.0.{conv}"
        base = torch.zeros(2, DRAFT_K + 1, engine.H)
        base[:, :engine.K + 1] = out[f"{name}.base_kernel"]
        if conv == "mlp_conv":  # side 1 carries the anchor's code channel to row j by tap j
            base[1, 1:, engine.CH_CODE] = torch.tensor(code, dtype=base.dtype)
        out[f"{name}.base_kernel"] = base
        rows = out[f"{name}.kernel_projection.weight"].reshape(2, engine.K + 1, groups, -1)
        wide = torch.zeros(2, DRAFT_K + 1, groups, rows.shape[-1])
        wide[:, :engine.K + 1] = rows
        out[f"{name}.kernel_projection.weight"] = wide.reshape(-1, rows.shape[-1])
    return {name: tensor.to(torch.bfloat16) for name, tensor in out.items()}


def drafter_tensors(seed: int = SEED, mask_id: int = 0) -> dict[str, torch.Tensor]:
    """The drafter for the live target: its next-token table is a seeded permutation that
    nothing ties to the target's greedy tokens, so nearly every draft is rejected (the tail
    ring's hardest case)."""
    generator = torch.Generator().manual_seed(seed)
    others = [t for t in torch.randperm(VOCAB, generator=generator).tolist() if t != mask_id]
    table = others[:mask_id] + [others[0]] + others[mask_id:]  # never the mask token itself
    return _dflash2_drafter(table, mask_id, (0.0,) * DRAFT_K)


DESIGNED_CODE = (0.0,) * DESIGN_RIGHT + (-1.0,) * (DRAFT_K - DESIGN_RIGHT)


def designed_drafter_tensors(next_token: list[int], mask_id: int) -> dict[str, torch.Tensor]:
    """The drafter for the tokenwise target: it drafts the target's own table, right at
    positions 1 to DESIGN_RIGHT and wrong after, so every verify step accepts DESIGN_RIGHT
    drafts and rejects the rest (per-position acceptance 1 then 0)."""
    if mask_id in next_token:
        raise ValueError(f"the table leads to the mask token {mask_id}")
    return _dflash2_drafter(next_token, mask_id, DESIGNED_CODE)


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


def write_drafter(out: Path, seed: int = SEED, tokenizer: Path | None = None,
                  next_token: list[int] | None = None) -> Path:
    """The live target's drafter in OUT, or with NEXT_TOKEN the designed one drafting it."""
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    pad_id, _ = _tokenizer(out, tokenizer)
    made = drafter_tensors(seed, pad_id) if next_token is None else \
        designed_drafter_tensors(next_token, pad_id)
    (out / "config.json").write_text(json.dumps(drafter_config(pad_id), indent=1))
    save_file({k: v.contiguous() for k, v in made.items()}, str(out / "model.safetensors"),
              metadata={"format": "pt"})
    return out


def write(out: Path, variant: str, seed: int = SEED, tokenizer: Path | None = None) -> Path:
    """The checkpoint in OUT; with TOKENIZER (a model directory), its tokenizer files and
    pad and eos ids too. A tokenwise variant also gets design.json (its table and path)."""
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    pad_id, eos_ids = _tokenizer(out, tokenizer)
    (out / "config.json").write_text(json.dumps(config(variant, pad_id, eos_ids), indent=1))
    if variant in TOKENWISE:
        special = special_ids(tokenizer) if tokenizer else tuple(sorted({pad_id, *eos_ids}))
        design = tokenwise_design(special)
        tensors = design.tensors[variant]
        (out / "design.json").write_text(json.dumps(
            {**design.summary(), "special": list(special), "next_token": design.next_token}))
    else:
        tensors = checkpoint_tensors(variant, seed)
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(out / "model.safetensors"),
              metadata={"format": "pt"})
    return out


if __name__ == "__main__":
    if len(sys.argv) not in (3, 4) or sys.argv[2] not in (*VARIANTS, *TOKENWISE, "drafter"):
        sys.exit("usage: glm5next_models.py OUT_DIR equal|unequal|tokenwise|twin|drafter "
                 "[TOKENIZER_DIR]")
    where, kind = Path(sys.argv[1]), sys.argv[2]
    source = Path(sys.argv[3]) if len(sys.argv) == 4 else None
    print(write_drafter(where, tokenizer=source) if kind == "drafter" else
          write(where, kind, tokenizer=source))
