"""A tiny target whose next token is a known function of the current one, and a DFlash2
drafter (vLLM's `DFlash2DraftModel`, read by `qwen3_dflash2.py`) whose drafts are known
at every position, built by hand from that function.

The target is the engine tier's tiny Qwen3 (tiny_models.target_dir) with every attention
output projection zeroed: each position then sees only its own token, so greedy decoding
follows a table `next_token[t]`, computed here from the weights in float64 (and checked
against the undrafted server by the tests).

The drafter computes no language model. Its candidate selector scores candidate c after
predecessor p by `h * <u[next_token[p]], u[c]>` (predecessor codebook row p = u of p's
successor, successor codebook row c = u[c], unit vectors), so with h > 0 the selector walk
from the anchor proposes exactly the target's next tokens and with h < 0 never does. The
sign of h at draft position j (1..K) is wired from two signals of the one decoder layer:

- attention: the anchor's value is 1 and every mask token's is 0, and all keys of the
  block are equal (context keys are 0 and fall far behind), so position j reads the
  anchor's share of its visible block: 1/(K+1) when the layer is non-causal, 1/(j+1) when
  causal;
- a position code: the MLP writes 1 at the anchor row only, and the grouped convolution
  after it (DFlash2's `mlp_conv`, K+1 taps) carries it to mask row j with tap j's weight
  `code[j]`; the attention convolution's data-dependent tap zeroes the anchor row's own
  attention output, so the MLP input there does not depend on causality.

h_j is proportional to `THRESHOLD - share_j + code[j]`. With THRESHOLD 0.375 and K = 3:
non-causal, 0.125 + code[j]; causal, 0.375 - 1/(j+1) + code[j]. `code = [0, 0, -1]` gives
non-causal drafts right at positions 1 and 2 and wrong at 3 (per-position acceptance
1, 1, 0) and causal drafts wrong at position 1 (0, 0, 0). The drafter's lm_head is zero,
so DFlash1's argmax drafting would propose one fixed token: acceptance at all shows that
DFlash2's candidate walk drafted.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from tests.engine import tiny_models
from tests.engine.cache import cached_dir, files_key

K = 3  # drafts per step: the drafter's conv has K+1 taps, one per block position
THRESHOLD = 0.375
POSITION_CODE = (0.0, 0.0, -1.0)  # code[j-1]: -1 makes position j wrong whatever attention says
WINDOW = 2048

# the drafter's hidden channels
H, HEAD_DIM, INTERMEDIATE, RANK, GROUP = 64, 32, 32, 32, 16
CH_TOKEN, CH_MASK, CH_CODE = 0, 1, 2  # group 0
CH_SHARE = 16  # group 1: the attention output, zeroed at the anchor row
QK_DIM = HEAD_DIM // 2 - 1  # the slowest RoPE pair: no rotation across a block to speak of
BLOCK_SCORE = 40.0  # q.k of every block key; context keys score 0 (weight e^-40 each)
SHARE_GAIN = 8.0
SELECTOR_GAIN = 40.0


def _rms_norm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * weight


def _silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


def _attention_free_logits(weights: dict[str, np.ndarray], config: dict,
                           dtype: type) -> np.ndarray:
    """Logits after every token id alone, of a Qwen3 whose attention outputs are zero."""
    w = {k: v.astype(dtype) for k, v in weights.items()}
    eps = config["rms_norm_eps"]
    x = w["model.embed_tokens.weight"]
    for layer in range(config["num_hidden_layers"]):
        p = f"model.layers.{layer}."
        if np.any(w[p + "self_attn.o_proj.weight"]):
            raise ValueError(f"layer {layer} attends; the next-token table needs o_proj 0")
        h = _rms_norm(x, w[p + "post_attention_layernorm.weight"], eps)
        x = x + (_silu(h @ w[p + "mlp.gate_proj.weight"].T) * (h @ w[p + "mlp.up_proj.weight"].T)
                 ) @ w[p + "mlp.down_proj.weight"].T
    return _rms_norm(x, w["model.norm.weight"], eps) @ w["lm_head.weight"].T


def next_token_table(model: Path) -> tuple[list[int], float, float]:
    """Greedy next token of every token id of an attention-free Qwen3 (float64), the
    smallest gap between best and second-best logit, and how far float32 moves a logit."""
    from safetensors.numpy import load_file

    config = json.loads((model / "config.json").read_text())
    weights = load_file(str(model / "model.safetensors"))
    exact = _attention_free_logits(weights, config, np.float64)
    rounding = float(np.abs(_attention_free_logits(weights, config, np.float32) - exact).max())
    top2 = np.sort(exact, axis=-1)[:, -2:]
    return exact.argmax(-1).tolist(), float((top2[:, 1] - top2[:, 0]).min()), rounding


def next_token_probs(model: Path) -> np.ndarray:
    """[t, n]: the probability (float64) that an attention-free Qwen3 follows token t by n
    at temperature 1, a softmax of its logits computed from the weights."""
    from safetensors.numpy import load_file

    config = json.loads((model / "config.json").read_text())
    logits = _attention_free_logits(load_file(str(model / "model.safetensors")), config,
                                    np.float64)
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    return probs / probs.sum(-1, keepdims=True)


def bigram_target_dir() -> Path:
    """The tier's target with its attention outputs zeroed, and `next_token.json`."""
    source = tiny_models.target_dir()

    def build(out: Path) -> None:
        from safetensors.numpy import load_file, save_file

        tensors = load_file(str(source / "model.safetensors"))
        for name in tensors:
            if name.endswith("self_attn.o_proj.weight"):
                tensors[name] = np.zeros_like(tensors[name])
        save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
        for item in source.iterdir():
            if item.name not in ("model.safetensors", "tiny_model.json"):
                (out / item.name).write_bytes(item.read_bytes())
        table, margin, rounding = next_token_table(out)
        # the engine computes in float32: no greedy choice may be near its rounding
        if margin < 10 * rounding:
            raise ValueError(f"{out}: a greedy choice rests on a {margin:g}-nat gap, within "
                             f"10x of float32's rounding ({rounding:g} nats)")
        (out / "next_token.json").write_text(json.dumps(
            {"next_token": table, "min_margin_nats": margin, "float32_rounding_nats": rounding}))
        (out / "tiny_model.json").write_text(json.dumps(
            {"made_by": "tests/engine/dflash2_models.py", "from": source.name,
             "change": "self_attn.o_proj zeroed: each position sees only its own token"}))

    key = files_key([Path(__file__)], tiny_models.generator_pins(), source.name)
    return cached_dir(tiny_models.GROUP, f"bigram-target-{key}", build)


def next_tokens(target: Path) -> list[int]:
    return json.loads((target / "next_token.json").read_text())["next_token"]


def _unit_vectors(count: int, rank: int, seed: int) -> np.ndarray:
    u = np.random.default_rng(seed).standard_normal((count, rank))
    return u / np.linalg.norm(u, axis=1, keepdims=True)


def drafter_tensors(next_token: list[int], mask_id: int, target_hidden: int,
                    code: tuple[float, ...] = POSITION_CODE) -> dict[str, np.ndarray]:
    vocab = len(next_token)
    taps, groups = K + 1, H // GROUP
    t: dict[str, np.ndarray] = {}
    embed = np.zeros((vocab, H))
    embed[:, CH_TOKEN] = 1.0
    embed[mask_id] = 0.0
    embed[mask_id, CH_MASK] = 1.0
    t["embed_tokens.weight"] = embed
    t["fc.weight"] = np.zeros((H, target_hidden))  # context K/V are 0
    t["hidden_norm.weight"] = np.ones(H)
    t["norm.weight"] = np.ones(H)

    p = "layers.0."
    normed = math.sqrt(H)  # a one-hot row after RMSNorm
    t[p + "input_layernorm.weight"] = np.ones(H)
    t[p + "post_attention_layernorm.weight"] = np.ones(H)
    q = np.zeros((HEAD_DIM, H))
    q[QK_DIM, [CH_TOKEN, CH_MASK]] = 1.0 / normed
    t[p + "self_attn.q_proj.weight"] = q
    t[p + "self_attn.k_proj.weight"] = q.copy()  # every block key is the same vector
    v = np.zeros((HEAD_DIM, H))
    v[0, CH_TOKEN] = 1.0 / normed  # the anchor's value 1, a mask's 0
    t[p + "self_attn.v_proj.weight"] = v
    o = np.zeros((H, HEAD_DIM))
    o[CH_SHARE, 0] = SHARE_GAIN
    t[p + "self_attn.o_proj.weight"] = o
    # q.k = (sqrt(d) w)^2 / sqrt(d) after the per-head RMSNorms
    qk_weight = math.sqrt(BLOCK_SCORE / math.sqrt(HEAD_DIM))
    t[p + "self_attn.q_norm.weight"] = np.full(HEAD_DIM, qk_weight)
    t[p + "self_attn.k_norm.weight"] = np.full(HEAD_DIM, qk_weight)

    gate = np.zeros((INTERMEDIATE, H))
    gate[0, CH_TOKEN] = 4.0 / normed
    up = np.zeros((INTERMEDIATE, H))
    up[0, CH_TOKEN] = 1.0 / normed
    down = np.zeros((H, INTERMEDIATE))
    down[CH_CODE, 0] = 1.0 / float(_silu(np.array(4.0)))  # 1 at the anchor row, 0 at masks
    t[p + "mlp.gate_proj.weight"], t[p + "mlp.up_proj.weight"] = gate, up
    t[p + "mlp.down_proj.weight"] = down

    # base_kernel[side, tap, channel]: side 0 convolves a sublayer's input, side 1 its
    # output; tap 0 alone (weight 1) is the identity
    for conv in ("attention_conv", "mlp_conv"):
        base = np.zeros((2, taps, H))
        base[:, 0, :] = 1.0
        projection = np.zeros((2 * taps * groups, H))
        if conv == "mlp_conv":
            base[1, 1:, CH_CODE] = code
        else:
            # the row's own tap-0 weight of the attention output's group, from the row's
            # input: 1 - 1 = 0 at the anchor row (token channel), 1 at mask rows
            projection[1 * taps * groups + 0 * groups + CH_SHARE // GROUP, CH_TOKEN] = -1.0 / normed
        t[p + f"{conv}.base_kernel"] = base
        t[p + f"{conv}.kernel_projection.weight"] = projection

    z = np.zeros((RANK, H))
    z[:, CH_MASK] = THRESHOLD
    z[:, CH_SHARE] = -1.0 / SHARE_GAIN
    z[:, CH_CODE] = 1.0
    t["candidate_selector.hidden_projection.weight"] = SELECTOR_GAIN * z
    u = _unit_vectors(vocab, RANK, seed=53)
    t["candidate_selector.predecessor_codebook"] = u[np.array(next_token)]
    t["candidate_selector.successor_codebook"] = u
    t["lm_head.weight"] = np.zeros((vocab, H))
    return {name: array.astype(np.float32) for name, array in t.items()}


def drafter_config(target_config: dict, mask_id: int, *, is_causal: bool | None) -> dict:
    config = {
        "architectures": ["DFlash2DraftModel"], "model_type": "qwen3",
        "vocab_size": target_config["vocab_size"], "hidden_size": H,
        "intermediate_size": INTERMEDIATE, "num_hidden_layers": 1,
        "num_attention_heads": 1, "num_key_value_heads": 1, "head_dim": HEAD_DIM,
        "hidden_act": "silu", "rms_norm_eps": 1e-6,
        "max_position_embeddings": target_config["max_position_embeddings"],
        "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0},
        "attention_bias": False, "tie_word_embeddings": False,
        "target_hidden_size": target_config["hidden_size"],
        "torch_dtype": "float32", "dtype": "float32",
        # sliding layers are causal by default; is_causal (top level) overrides that
        "layer_types": ["sliding_attention"],
        "dflash_config": {
            "target_layer_ids": [0], "mask_token_id": mask_id, "block_size": K + 1,
            "swa_window_size": WINDOW, "conv_kernel_size": K + 1, "conv_group_size": GROUP,
            "selector_rank": RANK, "selector_top_k": target_config["vocab_size"],
        },
    }
    if is_causal is not None:
        config["is_causal"] = is_causal
    return config


def dflash2_drafter_dir(target: Path, *, is_causal: bool | None = False) -> Path:
    """The DFlash2 drafter for `target` (a bigram_target_dir); its mask token is the
    tokenizer's padding token, which the target never emits and prompts never hold."""

    def build(out: Path) -> None:
        from safetensors.numpy import save_file

        target_config = json.loads((target / "config.json").read_text())
        mask_id = target_config["pad_token_id"]
        table = next_tokens(target)
        if mask_id in table:
            raise ValueError(f"{target}: the target emits its padding token {mask_id}; it "
                             f"cannot be the drafter's mask token")
        save_file(drafter_tensors(table, mask_id, target_config["hidden_size"]),
                  str(out / "model.safetensors"), metadata={"format": "pt"})
        config = drafter_config(target_config, mask_id, is_causal=is_causal)
        (out / "config.json").write_text(json.dumps(config, indent=1))

    key = files_key([Path(__file__)], tiny_models.generator_pins(), target.name,
                    f"is_causal={is_causal}")
    return cached_dir(tiny_models.GROUP, f"dflash2-drafter-{key}", build)


def expected_rates(causal: bool) -> list[float]:
    """Per-position acceptance of dflash2_drafter_dir's drafts (every draft alike)."""
    rates, alive = [], True
    for j in range(1, K + 1):
        share = 1.0 / (j + 1) if causal else 1.0 / (K + 1)
        alive = alive and THRESHOLD - share + POSITION_CODE[j - 1] > 0
        rates.append(1.0 if alive else 0.0)
    return rates
