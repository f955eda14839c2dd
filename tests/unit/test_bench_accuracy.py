"""bench_decode against a fake server whose truth is programmed: speeds within 1% of what
the fake really sent (its per-chunk record, so that load cannot flip a verdict), acceptance
exact, and requests shaped as the issue demands."""

import json
import statistics

import pytest

from bench import bench_decode, prompts
from tests.fakes import fake_vllm
from tests.timing import Jitter, span_allowance_s

TOLERANCE = 0.01
STEP_S = 0.01
PATTERN = [5, 2, 0, 3]            # accepted drafts per step, K = 5
CYCLES = 40                        # 160 decode steps: 1.6 s of decode per stream
TOKENS_PER_CYCLE = sum(1 + a for a in PATTERN)             # 14
MAX_TOKENS = 1 + CYCLES * TOKENS_PER_CYCLE                 # the first chunk carries 1 token
# programmed: 350 tok/s a stream over 1.6 s of decode; judged against what was really sent


def _run(fake, tmp_path, *args, jitter: Jitter | None = None):
    out = tmp_path / "result.json"
    with jitter or Jitter():
        code = bench_decode.main(["--url", fake.url, "--warmup", "0", "--quiet", "--json",
                                  str(out), *args])
    return code, json.loads(out.read_text())


def _log(path):
    """The fake's arrival entries (its delivery entries are read by fake_vllm.deliveries)."""
    entries = [json.loads(line) for line in path.read_text().splitlines()]
    return [e for e in entries if "body" in e]


# chunk_times_s are written to the microsecond: a span read back is within this of the one used
STAMP_ROUNDING_S = 1.1e-6


def assert_measured_what_was_sent(stream: dict, sent: fake_vllm.Delivery,
                                  jitter: Jitter) -> float:
    """The bench's figure for one stream, judged against what the fake really sent and when
    (its own per-chunk record), not against the programmed rate: a loaded machine makes the
    fake late, and the bench must then report the late rate. What the bench controls is
    exact: every token-bearing chunk seen once with the server's token count, and tok/s =
    decode tokens over the span from the first such chunk to the last (an off-by-one in
    either moves the span by a step, thousands of times the stamps' rounding). Returns how
    far the bench's span lies outside its allowance (<= 0: inside): 1% of the fake's span
    plus twice the wake-up delay this process measured during the run (tests/timing.py);
    time itself is judged on the median stream of each wave (assert_median_inside)."""
    assert stream["ok"], stream
    times = stream["chunk_times_s"]
    assert len(times) == len(sent.chunk_monotonic)
    if stream["method"] == "continuous_usage":
        assert stream["chunk_tokens"] == sent.chunk_tokens
        assert stream["decode_tokens"] == sent.decode_tokens
    measured_span = stream["decode_tokens"] / stream["tok_s"]
    assert abs(measured_span - (times[-1] - times[0])) <= STAMP_ROUNDING_S, (
        stream["prefix"], measured_span, times[0], times[-1])
    return abs(measured_span - sent.span_s) - span_allowance_s(sent.span_s, jitter, TOLERANCE)


def assert_median_inside(excess_s: list[float], what) -> None:
    """The median stream's span within its allowance. A stream read behind its wave's others
    (the event loop works through a burst in arrival order) can lag more than the sampler's
    own wake-ups show, as one of 16 did beside two busy loops; the median cannot, unless the
    bench's timing itself is wrong."""
    assert statistics.median(excess_s) <= 0, (what, sorted(excess_s))


@pytest.fixture(scope="module")
def drafted_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("accuracy")
    log = tmp / "requests.jsonl"
    jitter = Jitter()
    with fake_vllm.spawn("--num-spec-tokens", "5", "--accept-pattern", ",".join(map(str, PATTERN)),
                         "--step-seconds", str(STEP_S), "--ttft-seconds", "0.25",
                         "--request-log", str(log), model="org/glm-fake") as fake:
        code, doc = _run(fake, tmp, "--phase", "structured", "--concurrency", "1,2,4,8,16",
                         "--runs", "1", "--max-tokens", str(MAX_TOKENS), jitter=jitter)
    return code, doc, _log(log), fake_vllm.deliveries(log), jitter


def test_every_stream_within_one_percent_at_each_concurrency(drafted_run):
    code, doc, _, sent, jitter = drafted_run
    assert code == 0
    seen = set()
    for wave in doc["waves"]:
        seen.add(wave["concurrency"])
        assert len(wave["streams"]) == wave["concurrency"]
        excess = []
        for stream in wave["streams"]:
            assert stream["completion_tokens"] == MAX_TOKENS
            assert stream["decode_tokens"] == MAX_TOKENS - 1
            excess.append(assert_measured_what_was_sent(stream, sent[stream["prefix"]], jitter))
        assert_median_inside(excess, wave["concurrency"])
    assert seen == {1, 2, 4, 8, 16}


def test_aggregate_within_one_percent_of_what_the_server_delivered(drafted_run):
    """All streams' decode tokens over the span from the wave's first chunk to its last, the
    fake's record of that span being the truth (see assert_measured_what_was_sent). The
    arithmetic is exact in every wave; time is judged on the median of the five waves: a
    wave's span ends at one stream's last chunk, and a stream read behind its burst can lag
    more than the sampler's own wake-ups show (assert_median_inside)."""
    _, doc, _, sent, jitter = drafted_run
    excess = []
    for wave in doc["waves"]:
        streams = wave["streams"]
        times = [s["chunk_times_s"] for s in streams]
        span = max(t[-1] for t in times) - min(t[0] for t in times)
        assert abs(sum(s["decode_tokens"] for s in streams) / wave["aggregate_tok_s"]
                   - span) <= STAMP_ROUNDING_S
        delivered = [sent[s["prefix"]] for s in streams]
        sent_span = (max(d.chunk_monotonic[-1] for d in delivered)
                     - min(d.chunk_monotonic[0] for d in delivered))
        assert sum(s["decode_tokens"] for s in streams) == sum(d.decode_tokens for d in delivered)
        excess.append(abs(span - sent_span) - span_allowance_s(sent_span, jitter, TOLERANCE))
    assert len(excess) == 5
    assert_median_inside(excess, "aggregate")


def test_acceptance_is_exact(drafted_run):
    _, doc, _, _, _ = drafted_run
    for cell in doc["cells"]:
        assert cell["spec_decode"] == "measured"
        assert cell["acceptance_length"] == 1 + sum(PATTERN) / len(PATTERN)     # 3.5
        assert cell["draft_acceptance_rate"] == sum(PATTERN) / (5 * len(PATTERN))
        assert cell["per_position_acceptance"] == [
            sum(a > p for a in PATTERN) / len(PATTERN) for p in range(5)]     # .75 .75 .5 .25 .25
        steps = cell["concurrency"] * CYCLES * len(PATTERN)
        assert cell["spec_counters"]["drafts"] == steps
        assert cell["method"] == "continuous_usage"
        assert cell["mean_tokens_per_chunk"] == pytest.approx(MAX_TOKENS / (1 + CYCLES * 4))


def test_every_request_of_a_wave_is_sent_before_any_of_its_streams_ends(drafted_run):
    """The aggregate is a concurrent figure only if the bench sends a wave's requests together:
    every c16 request reached the fake before it finished any c16 stream (an order of events,
    which load cannot swap: a bench sending one by one would wait for the 1.85 s each takes)."""
    _, _, log, sent, _ = drafted_run
    arrivals = [e["arrival_monotonic"] for e in log
                if "c16 " in e["body"]["messages"][0]["content"]]
    ends = [d.chunk_monotonic[-1] for prefix, d in sent.items() if " c16 " in prefix]
    assert len(arrivals) == len(ends) == 16 and max(arrivals) < min(ends)


def test_requests_are_greedy_thinking_off_unique_and_use_the_listed_model(drafted_run):
    _, doc, log, _, _ = drafted_run
    bodies = [entry["body"] for entry in log]
    assert len(bodies) == 1 + 2 + 4 + 8 + 16
    for body in bodies:
        assert body["model"] == "org/glm-fake"
        assert body["temperature"] == 0
        assert body["chat_template_kwargs"] == {"enable_thinking": False}
        assert body["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}
        assert body["max_tokens"] == MAX_TOKENS
    first_lines = [b["messages"][0]["content"].split("]")[0] for b in bodies]
    assert len(set(first_lines)) == len(first_lines)
    assert doc["settings"]["model"] == "org/glm-fake"
    assert doc["server"]["vllm_version"] == "0.30.0"
    assert doc["server"]["models"]["data"][0]["id"] == "org/glm-fake"


def test_code_phase_sends_the_fixed_coding_prompt_greedy_thinking_off_once_per_stream(tmp_path):
    """The code phase as the field's code figures were taken (greedy, thinking off), each
    stream of each wave its own prompt, so no stream is served from another's prefix cache."""
    log = tmp_path / "requests.jsonl"
    with fake_vllm.spawn("--num-spec-tokens", "3", "--step-seconds", "0.002",
                         "--request-log", str(log)) as fake:
        code, doc = _run(fake, tmp_path, "--phase", "code", "--concurrency", "1,2,4",
                         "--runs", "2", "--max-tokens", "24")
    assert code == 0
    task = prompts.phase_messages("code", "")[0]["content"].strip()
    assert task.startswith("Write a complete Python module") and "[bench" not in task
    assert doc["settings"]["phases"] == ["code"]
    assert doc["settings"]["prompts"] == {"code": f"<prefix> {task}"}
    assert [(c["phase"], c["concurrency"]) for c in doc["cells"]] == [
        ("code", 1), ("code", 2), ("code", 4)]
    assert all(c["measured_streams"] == c["streams"] == 2 * c["concurrency"]
               and c["spec_decode"] == "measured" for c in doc["cells"])
    bodies = [entry["body"] for entry in _log(log)]
    assert len(bodies) == 2 * (1 + 2 + 4)
    contents = [b["messages"][0]["content"] for b in bodies]
    assert len(set(contents)) == len(contents)
    bench_id = doc["settings"]["bench_id"]
    expected = {f"[bench {bench_id} code c{c} r{r} s{s}] {task}"
                for c in (1, 2, 4) for r in (1, 2) for s in range(c)}
    assert set(contents) == expected
    for body in bodies:
        assert body["temperature"] == 0
        assert body["chat_template_kwargs"] == {"enable_thinking": False}
        assert body["max_tokens"] == 24 and body["ignore_eos"] is True


def test_no_spec_decode_one_token_per_chunk(tmp_path):
    log, jitter = tmp_path / "requests.jsonl", Jitter()
    with fake_vllm.spawn("--step-seconds", "0.005", "--ttft-seconds", "0.25",
                         "--request-log", str(log)) as fake:
        code, doc = _run(fake, tmp_path, "--phase", "prose", "--concurrency", "16", "--runs", "1",
                         "--max-tokens", "321", jitter=jitter)
    assert code == 0
    (cell,) = doc["cells"]
    assert cell["spec_decode"] == "absent"
    assert cell["acceptance_length"] is None and cell["per_position_acceptance"] is None
    assert cell["mean_tokens_per_chunk"] == 1
    sent = fake_vllm.deliveries(log)
    excess = []
    for stream in doc["waves"][0]["streams"]:
        assert stream["decode_tokens"] == 320
        excess.append(assert_measured_what_was_sent(stream, sent[stream["prefix"]], jitter))
    assert_median_inside(excess, "continuous")


def test_method_is_named_and_matters_when_the_first_chunk_carries_several_tokens(tmp_path):
    """Ten tokens in the first chunk, then one per 10 ms step for 1 s: 100 tok/s is the truth."""
    args = ("--step-seconds", "0.01", "--ttft-seconds", "0.1", "--first-chunk-tokens", "10")
    run = ("--phase", "prose", "--concurrency", "2", "--runs", "1", "--max-tokens", "110")
    log, jitter = tmp_path / "continuous.jsonl", Jitter()
    with fake_vllm.spawn(*args, "--request-log", str(log)) as fake:
        code, doc = _run(fake, tmp_path, *run, jitter=jitter)
    assert code == 0 and doc["cells"][0]["method"] == "continuous_usage"
    sent = fake_vllm.deliveries(log)
    excess = []
    for stream in doc["waves"][0]["streams"]:
        assert stream["decode_tokens"] == 100
        excess.append(assert_measured_what_was_sent(stream, sent[stream["prefix"]], jitter))
    assert_median_inside(excess, "continuous")
    log, jitter = tmp_path / "final-usage.jsonl", Jitter()
    with fake_vllm.spawn(*args, "--no-continuous-usage", "--request-log", str(log)) as fake:
        code, doc = _run(fake, tmp_path, *run, jitter=jitter)
    assert code == 0 and doc["cells"][0]["method"] == "final_usage_first_chunk_one"
    # (completion - 1) counts nine first-chunk tokens as decoded: 109 tokens over the span
    # of 100 (109 tok/s at the programmed rate), and says so
    sent = fake_vllm.deliveries(log)
    excess = []
    for stream in doc["waves"][0]["streams"]:
        assert stream["decode_tokens"] == 109 and sent[stream["prefix"]].decode_tokens == 100
        excess.append(assert_measured_what_was_sent(stream, sent[stream["prefix"]], jitter))
    assert_median_inside(excess, "final usage")
