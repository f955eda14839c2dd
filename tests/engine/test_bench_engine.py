"""bench_decode.py against real vLLM: every phase at c=1,2,4 through a relay that measures
the same streams as a second client, on the oracle-drafted, the undrafted and the blind-
drafted servers; and planted faults that the same checks catch."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from bench import bench_decode, stream_client
from tests.engine.bench_checks import (
    check_against_relay,
    check_methods,
    check_oracle,
    check_oracle_beyond_near_ties,
    check_undrafted,
    check_usage,
    counter,
    streams,
)
from tests.engine.conftest import K
from tests.engine.engine_server import EngineServer
from tests.engine.relay import Relay, RelayedStream

REPO_ROOT = Path(__file__).resolve().parents[2]
# 1 + a whole number of (k+1)-token steps (no step cut short by max_tokens), and about 2 s
# of decode per stream, so that a reader's scheduling delay of 20 ms stays within 1%
MAX_TOKENS = 1 + 80 * (K + 1)
BENCH_ARGS = ["--phase", "all", "--concurrency", "1,2,4", "--runs", "1",
              "--max-tokens", str(MAX_TOKENS), "--quiet"]


@dataclass
class BenchRun:
    doc: dict
    relayed: list[RelayedStream]
    generated: float  # growth of the engine's vllm:generation_tokens over the run
    exit_code: int


def run_bench(server: EngineServer, tmp_path, args=BENCH_ARGS, in_process=False) -> BenchRun:
    """The bench against `server` through a relay; in_process runs bench_decode.main here
    (so a test can plant a fault in its code), else the script as a user runs it."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    out = tmp_path / f"bench-{server.name}.json"
    before = counter(server.metrics_text(), "vllm:generation_tokens")
    with Relay(server.url) as relay:
        argv = ["--url", relay.url, *args, "--json", str(out)]
        if in_process:
            code = bench_decode.main(argv)
        else:
            code = subprocess.run([sys.executable, str(REPO_ROOT / "bench" / "bench_decode.py"),
                                   *argv], capture_output=True, text=True, timeout=900,
                                  check=False).returncode
    after = counter(server.metrics_text(), "vllm:generation_tokens")
    return BenchRun(json.loads(out.read_text()), relay.streams, after - before, code)


@pytest.fixture(scope="module")
def runs() -> dict[str, BenchRun]:
    return {}


@pytest.fixture
def bench_run(server, runs, tmp_path_factory) -> BenchRun:
    """The full bench (every phase, c=1,2,4) on the parametrised server, run once a module."""
    if server.name not in runs:
        runs[server.name] = run_bench(server, tmp_path_factory.mktemp(server.name))
    return runs[server.name]


@pytest.fixture(scope="module")
def blind_run(server_blind, tmp_path_factory) -> BenchRun:
    return run_bench(server_blind, tmp_path_factory.mktemp("blind"),
                     ["--phase", "prose", "--concurrency", "2", "--runs", "1",
                      "--max-tokens", str(MAX_TOKENS), "--quiet"])


BOTH = pytest.mark.parametrize("server", ["oracle", "plain"], indirect=True)
ORACLE = pytest.mark.parametrize("server", ["oracle"], indirect=True)
PLAIN = pytest.mark.parametrize("server", ["plain"], indirect=True)


@BOTH
def test_every_cell_of_every_phase_uses_the_exact_method(bench_run):
    assert bench_run.exit_code == 0
    cells = {(c["phase"], c["concurrency"]) for c in bench_run.doc["cells"]}
    assert cells == {(p, c) for p in ("prose", "structured", "code") for c in (1, 2, 4)}
    assert check_methods(bench_run.doc) == []


@ORACLE
def test_oracle_drafter_every_draft_accepted(bench_run, server_plain):
    """Every draft accepted on every path without a near-tie (the bench's prompts are new
    each run, so each path's margins are read from the undrafted server)."""
    assert check_oracle_beyond_near_ties(bench_run.doc, K, server_plain) == []


@PLAIN
def test_undrafted_server_spec_fields_absent(bench_run):
    assert check_undrafted(bench_run.doc) == []


@BOTH
def test_completion_tokens_equal_the_servers_usage(bench_run):
    assert all(s["completion_tokens"] == MAX_TOKENS for w in bench_run.doc["waves"]
               for s in w["streams"])
    assert check_usage(bench_run.doc, bench_run.relayed, bench_run.generated) == []


@BOTH
def test_per_stream_tok_s_matches_a_second_client(bench_run):
    """Within 1% per stream plus the bench's own read delays, measured chunk by chunk on
    the clock the relay stamps, with no chunk stamped before it came; the same decode tokens
    and chunks; judged once, with no second try."""
    assert check_against_relay(bench_run.doc, bench_run.relayed) == []


def test_a_bench_stamping_chunks_before_they_came_is_caught(server_oracle, tmp_path,
                                                           monkeypatch):
    """A planted bench whose stamps run 250 ms ahead of the chunks' arrival (as a bench timing
    from when it asked rather than when it read would): the relay check names a chunk of
    every stream (each would have to be read 250 ms late throughout to escape)."""
    line = stream_client._StreamParse.line
    monkeypatch.setattr(stream_client._StreamParse, "line",
                        lambda self, text, now: line(self, text, now - 0.25))
    run = run_bench(server_oracle, tmp_path, ["--phase", "structured", "--concurrency", "2",
                                              "--runs", "1", "--max-tokens", "41", "--quiet"],
                    in_process=True)
    problems = check_against_relay(run.doc, run.relayed)
    assert len(problems) == len(streams(run.doc)) == 2, problems
    assert all("before the second client read it" in p for p in problems), problems


def test_blind_drafter_is_caught_by_the_oracle_check(blind_run):
    """A drafter wrong wherever the next token is one of a third of the vocabulary: the
    bench measures it (some but not all drafts accepted, rates falling with position) and
    the oracle check, which passes for the oracle, fails on it."""
    cell, = blind_run.doc["cells"]
    rates = cell["per_position_acceptance"]
    assert 1.0 < cell["acceptance_length"] < K + 1
    assert rates == sorted(rates, reverse=True) and rates[0] < 1.0
    problems = check_oracle(blind_run.doc, K)
    assert problems and "acceptance length" in problems[0]


def _off_by_one(field_name):
    finish = stream_client._finish

    def planted(record, parse, t_sent):
        record = finish(record, parse, t_sent)
        if record.ok:
            setattr(record, field_name, getattr(record, field_name) + 1)
            if field_name == "decode_tokens":
                record.tok_s = record.decode_tokens / (record.t_last_s - record.t_first_s)
        return record
    return planted


@pytest.mark.parametrize("field_name, caught_by", [
    ("completion_tokens", check_usage), ("decode_tokens", check_against_relay)])
def test_a_planted_off_by_one_in_the_token_accounting_is_caught(
        server_oracle, tmp_path, monkeypatch, field_name, caught_by):
    monkeypatch.setattr(stream_client, "_finish", _off_by_one(field_name))
    run = run_bench(server_oracle, tmp_path, ["--phase", "structured", "--concurrency", "2",
                                              "--runs", "1", "--max-tokens", "41", "--quiet"],
                    in_process=True)
    args = (run.doc, run.relayed, run.generated) if caught_by is check_usage else (
        run.doc, run.relayed)
    problems = caught_by(*args)
    assert len(problems) >= 2 and all("bench" in p or "warm-up" in p for p in problems)
