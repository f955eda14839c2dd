"""The engine tier's relay check (tests/engine/bench_checks.py) given nothing to judge: it
fails, never passes."""

from tests.engine.bench_checks import check_against_relay


def test_a_bench_with_no_stream_fails_the_relay_check():
    assert check_against_relay({"waves": []}, []) == [
        "the bench measured no stream: nothing to hold against the second client"]


def test_a_stream_the_bench_did_not_measure_fails_it():
    wave = {"t0_monotonic_s": 0.0, "streams": [
        {"prefix": "[x]", "ok": False, "failure": "too_short", "chunk_times_s": []}]}
    relayed_figures = {"every_chunk_has_usage": True, "decode_tokens": 0, "token_chunks": 0}

    class Relayed:
        prefix = "[x] prompt"

        def figures(self):
            return relayed_figures

    assert check_against_relay({"waves": [wave]}, [Relayed()]) == [
        "[x]: the bench did not measure it (too_short)"]
