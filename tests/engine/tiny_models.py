"""Test-time models for the engine tier, made here and never downloaded.

- a byte-level BPE tokenizer trained on text generated here, with a ChatML chat template
  (and the hermes tool-call tags, so vLLM's `hermes` tool parser loads);
- a tiny Qwen3 target with random weights from a fixed seed;
- drafters whose truth is known, for vLLM's `draft_model` speculative method:
  the oracle is the target itself (the drafter computes exactly what the verifier will;
  greedy drafts are all accepted), `random` is another seed of the same shape (about
  nothing accepted), and `blind` is the target whose lm_head cannot name a chosen token
  set: it proposes the target's token everywhere except where the target's next token
  is in that set, so its acceptance follows from the target's own greedy output.

Each model is a directory in the recipe cache keyed by this file's bytes and the versions
of numpy, safetensors and tokenizers (the generators' pins); making one takes seconds.
Weights are float32 so that the drafter and the verifier agree to the last bit that
matters: logits spread several nats (weights drawn wider than a trained model's), so no
greedy choice rests on a rounding difference.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

import numpy as np

from tests.engine.cache import cached_dir, files_key, progress

GROUP = "engine-models"
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# added (not special) so they survive detokenisation; vLLM's hermes parser needs both ids
TOOL_TOKENS = ["<tool_call>", "</tool_call>"]
VOCAB_SIZE = 640  # BPE merges plus the 256 byte symbols and the special tokens

CHAT_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\nTools you may call, one JSON object each:\n"
    "{%- for tool in tools %}\n{{ tool | tojson }}{%- endfor %}<|im_end|>\n{%- endif %}"
    "{%- for message in messages %}<|im_start|>{{ message.role }}\n"
    "{%- if message.content is string %}{{ message.content }}"
    "{%- elif message.content %}{%- for part in message.content %}"
    "{%- if part.type == 'text' %}{{ part.text }}{%- endif %}{%- endfor %}{%- endif %}"
    "{%- if message.tool_calls %}{%- for call in message.tool_calls %}\n<tool_call>\n"
    "{{ {'name': call.function.name, 'arguments': call.function.arguments} | tojson }}"
    "\n</tool_call>{%- endfor %}{%- endif %}<|im_end|>\n{%- endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{%- endif %}"
)


@dataclass(frozen=True)
class TinyShape:
    """A Qwen3 small enough to start in seconds on CPU; head_dim 32 is the CPU attention
    backend's smallest supported head size."""

    hidden: int = 128
    intermediate: int = 256
    layers: int = 2
    heads: int = 4
    kv_heads: int = 2
    head_dim: int = 32
    max_positions: int = 8192


def generator_pins() -> str:
    return " ".join(f"{name}=={metadata.version(name)}"
                    for name in ("numpy", "safetensors", "tokenizers"))


def generator_key(*extra: str) -> str:
    return files_key([Path(__file__)], generator_pins(), *extra)


def training_text() -> list[str]:
    """Text the tokenizer learns from: counting, the bench and receipt prompts' words,
    code-ish and JSON-ish lines, so that common words and numbers are single tokens."""
    lines = [str(n) for n in range(1, 1001)]
    lines += [", ".join(str(n) for n in range(start, start + 10)) for start in range(1, 300, 10)]
    words = (
        "Write a long detailed essay about the history of lighthouses how they were built who "
        "kept them and their lamps changed over the centuries Count from 1 to 200 one number "
        "per line with nothing else short paragraph why painted in bold stripes Python "
        "function that returns n-th Fibonacci number docstring List planets solar system "
        "fact each Now continue say more same subject style weather city location unit "
        "celsius what is the secret code word needle hidden in this text remember it answer "
        "only assistant user system tool call name arguments get_weather the a an of to in "
        "and is it for on with as at by from this that be are was were"
    ).split()
    rng = np.random.default_rng(7)
    for _ in range(400):
        lines.append(" ".join(rng.choice(words, size=12)))
    lines += ['{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}',
              "def fib(n):", "    return n if n < 2 else fib(n - 1) + fib(n - 2)"]
    return lines


def build_tokenizer(out: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE - len(TOOL_TOKENS), special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tokenizer.train_from_iterator(training_text(), trainer=trainer)
    tokenizer.add_tokens(TOOL_TOKENS)
    tokenizer.save(str(out / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": TinyShape.max_positions,
        "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "bos_token": None,
        "unk_token": None, "add_bos_token": False, "add_prefix_space": False,
        "clean_up_tokenization_spaces": False, "chat_template": CHAT_TEMPLATE,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=1))
    (out / "special_tokens_map.json").write_text(json.dumps(
        {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}, indent=1))


def tokenizer_dir() -> Path:
    return cached_dir(GROUP, f"tokenizer-{generator_key('tokenizer')}", _made(build_tokenizer,
                                                                               "tokenizer"))


def _made(build, what: str):
    def run(out: Path) -> None:
        progress(f"engine models: making {what} in {out.parent}")
        build(out)
    return run


def vocab(tokenizer: Path) -> dict[str, int]:
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(tokenizer / "tokenizer.json")).get_vocab(with_added_tokens=True)


def qwen3_weights(seed: int, vocab_size: int, shape: TinyShape) -> dict[str, np.ndarray]:
    """Every tensor Qwen3ForCausalLM loads, drawn from one seeded generator.

    Projections are scaled so the residual stream keeps unit size; the lm_head is drawn
    wide (std 0.5 over 128 dims: logits spread about 6 nats) so greedy choices are far
    apart (no near-ties for float rounding to flip)."""
    rng = np.random.default_rng(seed)
    h, i, d = shape.hidden, shape.intermediate, shape.head_dim

    def normal(*dims: int, std: float) -> np.ndarray:
        return (rng.standard_normal(dims) * std).astype(np.float32)

    tensors = {"model.embed_tokens.weight": normal(vocab_size, h, std=1.0)}
    for layer in range(shape.layers):
        p = f"model.layers.{layer}."
        tensors.update({
            p + "input_layernorm.weight": np.ones(h, np.float32),
            p + "post_attention_layernorm.weight": np.ones(h, np.float32),
            p + "self_attn.q_proj.weight": normal(shape.heads * d, h, std=h ** -0.5),
            p + "self_attn.k_proj.weight": normal(shape.kv_heads * d, h, std=h ** -0.5),
            p + "self_attn.v_proj.weight": normal(shape.kv_heads * d, h, std=h ** -0.5),
            p + "self_attn.o_proj.weight": normal(h, shape.heads * d, std=(shape.heads * d) ** -0.5),
            p + "self_attn.q_norm.weight": np.ones(d, np.float32),
            p + "self_attn.k_norm.weight": np.ones(d, np.float32),
            p + "mlp.gate_proj.weight": normal(i, h, std=h ** -0.5),
            p + "mlp.up_proj.weight": normal(i, h, std=h ** -0.5),
            p + "mlp.down_proj.weight": normal(h, i, std=i ** -0.5),
        })
    tensors["model.norm.weight"] = np.ones(h, np.float32)
    tensors["lm_head.weight"] = normal(vocab_size, h, std=0.5)
    return tensors


def qwen3_config(vocab_size: int, eos_ids: list[int], pad_id: int, shape: TinyShape) -> dict:
    return {
        "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3",
        "vocab_size": vocab_size, "hidden_size": shape.hidden,
        "intermediate_size": shape.intermediate, "num_hidden_layers": shape.layers,
        "num_attention_heads": shape.heads, "num_key_value_heads": shape.kv_heads,
        "head_dim": shape.head_dim, "hidden_act": "silu",
        "max_position_embeddings": shape.max_positions, "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0, "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
        "attention_bias": False, "attention_dropout": 0.0, "tie_word_embeddings": False,
        "use_sliding_window": False, "sliding_window": None, "max_window_layers": shape.layers,
        "initializer_range": 0.02, "bos_token_id": pad_id, "eos_token_id": eos_ids,
        "pad_token_id": pad_id, "torch_dtype": "float32", "dtype": "float32",
        "use_cache": True,
    }


def write_model(out: Path, tensors: dict[str, np.ndarray], tokenizer: Path,
                note: dict) -> None:
    """A model directory vLLM loads: config, safetensors weights, the tokenizer's files."""
    from safetensors.numpy import save_file

    ids = vocab(tokenizer)
    vocab_size = tensors["model.embed_tokens.weight"].shape[0]
    eos = [ids["<|im_end|>"], ids["<|endoftext|>"]]
    config = qwen3_config(vocab_size, eos, ids["<|endoftext|>"], TinyShape())
    (out / "config.json").write_text(json.dumps(config, indent=1))
    (out / "generation_config.json").write_text(json.dumps(
        {"eos_token_id": eos, "pad_token_id": ids["<|endoftext|>"]}, indent=1))
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        (out / name).write_bytes((tokenizer / name).read_bytes())
    (out / "tiny_model.json").write_text(json.dumps(note, indent=1))


def _never_emit(tensors: dict[str, np.ndarray], token_ids) -> None:
    """Zero the lm_head rows of these tokens: their logit is 0 while the winner's, among
    hundreds of 6-nat-wide logits, is far above it, so greedy decoding never picks them."""
    tensors["lm_head.weight"][list(token_ids)] = 0.0


def special_ids(tokenizer: Path) -> list[int]:
    ids = vocab(tokenizer)
    return sorted(ids[t] for t in SPECIAL_TOKENS + TOOL_TOKENS)


def _target_tensors(seed: int, tokenizer: Path) -> dict[str, np.ndarray]:
    tensors = qwen3_weights(seed, len(vocab(tokenizer)), TinyShape())
    # no end-of-turn or tag tokens: every greedy output runs to max_tokens, so outputs of
    # two servers are compared over their whole length
    _never_emit(tensors, special_ids(tokenizer))
    return tensors


TARGET_SEED = 1234
OTHER_SEED = 5678
RANDOM_DRAFTER_SEED = 4242


def _model(name: str, seed: int, blind_to: tuple[int, ...] = ()) -> Path:
    tokenizer = tokenizer_dir()

    def build(out: Path) -> None:
        tensors = _target_tensors(seed, tokenizer)
        if blind_to:
            _never_emit(tensors, blind_to)
        write_model(out, tensors, tokenizer, {"made_by": "tests/engine/tiny_models.py",
                                              "seed": seed, "blind_to": list(blind_to)})

    extra = f"{name} seed={seed} blind={','.join(map(str, blind_to))}"
    key = generator_key(extra, tokenizer.name)
    return cached_dir(GROUP, f"{name}-{key}", _made(build, name))


def target_dir() -> Path:
    """The tiny Qwen3 every engine test serves."""
    return _model("target", TARGET_SEED)


def other_target_dir() -> Path:
    """A different model (another seed) with the same tokenizer: its greedy output is not
    the target's, which a lossless receipt must notice."""
    return _model("other", OTHER_SEED)


def oracle_drafter_dir() -> Path:
    """The oracle drafter is the target itself: under greedy decoding a draft model that
    computes the verifier's own function proposes exactly the tokens it will accept."""
    return target_dir()


def random_drafter_dir() -> Path:
    """Same shape and tokenizer, unrelated weights: its proposals are about never right."""
    return _model("random-drafter", RANDOM_DRAFTER_SEED)


def blind_drafter_dir(token_ids: tuple[int, ...]) -> Path:
    """The target with these tokens removed from its lm_head: it proposes the target's
    token except where that token is one of these, where it must propose another."""
    return _model("blind-drafter", TARGET_SEED, tuple(sorted(token_ids)))


def expected_acceptance(output_ids: list[int], blind_to: set[int] | frozenset[int], k: int,
                        max_tokens: int) -> tuple[int, list[int]]:
    """(drafts, accepted per position) of one greedy request of max_tokens drafted k at a
    time by a drafter blind to blind_to, given the target's greedy output ids (at least
    max_tokens + k of them: the last step drafts past the end). After the prefill's token,
    each step drafts k, accepts the run of upcoming tokens outside blind_to (at most k), and
    the verifier adds one token of its own; steps go on until max_tokens are made."""
    if len(output_ids) < max_tokens + k:
        raise ValueError(f"need {max_tokens + k} output ids, got {len(output_ids)}")
    drafts, per_position, made = 0, [0] * k, 1
    while made < max_tokens:
        drafts += 1
        accepted = 0
        while accepted < k and output_ids[made + accepted] not in blind_to:
            per_position[accepted] += 1
            accepted += 1
        made += accepted + 1
    return drafts, per_position


if __name__ == "__main__":
    for maker in (tokenizer_dir, target_dir, other_target_dir, random_drafter_dir):
        print(maker())
