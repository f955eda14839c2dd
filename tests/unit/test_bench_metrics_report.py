"""The /metrics reading, the acceptance arithmetic, the table and the --compare view."""

import json

import pytest

from bench import bench_decode, prompts, report
from bench.server_metrics import acceptance, parse_metrics, restart_between, spec_delta

WITH_TOTAL = """\
# TYPE vllm:spec_decode_num_drafts counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 10.0
vllm:spec_decode_num_drafts_total{engine="1",model_name="m"} 10.0
vllm:spec_decode_num_drafts_created{engine="0",model_name="m"} 1.7e9
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="m"} 100.0
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="m"} 40.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="0"} 18.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="1"} 12.0
process_start_time_seconds 1700000000.5
"""


def test_counters_with_total_are_summed_over_engines_and_created_is_ignored():
    snap = parse_metrics(WITH_TOTAL)
    assert snap.spec == {"drafts": 20.0, "draft_tokens": 100.0, "accepted_tokens": 40.0}
    assert snap.per_position == {0: 18.0, 1: 12.0}
    assert snap.start_time == 1700000000.5


def test_counters_without_total_read_the_same():
    snap = parse_metrics(WITH_TOTAL.replace("_total{", "{"))
    assert snap.spec == {"drafts": 20.0, "draft_tokens": 100.0, "accepted_tokens": 40.0}


def test_no_spec_counters_means_no_speculative_decoding():
    snap = parse_metrics("process_start_time_seconds 5\nvllm:num_requests_running 0\n")
    assert snap.spec is None and snap.error is None
    assert acceptance(spec_delta(snap, snap)) == {
        "acceptance_length": None, "draft_acceptance_rate": None,
        "per_position_acceptance": None}


def test_garbage_metrics_is_an_error_not_a_number():
    snap = parse_metrics("this is { not prometheus\n")
    assert snap.error and snap.spec is None


def test_acceptance_arithmetic_from_deltas():
    before = parse_metrics(WITH_TOTAL)
    after = parse_metrics(WITH_TOTAL.replace("10.0", "15.0").replace(" 40.0", " 55.0")
                          .replace(" 100.0", " 150.0").replace(" 18.0", " 27.0"))
    delta = spec_delta(before, after)
    assert (delta.drafts, delta.draft_tokens, delta.accepted_tokens) == (10.0, 50.0, 15.0)
    assert acceptance(delta) == {"acceptance_length": 2.5, "draft_acceptance_rate": 0.3,
                                 "per_position_acceptance": [0.9, 0.0]}


def test_restart_seen_by_start_time_or_by_counters_going_down():
    before = parse_metrics(WITH_TOTAL)
    moved = parse_metrics(WITH_TOTAL.replace("1700000000.5", "1700000100.0"))
    assert "process_start_time_seconds changed" in restart_between(before, moved)
    reset = parse_metrics(WITH_TOTAL.replace("process_start_time_seconds 1700000000.5\n", "")
                          .replace(" 40.0", " 3.0"))
    assert "accepted_tokens went down" in restart_between(before, reset)
    assert restart_between(before, before) is None


def _cell(phase, c, per_stream, aggregate, accept=3.0):
    def spread(m, lo, hi):
        return {"median": m, "min": lo, "max": hi}
    return {"phase": phase, "concurrency": c, "per_stream_tok_s": spread(*per_stream),
            "aggregate_tok_s": spread(*aggregate), "ttft_s": spread(0.1, 0.09, 0.11),
            "acceptance_length": accept, "draft_acceptance_rate": 0.4, "spec_decode": "measured",
            "failed_streams": 0, "streams": c * 3, "invalid": False, "method": "continuous_usage"}


def _doc(cells):
    return {"schema": report.SCHEMA, "cells": cells}


def test_compare_marks_changes_inside_the_spread_as_noise():
    a = _doc([_cell("prose", 1, (28.0, 27.5, 28.5), (28.0, 27.5, 28.5))])
    b = _doc([_cell("prose", 1, (28.3, 27.9, 28.6), (35.0, 34.0, 36.0))])
    rows = {line.split("|")[3].strip(): line for line in report.compare(a, b).splitlines()[2:]}
    assert rows["per-stream tok/s"].rstrip(" |").endswith("noise")
    assert "+25.0%" in rows["aggregate tok/s"] and rows["aggregate tok/s"].rstrip(" |").endswith(
        "better")
    assert "noise" in rows["TTFT s"]


def test_compare_judges_no_cell_the_bench_invalidated():
    """A cell the server queued holds a c=2 figure under c=4: no better or worse from it."""
    a = _doc([_cell("prose", 4, (28.0, 27.5, 28.5), (56.0, 55.0, 57.0))])
    b = _doc([dict(_cell("prose", 4, (40.0, 39.5, 40.5), (80.0, 79.0, 81.0)), invalid=True)])
    rows = [line for line in report.compare(a, b).splitlines()[2:] if "tok/s" in line]
    assert len(rows) == 2 and all(row.rstrip(" |").endswith("not comparable (invalid in B)")
                                  for row in rows)


def test_compare_cli_reads_files_and_refuses_others(tmp_path, capsys):
    a, b, bad = tmp_path / "a.json", tmp_path / "b.json", tmp_path / "bad.json"
    a.write_text(json.dumps(_doc([_cell("structured", 2, (40, 39, 41), (80, 78, 82))])))
    b.write_text(json.dumps(_doc([_cell("structured", 2, (30, 29, 31), (60, 58, 62))])))
    bad.write_text(json.dumps({"cells": []}))
    assert bench_decode.main(["--compare", str(a), str(b)]) == 0
    out = capsys.readouterr().out
    assert "| structured | 2 | per-stream tok/s |" in out and "-25.0% | worse |" in out
    assert bench_decode.main(["--compare", str(a), str(bad)]) == 2
    assert "not a bench_decode/1 result" in capsys.readouterr().err


def test_markdown_table_has_one_row_per_cell_and_says_when_there_is_no_spec():
    cells = [_cell("prose", 1, (28.2, 28.0, 28.4), (28.2, 28.0, 28.4)),
             dict(_cell("prose", 2, (21.1, 21.0, 21.2), (42.4, 42.0, 42.8)),
                  acceptance_length=None, spec_decode="absent", draft_acceptance_rate=None)]
    table = report.markdown_table(cells).splitlines()
    assert len(table) == 4
    assert table[2].startswith("| prose | 1 | 28.2 (28.0-28.4) |")
    assert "| no spec |" in table[3]


@pytest.fixture()
def contract_doc(tmp_path):
    from tests.fakes import fake_vllm
    out = tmp_path / "r.json"
    with fake_vllm.spawn("--step-seconds", "0.005", "--num-spec-tokens", "2") as fake:
        code = bench_decode.main(["--url", fake.url, "--quiet", "--warmup", "0", "--runs", "2",
                                  "--concurrency", "1,2", "--max-tokens", "16", "--json",
                                  str(out)])
    assert code == 0
    return json.loads(out.read_text())


def test_json_file_keeps_the_documented_contract(contract_doc):
    doc = contract_doc
    assert doc["schema"] == "bench_decode/1"
    assert set(doc) >= {"settings", "server", "waves", "cells", "started_at", "finished_at",
                        "notes", "self_cost"}
    assert set(doc["settings"]) >= {"url", "model", "phases", "concurrency", "runs",
                                    "max_tokens", "request", "prompts", "bench_id"}
    # by default every phase, in order, each prompt recorded with its prefix's place
    assert doc["settings"]["phases"] == ["prose", "structured", "code"]
    assert doc["settings"]["prompts"] == {
        phase: prompts.phase_messages(phase, "<prefix>")[0]["content"] for phase in prompts.PHASES}
    assert [(c["phase"], c["concurrency"]) for c in doc["cells"]] == [
        (phase, c) for phase in prompts.PHASES for c in (1, 2)]
    assert len(doc["waves"]) == 12
    for cell in doc["cells"]:
        for key in ("per_stream_tok_s", "aggregate_tok_s", "ttft_s"):
            assert set(cell[key]) == {"median", "min", "max"}
        for key in ("phase", "concurrency", "acceptance_length", "draft_acceptance_rate",
                    "per_position_acceptance", "failed_streams", "method"):
            assert key in cell
        assert cell["per_position_acceptance"] == [1.0, 1.0]
    stream = doc["waves"][0]["streams"][0]
    assert set(stream) >= {"stream", "prefix", "ok", "failure", "ttft_s", "tok_s",
                           "completion_tokens", "decode_tokens", "method", "chunk_times_s",
                           "chunk_tokens"}


def test_progress_prints_a_line_per_wave_when_not_on_a_terminal(capsys):
    from tests.fakes import fake_vllm
    with fake_vllm.spawn("--step-seconds", "0.002") as fake:
        code = bench_decode.main(["--url", fake.url, "--warmup", "0", "--runs", "2",
                                  "--concurrency", "1", "--phase", "structured",
                                  "--max-tokens", "8"])
    captured = capsys.readouterr()
    assert code == 0
    assert "[1/2] structured c=1 run 1/2: 1/1 streams measured, aggregate" in captured.err
    assert "[2/2] structured c=1 run 2/2" in captured.err
    assert captured.out.startswith("| phase | c | per-stream tok/s |")


def test_live_progress_follows_the_tally(capsys):
    import asyncio

    from bench.progress import BenchProgress
    from bench.stream_client import Tally

    async def one_wave(progress):
        tally = Tally()
        async with progress.wave("prose c=1 run 1/1", 10, tally):
            tally.tokens = 10
            await asyncio.sleep(0.3)
        progress.wave_done("prose c=1 run 1/1", {"aggregate_tok_s": 12.5}, 1, 0)

    with BenchProgress("live", 1) as progress:
        asyncio.run(one_wave(progress))
    err = capsys.readouterr().err
    assert "prose c=1 run 1/1: 1/1 streams measured, aggregate 12.5 tok/s" in err
