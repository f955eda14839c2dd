"""The bench's turns phase (issue 40) on a real vLLM engine, with and without drafting: turn 1
shares nothing with earlier requests, every later turn is served its history from the prefix
cache, and the phase's own record agrees with vLLM's /metrics.

vLLM caches whole blocks of a request's tokens, so a turn that resends the last turn's prompt
finds at least its whole blocks: hits >= B * floor(P_previous / B), B the engine's block size
(read from its `vllm:cache_config_info`). The oracle server drafts with a draft model, whose
KV cache sits beside the target's: the hit must not fall to zero there (vLLM #57032 / #56026,
docs/prefix-reuse.md). The receipts' resumed-vs-fresh test checks that resumed turns hit the
cache at all; this one checks how much.
"""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.engine.test_bench_engine import run_bench

TURN_TOKENS = "512,1024,1536"


def block_size(metrics_text: str) -> int:
    for family in text_string_to_metric_families(metrics_text):
        if family.name == "vllm:cache_config_info":
            return int(family.samples[0].labels["block_size"])
    raise AssertionError("the engine's /metrics has no vllm:cache_config_info")


@pytest.mark.parametrize("server", ["plain", "oracle"], indirect=True)
def test_each_later_turn_prefills_only_what_is_new(server, tmp_path):
    block = block_size(server.metrics_text())
    run = run_bench(server, tmp_path, ["--phase", "turns", "--turn-tokens", TURN_TOKENS,
                                       "--max-tokens", "16", "--quiet"])
    assert run.exit_code == 0, run.doc.get("turns")
    turns = run.doc["turns"]["turns"]
    assert [t["ok"] for t in turns] == [True, True, True], turns
    prompts = [t["prompt_tokens"] for t in turns]
    assert all(b > a for a, b in zip(prompts, prompts[1:])), prompts
    first, *later = turns
    # a fresh conversation: at most the chat template's opening, under one block
    assert first["metrics_hits"] == 0, first
    for previous, turn in zip(turns, later):
        whole_blocks = block * (previous["prompt_tokens"] // block)
        assert turn["metrics_hits"] >= whole_blocks, (block, previous, turn)
        assert turn["metrics_hits"] < turn["prompt_tokens"], turn
        # the turn was the engine's one request: its lookups are its own prompt
        assert turn["note"] is None and turn["metrics_queries"] == turn["prompt_tokens"], turn
        assert turn["prefill_source"] == "metrics"  # the fleet omits the usage block's detail
        assert turn["prefill_tokens"] == turn["prompt_tokens"] - turn["metrics_hits"]
        assert turn["prefill_tokens"] <= turn["prompt_tokens"] - previous["prompt_tokens"] + block
