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


class _Relayed:
    def __init__(self, prefix: str, figures: dict):
        self.prefix, self._figures = f"{prefix} prompt", figures

    def figures(self) -> dict:
        return self._figures


def _burst(decode_tokens: int):
    """A stream of nine chunks read in a 16 ms burst, its stamps chosen so that rounding
    them to the microsecond (as the bench writes them) lengthens the span by almost 1 us;
    tok/s is the bench's over the unrounded span of DECODE_TOKENS tokens."""
    exact = [0.1000004999 + 0.002 * i for i in range(8)] + [0.1162195001]
    record = {"prefix": "[b]", "ok": True, "decode_tokens": decode_tokens,
              "chunk_times_s": [round(t, 6) for t in exact],
              "tok_s": 40 / (exact[-1] - exact[0])}
    relay = {"every_chunk_has_usage": True, "decode_tokens": 40, "token_chunks": 9,
             "token_chunk_stamps": [100.0 + t - 0.0002 for t in exact],
             "span_s": exact[-1] - exact[0], "tok_s": 40 / (exact[-1] - exact[0])}
    return {"waves": [{"t0_monotonic_s": 100.0, "streams": [record]}]}, [_Relayed("[b]", relay)]


def test_a_burst_whose_written_stamps_are_rounded_passes_its_own_span():
    """The clean-clone run of cb0ebf7: a 16 ms burst's span, rounded to the microsecond at
    both ends, moved its own tok/s by 2.8e-5, past the fixed 1e-5 the check allowed."""
    doc, relayed = _burst(40)
    assert check_against_relay(doc, relayed) == []


def test_a_tok_s_that_is_not_the_streams_own_fails_even_on_a_burst():
    doc, relayed = _burst(39)  # tok/s computed over 40 tokens, the record says 39
    problems = check_against_relay(doc, relayed)
    assert len(problems) == 2 and "its own tokens over its own span" in problems[1], problems
