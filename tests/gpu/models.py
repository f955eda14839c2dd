"""Models the GPU tier serves, made here (CPU) and carried to the GPU machine.

- `margin_target_dir`: a tiny Qwen3 (the engine tier's tokenizer and shape) whose greedy next
  token is a fixed function `next_token[t]` of the current token, by a margin far above
  bfloat16's rounding. The engine tier's bigram target decides by margins made for float32
  (its closest call is 4.8e-4 nats); a CUDA engine computes in bfloat16, whose rounding of a
  logit is about 1e-2 nats, so drafted and undrafted tokens could differ there for reasons
  that are not the code's. Here every attention and MLP output is zero, the final hidden state
  of token t is RMSNorm(embed[t]) = h_t, and lm_head row n is GAIN / hidden * the sum of h_t
  over the tokens t whose next token is n: the right logit is about GAIN, every other one a
  sum of cosines of random 128-dimensional vectors (about 0.3 * GAIN at most).
- `bf16_target_dir` and `int8_target_dir`: the engine tier's tiny target as a CUDA engine
  loads it (weights rounded to bfloat16), and the same after layer v13's INT8 weight-only
  rounding (its own `int8_wna16`, group 128, on every linear and the lm_head) dequantized: a
  float64 forward of the two predicts the KL the quality gate must measure between an engine
  serving the first and one swapping the second's groups in at load.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from tests.engine import dflash2_models, tiny_models
from tests.engine.cache import cached_dir, files_key

GROUP = "gpu-models"
SEED = 2026
GAIN = 20.0
# bfloat16's rounding of a logit must be this many times smaller than the closest call
MARGIN_OVER_ROUNDING = 10.0
INT8_GROUP = 128  # layer v13's default GLM53_INT_GROUP_SIZE
LINEARS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
           "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")


def _rms_normed(x: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps)


def _bf16(x: np.ndarray) -> np.ndarray:
    """Round float32 values to the nearest bfloat16 (ties to even), kept as float32."""
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return rounded.astype(np.uint32).view(np.float32)


def next_token_map(vocab_size: int, special: list[int], seed: int) -> list[int]:
    """A permutation of the ordinary tokens, and each special token sent to one of them:
    nothing ever leads to a special token (no end of turn, no padding)."""
    rng = np.random.default_rng(seed)
    ordinary = np.array([t for t in range(vocab_size) if t not in set(special)])
    table = np.empty(vocab_size, dtype=np.int64)
    table[ordinary] = rng.permutation(ordinary)
    table[special] = rng.choice(ordinary, size=len(special), replace=False)
    return table.tolist()


def margin_tensors(tokenizer: Path) -> tuple[dict[str, np.ndarray], list[int]]:
    shape = tiny_models.TinyShape()
    vocab_size = len(tiny_models.vocab(tokenizer))
    tensors = tiny_models.qwen3_weights(SEED, vocab_size, shape)
    for layer in range(shape.layers):
        for zeroed in ("self_attn.o_proj.weight", "mlp.down_proj.weight"):
            name = f"model.layers.{layer}.{zeroed}"
            tensors[name] = np.zeros_like(tensors[name])
    table = next_token_map(vocab_size, tiny_models.special_ids(tokenizer), SEED)
    hidden = _rms_normed(tensors["model.embed_tokens.weight"].astype(np.float64), 1e-6)
    head = np.zeros((vocab_size, shape.hidden))
    np.add.at(head, np.array(table), hidden * (GAIN / shape.hidden))
    tensors["lm_head.weight"] = head.astype(np.float32)
    return tensors, table


def margins(tensors: dict[str, np.ndarray], table: list[int]) -> dict:
    """The closest call in float64, and how far bfloat16 (inputs and output rounded, float32
    accumulation, as a bf16 GEMM does) moves a logit."""
    embed = tensors["model.embed_tokens.weight"]
    exact = _rms_normed(embed.astype(np.float64), 1e-6) @ tensors["lm_head.weight"].T.astype(
        np.float64)
    hidden16 = _bf16(_rms_normed(_bf16(embed), 1e-6).astype(np.float32))
    rounded = _bf16(hidden16 @ _bf16(tensors["lm_head.weight"]).T)
    if exact.argmax(-1).tolist() != table:
        raise ValueError("the margin target's greedy choice is not its table")
    ranked = np.sort(exact, axis=-1)
    return {"min_margin_nats": float((ranked[:, -1] - ranked[:, -2]).min()),
            "bf16_rounding_nats": float(np.abs(rounded - exact).max())}


def margin_target_dir() -> Path:
    tokenizer = tiny_models.tokenizer_dir()

    def build(out: Path) -> None:
        tensors, table = margin_tensors(tokenizer)
        found = margins(tensors, table)
        if found["min_margin_nats"] < MARGIN_OVER_ROUNDING * found["bf16_rounding_nats"]:
            raise ValueError(f"{out}: closest call {found['min_margin_nats']:g} nats is within "
                             f"{MARGIN_OVER_ROUNDING:g}x bfloat16's rounding "
                             f"({found['bf16_rounding_nats']:g} nats)")
        tiny_models.write_model(out, tensors, tokenizer, {
            "made_by": "tests/gpu/models.py", "seed": SEED, "gain": GAIN,
            "change": "attention and MLP outputs zeroed; lm_head built from next_token"})
        (out / "next_token.json").write_text(json.dumps({"next_token": table, **found}))

    key = files_key([Path(__file__), Path(tiny_models.__file__)], tiny_models.generator_pins(),
                    tokenizer.name)
    return cached_dir(GROUP, f"margin-target-{key}", build)


def margin_drafter_dir(target: Path) -> Path:
    """The engine tier's DFlash2 drafter (drafts right at positions 1 and 2, wrong at 3),
    built from the margin target's table."""
    return dflash2_models.dflash2_drafter_dir(target, is_causal=False)


def _derived(name: str, note: str, change, sources=()) -> Path:
    source = tiny_models.target_dir()

    def build(out: Path) -> None:
        from safetensors.numpy import load_file

        tensors = load_file(str(source / "model.safetensors"))
        change(tensors)
        tiny_models.write_model(out, tensors, tiny_models.tokenizer_dir(), {
            "made_by": "tests/gpu/models.py", "from": source.name, "change": note})

    key = files_key([Path(__file__), *sources], tiny_models.generator_pins(), source.name, note)
    return cached_dir(GROUP, f"{name}-{key}", build)


def _swapped(name: str) -> bool:
    return name == "lm_head.weight" or any(name.endswith(f"{linear}.weight")
                                           for linear in LINEARS)


def bf16_target_dir() -> Path:
    def change(tensors):
        for name in tensors:
            tensors[name] = _bf16(tensors[name])

    return _derived("target-bf16", "every weight rounded to bfloat16", change)


def int8_target_dir(helper) -> Path:
    """`helper`: layer v13's weight-group module (patches/v13/weight_groups.py, imported with
    vLLM 0.30.0 on the path) whose int8_wna16 the engine runs at load."""
    import torch

    def change(tensors):
        for name in tensors:
            weight = torch.from_numpy(_bf16(tensors[name])).to(torch.bfloat16)
            if _swapped(name):
                packed = helper.int8_wna16(weight, INT8_GROUP)
                weight = helper.int8_wna16_dequantized(packed, INT8_GROUP)
            tensors[name] = weight.float().numpy()

    return _derived("target-int8", f"bfloat16, then v13 int8_wna16 g{INT8_GROUP} on every "
                                   f"linear and the lm_head, dequantized", change,
                    sources=[Path(helper.__file__)])
