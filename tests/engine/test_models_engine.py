"""The test-time models: made here in seconds, cached by key, and their truth holds on the
real engine: the oracle drafter's drafts are all accepted, the blind drafter's acceptance is
exactly what the target's own greedy output predicts, position by position."""

from __future__ import annotations

import json
import os

import pytest
from tokenizers import Tokenizer

from tests.engine import tiny_models
from tests.engine.conftest import K
from tests.engine.engine_client import (
    counter_growth,
    greedy_ids,
    greedy_path,
    near_ties,
    spec_counters,
)

PROMPTS = ("Write a long, detailed essay about the history of lighthouses.",
           "Count from 1 to 200, one number per line, with nothing else.")
# not a whole number of steps: the last step drafts past max_tokens, as the bench's do not
MAX_TOKENS = 123


def test_models_are_cached_by_key_and_made_in_seconds(models):
    assert tiny_models.target_dir() == models.target  # a second call finds the cached one
    config = json.loads((models.target / "config.json").read_text())
    assert config["architectures"] == ["Qwen3ForCausalLM"]
    assert (models.target / ".complete").is_file()
    note = json.loads((models.blind_drafter / "tiny_model.json").read_text())
    assert note["seed"] == tiny_models.TARGET_SEED and set(note["blind_to"]) == models.blind_to


def test_tokenizer_round_trips_and_has_the_tool_tags(models):
    tokenizer = Tokenizer.from_file(str(models.tokenizer / "tokenizer.json"))
    text = "Count from 1 to 200: 17, 18, 19 <tool_call> {\"name\": \"get_weather\"} </tool_call>"
    assert tokenizer.decode(tokenizer.encode(text).ids, skip_special_tokens=False) == text
    vocab = tokenizer.get_vocab(with_added_tokens=True)
    assert {"<tool_call>", "</tool_call>", "<|im_start|>", "<|im_end|>"} <= set(vocab)
    assert len(tokenizer.encode("Count from 1 to 200").ids) <= 8  # trained on such text


def test_expected_acceptance_follows_the_blind_set():
    ids = [7, 1, 2, 3, 4, 5, 6, 8, 9, 10, 11, 12, 13]
    # oracle: every step accepts k=3 and adds one: 1 -> 5 -> 9 (>= 9 made)
    assert tiny_models.expected_acceptance(ids, set(), 3, 9) == (2, [2, 2, 2])
    # blind to 2: first step accepts [1] then stops at 2 (the verifier makes 2) -> made 3;
    # next drafts 3,4,5 all accepted -> made 7; next 6,8,9 -> made 11
    assert tiny_models.expected_acceptance(ids, {2}, 3, 9) == (3, [3, 2, 2])
    with pytest.raises(ValueError):
        tiny_models.expected_acceptance(ids[:5], set(), 3, 9)


@pytest.mark.parametrize("server", ["oracle", "blind"], indirect=True)
def test_drafter_acceptance_is_exactly_as_predicted(server, server_plain, models):
    """Drafted tokens equal undrafted ones and acceptance is as the undrafted path predicts,
    on paths where no token won by less than MARGIN_FLOOR_NATS (checked, with the
    undrafted server's own top-2 logprobs): rounding cannot flip them."""
    drafted = server.name
    blind_to = models.blind_to if drafted == "blind" else frozenset()
    for prompt in PROMPTS:
        truth, margins = greedy_path(server_plain, prompt, MAX_TOKENS + K)
        # drafter and verifier round differently: only a clear path fixes every draft's fate
        assert near_ties(margins) == [], (prompt, near_ties(margins))
        before = spec_counters(server)
        drafted_ids = greedy_ids(server, prompt, MAX_TOKENS)
        drafts, per_position = counter_growth(before, spec_counters(server), K)
        assert drafted_ids == truth[:MAX_TOKENS]  # drafting changed no token
        expected = tiny_models.expected_acceptance(truth, blind_to, K, MAX_TOKENS)
        assert (drafts, per_position) == expected, prompt
        if drafted == "blind":  # the set is hit: neither all nor none accepted
            assert 0 < sum(per_position) < K * drafts


def test_engines_leave_their_temporary_files_in_the_sessions_directory(server_plain, engine_tmpdir):
    """The engines' gloo stores and IPC sockets go to the session's directory (removed at its
    end, conftest.engine_tmpdir), not to the system's."""
    assert os.environ["TMPDIR"] == str(engine_tmpdir)
    names = [path.name for path in engine_tmpdir.iterdir()]
    assert any(name.startswith("vllm_dist_") for name in names), (
        f"no engine wrote its gloo store to {engine_tmpdir}: {sorted(names)[:10]}")
