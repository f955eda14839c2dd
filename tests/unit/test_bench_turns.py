"""The bench's turns phase against a fake server whose prefix cache and prefill time are known:
each turn's prompt, cached and prefill tokens are exactly the fake's, its TTFT at least the
prefill the fake waited, and a broken turn ends the conversation with exit code 1."""

import argparse
import json

import pytest

from bench import bench_decode, plot, report, turns
from bench.server_metrics import parse_metrics, prefix_delta
from tests.fakes import fake_vllm

BLOCK = 16  # the fake's prefix-cache block
PREFILL_TOK_S = 200_000.0  # the fake's prefill rate: 16k uncached tokens wait 0.08 s
TTFT_S = 0.01
TURN_TOKENS = (2048, 8192, 16384)
CALIBRATION_REQUESTS = len(turns.CALIBRATION_LINES)


def fake_args(*extra):
    return ("--prefix-cache-block", str(BLOCK), "--prefill-tok-s", str(PREFILL_TOK_S),
            "--ttft-seconds", str(TTFT_S), "--step-seconds", "0.002", *extra)


def run_turns(tmp_path, *fake_extra, bench_extra=()):
    """(exit code, the result's turns part, the fake's truth per turn: {prompt_tokens, cached_tokens})."""
    log, out = tmp_path / "requests.jsonl", tmp_path / "bench.json"
    with fake_vllm.spawn(*fake_args(*fake_extra), "--request-log", str(log)) as fake:
        code = bench_decode.main(["--url", fake.url, "--phase", "turns", "--warmup", "0", "--quiet",
                                  "--turn-tokens", ",".join(map(str, TURN_TOKENS)),
                                  "--max-tokens", "16", "--json", str(out), *bench_extra])
    entries = [json.loads(line) for line in log.read_text().splitlines()]
    truth = [e for e in entries if "prefix" in e][CALIBRATION_REQUESTS:]
    return code, json.loads(out.read_text())["turns"], truth


def test_each_turn_reports_the_fakes_prompt_cached_and_prefill_tokens(tmp_path):
    code, doc, truth = run_turns(tmp_path, "--enable-prompt-tokens-details")
    assert code == 0
    rows = doc["turns"]
    assert [r["turn"] for r in rows] == [1, 2, 3] and len(truth) == 3
    for row, fact in zip(rows, truth):
        assert row["ok"], row
        assert row["prompt_tokens"] == row["metrics_queries"] == fact["prompt_tokens"]
        assert row["cached_tokens"] == row["metrics_hits"] == fact["cached_tokens"]
        assert row["prefill_tokens"] == fact["prompt_tokens"] - fact["cached_tokens"]
        assert row["prefill_source"] == "usage" and row["note"] is None
        # the fake sends the first token no sooner than its prefill of the uncached tokens
        assert row["ttft_s"] >= TTFT_S + row["prefill_tokens"] / PREFILL_TOK_S
        assert row["decode_tok_s"] > 0
    assert rows[0]["cached_tokens"] == 0  # turn 1 shares nothing with an earlier request
    for earlier, later in zip(rows, rows[1:]):
        # the whole history was resent unchanged: cached is the last prompt, block-floored, at least
        assert later["cached_tokens"] >= earlier["prompt_tokens"] // BLOCK * BLOCK
        assert later["cached_tokens"] % BLOCK == 0


def test_the_prompts_grow_to_the_asked_sizes(tmp_path):
    code, doc, _ = run_turns(tmp_path, "--enable-prompt-tokens-details")
    per_line = doc["sizing"]["tokens_per_line"]
    assert code == 0 and per_line > 0
    for row, target in zip(doc["turns"], TURN_TOKENS):
        # to two log lines: the history is counted as its prompt and answer tokens, and the
        # answer's re-rendering in the next prompt (template, text) differs by a few tokens
        assert abs(row["prompt_tokens"] - target) <= 2 * per_line, (row["prompt_tokens"], target)


def test_without_prompt_tokens_details_the_prefill_comes_from_the_metrics(tmp_path):
    code, doc, truth = run_turns(tmp_path)
    assert code == 0
    for row, fact in zip(doc["turns"], truth):
        assert row["cached_tokens"] is None
        assert row["metrics_hits"] == fact["cached_tokens"]
        assert row["prefill_tokens"] == fact["prompt_tokens"] - fact["cached_tokens"]
        assert row["prefill_source"] == "metrics"
    assert doc["turns"][-1]["prefill_tokens"] < doc["turns"][-1]["prompt_tokens"]


def test_a_broken_turn_ends_the_conversation_and_fails_the_run(tmp_path, capsys):
    # chat requests: the two sizing requests, then turn 1, then turn 2 (truncated)
    code, doc, _ = run_turns(tmp_path, "--enable-prompt-tokens-details",
                             "--faults", f"truncate@{CALIBRATION_REQUESTS + 2}")
    assert code == 1
    assert [r["turn"] for r in doc["turns"]] == [1, 2]
    assert doc["turns"][0]["ok"] and doc["turns"][1]["failure"] == "truncated"
    err = capsys.readouterr().err
    assert "turns: turn 2: truncated" in err and "1 later turn(s) not run" in err


def test_turns_are_opt_in_and_sizes_must_grow():
    parser = bench_decode.build_parser()
    assert parser.parse_args([]).phases == ["prose", "structured", "code"]
    assert parser.parse_args(["--phase", "all,turns"]).phases == ["prose", "structured", "code", "turns"]
    assert parser.parse_args(["--phase", "turns"]).phases == ["turns"]
    for bad in ("8192,4096", "100,8192", "8192,8192", "lots"):
        with pytest.raises(argparse.ArgumentTypeError):
            turns.turn_tokens(bad)


PREFIX_METRICS = """\
vllm:prefix_cache_queries_total{engine="0",model_name="m"} 1000.0
vllm:prefix_cache_hits_total{engine="0",model_name="m"} 400.0
"""


def test_prefix_cache_counters_are_read_and_a_restart_voids_their_delta():
    before = parse_metrics(PREFIX_METRICS)
    assert before.prefix == {"queries": 1000.0, "hits": 400.0}
    after = parse_metrics(PREFIX_METRICS.replace("1000.0", "9000.0").replace("400.0", "6000.0"))
    assert prefix_delta(before, after) == {"queries": 8000.0, "hits": 5600.0}
    assert prefix_delta(after, before) is None  # counters went down: another server life
    assert parse_metrics("process_start_time_seconds 5\n").prefix is None


def doc_with(ttfts, cached):
    rows = [{"turn": i + 1, "prompt_tokens": 1000 * (i + 1), "cached_tokens": c, "metrics_hits": c,
             "prefill_tokens": 1000 * (i + 1) - c, "ttft_s": t, "decode_tok_s": 50.0}
            for i, (t, c) in enumerate(zip(ttfts, cached))]
    return {"settings": {"turn_tokens": [1000, 2000]}, "turns": rows}


def test_the_table_and_the_comparison_show_ttft_by_turn():
    before, after = doc_with([0.5, 2.0], [0, 0]), doc_with([0.5, 0.25], [0, 1536])
    table = turns.markdown_table(after)
    assert "| 2 | 2,000 | 1,536 | 1,536 | 464 | 0.250 | 50.0 |" in table
    compared = turns.compare(before, after)
    assert "| 2 | 2,000 / 2,000 | 0 / 1,536 | 2,000 / 464 | 2.000 | 0.250 | -87.5% |" in compared
    assert turns.compare(before, None) is None


def test_the_plot_draws_ttft_and_cached_tokens_by_turn():
    doc = {"schema": report.SCHEMA, "settings": {}, "cells": [], "turns": doc_with([0.5, 0.25], [0, 1536])}
    fig = plot.bench_figure(doc)
    ttft_ax, tokens_ax = fig.axes[4], fig.axes[5]
    heights = {p.get_gid(): p.get_height() for ax in (ttft_ax, tokens_ax) for p in ax.patches}
    assert heights["turns/ttft_s/1"] == 0.25
    assert heights["turns/cached/1"] == 1536 and heights["turns/prefilled/1"] == 464
