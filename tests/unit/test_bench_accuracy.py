"""bench_decode against a fake server whose truth is programmed: speeds within 1%,
acceptance exact, and requests shaped as the issue demands."""

import json
from collections import defaultdict

import pytest

from bench import bench_decode
from tests.fakes import fake_vllm

TOLERANCE = 0.01
STEP_S = 0.01
PATTERN = [5, 2, 0, 3]            # accepted drafts per step, K = 5
CYCLES = 40                        # 160 decode steps: 1.6 s of decode per stream
TOKENS_PER_CYCLE = sum(1 + a for a in PATTERN)             # 14
MAX_TOKENS = 1 + CYCLES * TOKENS_PER_CYCLE                 # the first chunk carries 1 token
DECODE_S = CYCLES * len(PATTERN) * STEP_S
PER_STREAM_TRUTH = CYCLES * TOKENS_PER_CYCLE / DECODE_S    # 350 tok/s


def _run(fake, tmp_path, *args):
    out = tmp_path / "result.json"
    code = bench_decode.main(["--url", fake.url, "--warmup", "0", "--quiet", "--json", str(out),
                              *args])
    return code, json.loads(out.read_text())


def _log(path):
    """The fake's arrival entries (it also logs deliveries, which these tests do not need)."""
    entries = [json.loads(line) for line in path.read_text().splitlines()]
    return [e for e in entries if "body" in e]


def _aggregate_truth(log, phase, per_stream_tokens, decode_s):
    """Programmed aggregate per (concurrency, run): the fake starts each stream's schedule at
    its own arrival, so the wave's decode span is the programmed decode time plus the spread
    of arrivals the server saw."""
    arrivals = defaultdict(list)
    for entry in log:
        tag = entry["body"]["messages"][0]["content"].split("]")[0]   # "[bench ID phase cN rR sS"
        _, _, ph, c, r, _ = tag.split(" ")
        if ph == phase:
            arrivals[(int(c[1:]), int(r[1:]))].append(entry["arrival_monotonic"])
    return {key: len(ts) * per_stream_tokens / (decode_s + max(ts) - min(ts))
            for key, ts in arrivals.items()}


@pytest.fixture(scope="module")
def drafted_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("accuracy")
    log = tmp / "requests.jsonl"
    with fake_vllm.spawn("--num-spec-tokens", "5", "--accept-pattern", ",".join(map(str, PATTERN)),
                         "--step-seconds", str(STEP_S), "--ttft-seconds", "0.25",
                         "--request-log", str(log), model="org/glm-fake") as fake:
        code, doc = _run(fake, tmp, "--phase", "structured", "--concurrency", "1,2,4,8,16",
                         "--runs", "1", "--max-tokens", str(MAX_TOKENS))
    return code, doc, _log(log)


def test_every_stream_within_one_percent_at_each_concurrency(drafted_run):
    code, doc, _ = drafted_run
    assert code == 0
    seen = set()
    for wave in doc["waves"]:
        seen.add(wave["concurrency"])
        assert len(wave["streams"]) == wave["concurrency"]
        for stream in wave["streams"]:
            assert stream["ok"], stream
            assert stream["completion_tokens"] == MAX_TOKENS
            assert stream["decode_tokens"] == MAX_TOKENS - 1
            assert abs(stream["tok_s"] / PER_STREAM_TRUTH - 1) < TOLERANCE, (wave["concurrency"],
                                                                            stream["tok_s"])
    assert seen == {1, 2, 4, 8, 16}


def test_aggregate_within_one_percent_of_what_the_server_delivered(drafted_run):
    _, doc, log = drafted_run
    truth = _aggregate_truth(log, "structured", MAX_TOKENS - 1, DECODE_S)
    for wave in doc["waves"]:
        expected = truth[(wave["concurrency"], wave["run"])]
        assert abs(wave["aggregate_tok_s"] / expected - 1) < TOLERANCE, (wave["concurrency"],
                                                                         wave["aggregate_tok_s"],
                                                                         expected)
        # and the truth is near c x per-stream: the arrivals were close together
        assert expected > 0.9 * wave["concurrency"] * PER_STREAM_TRUTH


def test_acceptance_is_exact(drafted_run):
    _, doc, _ = drafted_run
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


def test_programmed_prefill_outlasts_the_send_burst(drafted_run):
    """The 1% claim needs the bench to have sent every request before first tokens arrive
    (true of real prefill); the fake's 0.25 s TTFT must cover the arrival spread it saw."""
    _, _, log = drafted_run
    arrivals = [e["arrival_monotonic"] for e in log
                if "c16 " in e["body"]["messages"][0]["content"]]
    assert len(arrivals) == 16 and max(arrivals) - min(arrivals) < 0.25


def test_requests_are_greedy_thinking_off_unique_and_use_the_listed_model(drafted_run):
    _, doc, log = drafted_run
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


def test_no_spec_decode_one_token_per_chunk(tmp_path):
    with fake_vllm.spawn("--step-seconds", "0.005", "--ttft-seconds", "0.25") as fake:
        code, doc = _run(fake, tmp_path, "--phase", "prose", "--concurrency", "16", "--runs", "1",
                         "--max-tokens", "321")
    assert code == 0
    (cell,) = doc["cells"]
    assert cell["spec_decode"] == "absent"
    assert cell["acceptance_length"] is None and cell["per_position_acceptance"] is None
    assert cell["mean_tokens_per_chunk"] == 1
    for stream in doc["waves"][0]["streams"]:
        assert abs(stream["tok_s"] / 200.0 - 1) < TOLERANCE


def test_method_is_named_and_matters_when_the_first_chunk_carries_several_tokens(tmp_path):
    """Ten tokens in the first chunk, then one per 10 ms step for 1 s: 100 tok/s is the truth."""
    args = ("--step-seconds", "0.01", "--ttft-seconds", "0.1", "--first-chunk-tokens", "10")
    run = ("--phase", "prose", "--concurrency", "2", "--runs", "1", "--max-tokens", "110")
    with fake_vllm.spawn(*args) as fake:
        code, doc = _run(fake, tmp_path, *run)
    assert code == 0 and doc["cells"][0]["method"] == "continuous_usage"
    assert abs(doc["cells"][0]["per_stream_tok_s"]["median"] / 100.0 - 1) < TOLERANCE
    with fake_vllm.spawn(*args, "--no-continuous-usage") as fake:
        code, doc = _run(fake, tmp_path, *run)
    assert code == 0 and doc["cells"][0]["method"] == "final_usage_first_chunk_one"
    # (completion - 1) counts nine first-chunk tokens as decoded: 109 tok/s, and says so
    assert doc["cells"][0]["per_stream_tok_s"]["median"] == pytest.approx(109.0, rel=TOLERANCE)
