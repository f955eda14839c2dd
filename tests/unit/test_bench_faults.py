"""Injected faults are each detected, named and counted while the other streams are still
measured; a server restart invalidates its block; any of it makes the exit code non-zero."""

import json
import signal
import time
import urllib.error
import urllib.request
from collections import Counter

import pytest

from bench import bench_decode, quality, receipts
from tests.fakes import fake_vllm
from tests.timing import Jitter
from tests.unit.test_bench_accuracy import assert_measured_what_was_sent, assert_median_inside


def _run(fake, tmp_path, *args, jitter: Jitter | None = None):
    out = tmp_path / "result.json"
    with jitter or Jitter():
        code = bench_decode.main(["--url", fake.url, "--warmup", "0", "--quiet", "--json",
                                  str(out), "--phase", "prose", *args])
    return code, json.loads(out.read_text())


def test_each_fault_is_named_counted_and_the_rest_measured(tmp_path, capsys):
    """The healthy streams are judged against what the fake really sent (one token per
    10 ms step as programmed, later on a loaded machine)."""
    # 12 streams in 3 waves of 4; every other arrival gets one fault kind
    faults = "error_event@1,truncate@3,no_done@5,no_usage@7,http400@9,http500@11"
    log, jitter = tmp_path / "requests.jsonl", Jitter()
    with fake_vllm.spawn("--step-seconds", "0.01", "--ttft-seconds", "0.1",
                         "--faults", faults, "--request-log", str(log)) as fake:
        code, doc = _run(fake, tmp_path, "--concurrency", "4", "--runs", "3",
                         "--max-tokens", "61", jitter=jitter)
    assert code == 1
    (cell,) = doc["cells"]
    kinds = Counter(f["kind"] for f in cell["failures"])
    assert kinds == {"error_event": 1, "truncated": 1, "missing_done": 1, "missing_usage": 1,
                     "http_400": 1, "http_500": 1}
    assert cell["failed_streams"] == 6 and cell["measured_streams"] == 6
    measured = [s for w in doc["waves"] for s in w["streams"] if s["ok"]]
    assert len(measured) == 6
    sent = fake_vllm.deliveries(log)
    excess = []
    for stream in measured:
        assert stream["decode_tokens"] == 60
        excess.append(assert_measured_what_was_sent(stream, sent[stream["prefix"]], jitter))
    assert_median_inside(excess, "healthy streams")
    for wave in doc["waves"]:   # every wave kept a figure from its healthy streams
        assert wave["per_stream_tok_s"] is not None
    details = {f["kind"]: f["detail"] for f in cell["failures"]}
    assert "injected error event" in details["error_event"]
    assert "injected server error" in details["http_500"]
    summary = capsys.readouterr().err
    assert "6 of 12 streams failed" in summary
    for kind in kinds:
        assert f"{kind} x1" in summary


def test_restart_between_waves_invalidates_the_block(tmp_path, capsys):
    with fake_vllm.spawn("--step-seconds", "0.01", "--num-spec-tokens", "3",
                         "--accept-pattern", "3,1", "--restart-after", "2") as fake:
        code, doc = _run(fake, tmp_path, "--concurrency", "1", "--runs", "3",
                         "--max-tokens", "31")
    assert code == 1
    (cell,) = doc["cells"]
    assert cell["invalid"] and cell["restarts"] == 1
    assert "process_start_time_seconds changed" in cell["invalid_reason"]
    assert cell["acceptance_length"] is None and cell["spec_decode"] == "invalid"
    assert cell["measured_streams"] == 3 and cell["failed_streams"] == 0
    assert [w["restart"] is not None for w in doc["waves"]] == [False, True, False]
    assert "prose c=1 invalid" in capsys.readouterr().err


def test_a_block_without_restart_after_one_with_it_is_valid(tmp_path):
    """The restart falls in the first block; the second block's counters start afresh."""
    with fake_vllm.spawn("--step-seconds", "0.01", "--num-spec-tokens", "3",
                         "--accept-pattern", "3,1", "--restart-after", "1") as fake:
        code, doc = _run(fake, tmp_path, "--concurrency", "1,2", "--runs", "1",
                         "--max-tokens", "31")
    first, second = doc["cells"]
    assert first["invalid"] and not second["invalid"]
    assert second["acceptance_length"] == 3.0
    assert code == 1


def test_unreachable_server_fails_closed(capsys):
    code = bench_decode.main(["--url", "http://127.0.0.1:9", "--quiet"])
    assert code == 2
    assert "cannot reach http://127.0.0.1:9/health" in capsys.readouterr().err


PREFLIGHTED = {  # every tool that reads a server: its argv after the URL
    "bench": lambda url, out: bench_decode.main(["--url", url, "--quiet"]),
    "receipts": lambda url, out: receipts.main(["solo-vs-concurrent", "--url", url]),
    "quality": lambda url, out: quality.main(["record", "--url", url, "--out", str(out), "--quiet"]),
}


@pytest.mark.parametrize("tool", sorted(PREFLIGHTED))
def test_a_dead_engine_behind_a_live_model_list_fails_closed(tool, tmp_path, capsys):
    # vLLM's /v1/models answers 200 for seconds after its engine died; /health does not.
    with fake_vllm.spawn("--api-outlives-engine", "60") as fake:
        fake.process.send_signal(signal.SIGUSR1)  # the fake's engine core dies
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                urllib.request.urlopen(fake.url + "/health", timeout=2)
            except urllib.error.HTTPError as dead:
                assert dead.code == 503
                break
            time.sleep(0.05)
        assert urllib.request.urlopen(fake.url + "/v1/models", timeout=2).status == 200
        code = PREFLIGHTED[tool](fake.url, tmp_path / "out.json")
    assert code == 2
    assert f"{fake.url}/health answered HTTP 503: the engine is not healthy" in capsys.readouterr().err


def test_model_comes_from_the_server_list(tmp_path):
    log = tmp_path / "requests.jsonl"
    with fake_vllm.spawn("--served-model-name", "served-name", "--request-log", str(log)) as fake:
        code, doc = _run(fake, tmp_path, "--runs", "1", "--concurrency", "1", "--max-tokens", "4")
    assert code == 0
    assert doc["settings"]["model"] == "served-name"
    assert json.loads(log.read_text().splitlines()[0])["body"]["model"] == "served-name"


@pytest.mark.parametrize("tool", sorted(PREFLIGHTED))
def test_several_models_without_model_fails_closed(tool, tmp_path, capsys):
    with fake_vllm.spawn("--served-model-name", "a", "b") as fake:
        code = PREFLIGHTED[tool](fake.url, tmp_path / "out.json")
    assert code == 2
    assert "serves 2 models (a, b): pass --model" in capsys.readouterr().err


def test_bad_options_are_refused_with_the_value(capsys):
    with pytest.raises(SystemExit) as exit_info:
        bench_decode.main(["--concurrency", "1,zero"])
    assert exit_info.value.code == 2
    assert "--concurrency must be comma-separated positive integers" in capsys.readouterr().err


@pytest.mark.parametrize("phase", ["both", "prose,poetry", ""])
def test_an_unknown_phase_is_refused_naming_the_phases(phase, capsys):
    with pytest.raises(SystemExit) as exit_info:
        bench_decode.main(["--phase", phase])
    assert exit_info.value.code == 2
    assert (f"--phase must be all or a comma list of prose, structured, code, turns (all: the "
            f"first 3), got {phase!r}" in capsys.readouterr().err)
