"""Two tiny targets whose greedy answers to the multibyte probe are known: a clean one that
answers Korean questions in Hangul (with emoji) and Japanese ones in kana and kanji, and a
corrupting one, the same but for four lone UTF-8 lead bytes in the Korean cycle.

Each cycle is CYCLE_TOKENS distinct tokens, as long as the probe's answers (700 tokens), so
no answer repeats itself: a text that loops is a fault the probe now fails (a healthy model
does not say the same sentence over and over).

The tokenizer is the tier's byte-level BPE (tiny_models.tokenizer_dir) with the cycles'
characters added as tokens, so one token is one character and 700 tokens make 700
characters; the lone lead bytes 0xEA-0xED are the byte-level vocabulary's own tokens. The
model is the tier's Qwen3 shape, wider (one dimension per cycle token), with weights set by
hand, float32:

- the embedding of a token is a constant unit (dimension BIAS), a script flag (FLAG_KO for
  Hangul and the lead bytes 0xEA-0xED, FLAG_JA for kana, kanji and the lead bytes 0xE3-0xE9)
  and, for the cycles' tokens, a basis vector of its own (dimensions from FIRST_TOKEN_DIM on:
  orthonormal, so no cycle token's direction leaks into another's);
- layer 0's attention has zero queries, so every position attends uniformly to every
  position so far; its values carry the two flags and its output writes their means into
  ATT_KO and ATT_JA: how Korean and how Japanese the context is;
- no MLP, no second layer (their output projections are zero);
- the lm_head row of a cycle's next token reads the current token's basis vector (gain
  ALPHA), and the row of each cycle's first token also reads its language's mean (gain
  BETA). After the prompt (whose last token is no cycle token) only the language means
  score, so a Korean prompt starts the Korean cycle and a Japanese one the Japanese cycle;
  inside a cycle the current token's own row wins by a margin checked at build time.

The clean target's answer is its cycle text from the first token on, cut at max_tokens; the
corrupting target writes 0xEA, 0xEB, 0xEC and 0xED each before a syllable of the Korean
cycle (CORRUPT_BEFORE), a lead byte that the syllable (itself starting with a lead byte)
cannot continue: vLLM's detokenizer writes U+FFFD for each, four in 700 tokens (the field's
fewest).
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

import numpy as np

from tests.engine import tiny_models
from tests.engine.cache import cached_dir, files_key

# tokens a cycle: the probe's answers are 700 tokens (FIELD_MAX_TOKENS), and none repeats
CYCLE_TOKENS = 700
EMOJI = ["🌊", "🍊", "🐶", "🎂", "🎈", "🎁", "🌳", "🦴"]


def _korean_cycle() -> list[str]:
    """691 distinct Hangul syllables (every 13th of the block), an emoji after every 80th
    syllable, and one space in the middle (none at either end: stripping keeps 700 chars)."""
    syllables = [chr(0xAC00 + 13 * index) for index in range(CYCLE_TOKENS - len(EMOJI) - 1)]
    cycle: list[str] = []
    for count, syllable in enumerate(syllables, start=1):
        cycle.append(syllable)
        if count % 80 == 0:
            cycle.append(EMOJI[count // 80 - 1])
        if count == len(syllables) // 2:
            cycle.append(" ")
    return cycle


def _japanese_cycle() -> list[str]:
    """A kana every fourth character (175 of the hiragana and katakana letters), distinct
    kanji between them (every 37th of the unified block), and a full stop at the end."""
    kana = iter(chr(c) for c in (*range(0x3041, 0x3097), *range(0x30A1, 0x30FB)))
    kanji = iter(chr(0x4E00 + 37 * index) for index in range(CYCLE_TOKENS))
    return [next(kana) if index % 4 == 0 else next(kanji)
            for index in range(CYCLE_TOKENS - 1)] + ["。"]


KOREAN_CYCLE = _korean_cycle()
JAPANESE_CYCLE = _japanese_cycle()
LONE_LEAD_BYTES = (0xEA, 0xEB, 0xEC, 0xED)
CORRUPT_BEFORE = (5, 180, 355, 530)   # each lone byte goes before KOREAN_CYCLE[i]

BIAS, FLAG_KO, FLAG_JA, ATT_KO, ATT_JA = 0, 1, 2, 3, 4
FIRST_TOKEN_DIM = 8
# one dimension per cycle token (the corrupting target's four bytes among them) after the
# first eight, rounded up to a multiple of 128
HIDDEN = 1536
SHAPE = tiny_models.TinyShape(hidden=HIDDEN)
ALPHA = 6.0                 # a cycle token -> its successor
BETA = 12.0                 # a language's mean -> its cycle's first token
# the attention's value and output gains: a context flagged throughout reads at most
# (largest normalized flag) * VALUE_GAIN * OUTPUT_GAIN = 0.25 in ATT_*, so BETA * 0.25 stays
# under ALPHA. A token with a flag and no cycle direction normalizes its flag to
# sqrt(HIDDEN / 2) (28 here; 8 at the tier's width of 128, whose gains were 0.125 and 0.25)
VALUE_GAIN = 0.125
OUTPUT_GAIN = 0.25 / (VALUE_GAIN * (HIDDEN / 2) ** 0.5)
# the least share of a prompt's tokens flagged that must still pick its language's cycle
MIN_FLAGGED = 0.1
# no greedy choice may rest on less than this (nats): float32 moves these logits by ~1e-5
MIN_MARGIN = 1.0
GROUP = tiny_models.GROUP


def _byte_symbol(value: int) -> str:
    """The byte-level alphabet's symbol of one byte (GPT-2's table, as `tokenizers` uses)."""
    from tokenizers import pre_tokenizers

    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
                 *range(ord("®"), ord("ÿ") + 1)]
    if value in printable:
        return chr(value)
    shifted = [b for b in range(256) if b not in printable]
    symbol = chr(256 + shifted.index(value))
    assert symbol in pre_tokenizers.ByteLevel.alphabet(), value
    return symbol


def tokenizer_with_cycles(out: Path) -> dict[str, int]:
    """The tier's tokenizer with the cycles' characters added; returns its vocabulary."""
    from tokenizers import Tokenizer

    source = tiny_models.tokenizer_dir()
    tokenizer = Tokenizer.from_file(str(source / "tokenizer.json"))
    tokenizer.add_tokens([c for c in KOREAN_CYCLE + JAPANESE_CYCLE if c != " "])
    tokenizer.save(str(out / "tokenizer.json"))
    for name in ("tokenizer_config.json", "special_tokens_map.json"):
        (out / name).write_bytes((source / name).read_bytes())
    return tokenizer.get_vocab(with_added_tokens=True)


@functools.cache
def _byte_table() -> dict[str, int]:
    """The byte-level alphabet's symbol -> the byte it stands for."""
    return {_byte_symbol(b): b for b in range(256)}


def _token_bytes(token: str) -> bytes:
    """The bytes a vocabulary entry stands for (byte-level symbols, or an added character)."""
    table = _byte_table()
    if all(char in table for char in token):
        return bytes(table[char] for char in token)
    return token.encode()


def _flag(raw: bytes) -> int | None:
    """The script a token's bytes belong to, by their lead bytes: Korean or Japanese."""
    leads = [b for b in raw if b >= 0xC0]
    if any(0xEA <= b <= 0xED for b in leads):
        return FLAG_KO
    if any(0xE3 <= b <= 0xE9 for b in leads):
        return FLAG_JA
    return None


def _corrupted(cycle: list, lone: list) -> list:
    """CYCLE with each of LONE inserted before its CORRUPT_BEFORE position (from the last,
    so that the positions are the clean cycle's)."""
    cycle = list(cycle)
    for before, item in sorted(zip(CORRUPT_BEFORE, lone), reverse=True):
        cycle.insert(before, item)
    return cycle


def cycle_ids(vocab: dict[str, int], corrupt: bool) -> tuple[list[int], list[int]]:
    korean = [vocab[_byte_symbol(32) if c == " " else c] for c in KOREAN_CYCLE]
    if corrupt:
        korean = _corrupted(korean, [vocab[_byte_symbol(b)] for b in LONE_LEAD_BYTES])
    return korean, [vocab[c] for c in JAPANESE_CYCLE]


def weights(vocab: dict[str, int], corrupt: bool) -> dict[str, np.ndarray]:
    size, hidden = len(vocab), SHAPE.hidden
    tensors = {name: np.zeros_like(value) for name, value in
               tiny_models.qwen3_weights(0, size, SHAPE).items()}
    for name in tensors:
        if name.endswith("norm.weight"):
            tensors[name] = np.ones_like(tensors[name])
    korean, japanese = cycle_ids(vocab, corrupt)
    cycle_tokens = korean + japanese
    if FIRST_TOKEN_DIM + len(cycle_tokens) > hidden:
        raise ValueError(f"{len(cycle_tokens)} cycle tokens need more than {hidden} dimensions")
    embed = tensors["model.embed_tokens.weight"]
    embed[:, BIAS] = 1.0
    for token, token_id in vocab.items():
        if (flag := _flag(_token_bytes(token))) is not None:
            embed[token_id, flag] = 1.0
    for offset, token_id in enumerate(cycle_tokens):
        embed[token_id, FIRST_TOKEN_DIM + offset] = 1.0
    # uniform attention (zero queries) over the flags: kv head 0 carries them, query head 0
    # reads it, and the output projection writes its two channels into ATT_KO and ATT_JA
    layer = "model.layers.0.self_attn."
    tensors[layer + "v_proj.weight"][0, FLAG_KO] = VALUE_GAIN
    tensors[layer + "v_proj.weight"][1, FLAG_JA] = VALUE_GAIN
    tensors[layer + "o_proj.weight"][ATT_KO, 0] = OUTPUT_GAIN
    tensors[layer + "o_proj.weight"][ATT_JA, 1] = OUTPUT_GAIN
    head = tensors["lm_head.weight"]
    for cycle in (korean, japanese):
        for index, token_id in enumerate(cycle):
            successor = cycle[(index + 1) % len(cycle)]
            head[successor, FIRST_TOKEN_DIM + cycle_tokens.index(token_id)] = ALPHA
    head[korean[0], ATT_KO] = BETA
    head[japanese[0], ATT_JA] = BETA
    return tensors


def _rms_norm(x: np.ndarray) -> np.ndarray:
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-6)


def worst_margin(tensors: dict[str, np.ndarray], cycles: list[list[int]]) -> float:
    """The smallest gap (float64 nats) between the greedy choice and the runner-up, over
    every cycle token with the attention's means anywhere from none to their largest (a
    context flagged throughout), and at the prompt's end (a token with no flag and no cycle
    direction) after a context of which MIN_FLAGGED is flagged: what float32 must not flip."""
    w = {k: v.astype(np.float64) for k, v in tensors.items()}
    embed, head = w["model.embed_tokens.weight"], w["lm_head.weight"]
    layer = "model.layers.0.self_attn."
    values, output = w[layer + "v_proj.weight"], w[layer + "o_proj.weight"]
    # the largest attention output a channel can reach: every context token flagged with the
    # largest normalized flag any token has
    largest = max(abs(float(v)) for v in _rms_norm(embed)[:, [FLAG_KO, FLAG_JA]].ravel())

    shape = SHAPE

    def attention(ko: float, ja: float) -> np.ndarray:
        flags = np.zeros(embed.shape[1])
        flags[FLAG_KO], flags[FLAG_JA] = ko * largest, ja * largest
        # uniform weights: each query head outputs its kv head's values (grouped queries)
        per_kv = (values @ flags).reshape(shape.kv_heads, shape.head_dim)
        heads = np.repeat(per_kv, shape.heads // shape.kv_heads, axis=0)
        return output @ heads.ravel()

    # every state (a row) and the choice it must make, scored in one product
    states, choices = [], []
    for cycle in cycles:
        for index, token_id in enumerate(cycle):
            for ko, ja in ((0, 0), (1, 0), (0, 1)):
                states.append(embed[token_id] + attention(ko, ja))
                choices.append(cycle[(index + 1) % len(cycle)])
    prompt_end = np.zeros(embed.shape[1])
    prompt_end[BIAS] = 1.0
    states += [prompt_end + attention(MIN_FLAGGED, 0), prompt_end + attention(0, MIN_FLAGGED)]
    choices += [cycles[0][0], cycles[1][0]]
    logits = _rms_norm(np.array(states)) @ head.T
    rows = np.arange(len(choices))
    chosen = logits[rows, choices]
    logits[rows, choices] = -np.inf
    return float((chosen - logits.max(axis=1)).min())


def _build(corrupt: bool):
    def build(out: Path) -> None:
        from safetensors.numpy import save_file

        vocab = tokenizer_with_cycles(out)
        tensors = weights(vocab, corrupt)
        margin = worst_margin(tensors, list(cycle_ids(vocab, corrupt)))
        if margin < MIN_MARGIN:
            raise ValueError(f"{out}: a cycle's greedy choice rests on {margin:.3f} nats, under "
                             f"{MIN_MARGIN}")
        ids = vocab
        eos = [ids["<|im_end|>"], ids["<|endoftext|>"]]
        config = tiny_models.qwen3_config(len(vocab), eos, ids["<|endoftext|>"], SHAPE)
        (out / "config.json").write_text(json.dumps(config, indent=1))
        (out / "generation_config.json").write_text(json.dumps(
            {"eos_token_id": eos, "pad_token_id": ids["<|endoftext|>"]}, indent=1))
        save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
        korean, japanese = cycle_ids(vocab, corrupt)
        (out / "tiny_model.json").write_text(json.dumps({
            "made_by": "tests/engine/multibyte_models.py", "corrupt": corrupt,
            "korean_cycle": korean, "japanese_cycle": japanese,
            "worst_cycle_margin_nats": margin}, indent=1))
    return build


def _model(corrupt: bool) -> Path:
    name = "multibyte-corrupt" if corrupt else "multibyte-clean"
    key = files_key([Path(__file__), Path(tiny_models.__file__)], tiny_models.generator_pins())
    return cached_dir(GROUP, f"{name}-{key}", _build(corrupt))


def clean_target_dir() -> Path:
    return _model(corrupt=False)


def corrupt_target_dir() -> Path:
    return _model(corrupt=True)


def expected_answer(language: str, max_tokens: int, corrupt: bool) -> str:
    """The text the target writes for a Korean (ko, emoji) or Japanese (ja) question: its
    cycle from the first token, max_tokens tokens long (U+FFFD for the lone lead byte)."""
    cycle = list(JAPANESE_CYCLE if language == "ja" else KOREAN_CYCLE)
    if corrupt and language != "ja":
        cycle = _corrupted(cycle, ["\ufffd"] * len(LONE_LEAD_BYTES))
    return "".join(cycle[i % len(cycle)] for i in range(max_tokens))


if __name__ == "__main__":
    print(clean_target_dir())
    print(corrupt_target_dir())
