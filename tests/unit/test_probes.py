"""bench/probes.py against the fake in answer mode: every probe passes an obedient server,
fails (naming what came back) each planted fault, copes with vLLM's response shapes, times
the needle's prefill against the fake's programmed one, and refuses what it cannot run."""

import asyncio
import http.server
import json
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from bench import probes
from bench.probing import client, multibyte, serving, tool_cycles, tools, verdict
from tests.fakes import fake_vllm
from tests.timing import HANG_GUARD_S

REPO_ROOT = Path(__file__).resolve().parents[2]
FAST = ("--answer-probes", "--step-seconds", "0.0005", "--ttft-seconds", "0.005")
PROMPT_TOKENS = 2048
PREFILL_TOK_S = 4000.0   # a 0.5 s prefill: scheduling jitter of a loaded machine stays < 1%
TTFT_S = 0.01


def _run(*args, tmp_path):
    out = tmp_path / "probes.json"
    code = probes.main([*args, "--prompt-tokens", str(PROMPT_TOKENS), "--json", str(out),
                        "--quiet"])
    return code, (json.loads(out.read_text()) if out.exists() else None)


def _requests(log: Path) -> list[dict]:
    return [json.loads(line)["body"] for line in log.read_text().splitlines()
            if '"body"' in line]


@pytest.fixture(scope="module")
def obedient(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("probes")
    log = tmp / "requests.jsonl"
    with fake_vllm.spawn("--answer-probes", "--step-seconds", "0.0005", "--ttft-seconds",
                         str(TTFT_S), "--prefill-tok-s", str(PREFILL_TOK_S), "--request-log",
                         str(log), model="org/glm-fake") as fake:
        out = tmp / "probes.json"
        code = probes.main(["--base-url", fake.url + "/v1", "--prompt-tokens",
                            str(PROMPT_TOKENS), "--json", str(out), "--quiet"])
        yield code, json.loads(out.read_text()), _requests(log)


def test_an_obedient_server_passes_every_probe(obedient):
    code, doc, _ = obedient
    assert code == 0 and doc["passed"] and doc["failed"] == []
    assert list(doc["probes"]) == list(probes.PROBE_NAMES)
    assert {r["status"] for r in doc["probes"].values()} == {"pass"}
    counting = doc["probes"]["counting"]["details"]
    assert (counting["longest_run"], counting["run_first"], counting["run_last"]) == (200, 1, 200)
    assert counting["complete"]
    tool = doc["probes"]["tool_call"]["details"]
    assert tool["arguments"] == {"location": "Paris"} and tool["tool_calls_shape"] == "list"
    assert "23 degrees" in doc["probes"]["tool_conversation"]["details"]["turn2_content"]


def test_needle_sits_at_95_percent_of_a_prompt_of_the_asked_length(obedient):
    _, doc, requests = obedient
    needle = doc["probes"]["needle"]["details"]
    assert needle["found"] and needle["calibration"] == "usage"
    assert abs(needle["prompt_tokens"] / PROMPT_TOKENS - 1) < 0.01, needle["prompt_tokens"]
    assert needle["needle_depth"] == pytest.approx(0.95, abs=0.005)
    sent = next(r for r in requests if r.get("stream"))["messages"][0]["content"]
    assert sent.index(f"Note {needle['needle_note']}: The secret passcode is "
                      f"{needle['needle']}.") / len(sent) \
        == pytest.approx(needle["needle_depth"], abs=1e-4)
    assert sent.startswith(f"[probe {needle['salt']}]")


def test_prefill_rate_equals_the_fakes_programmed_prefill(obedient):
    """The fake sends the first token at ttft + prompt tokens / rate after the request."""
    _, doc, _ = obedient
    needle = doc["probes"]["needle"]["details"]
    tokens = needle["prompt_tokens"]
    truth = tokens / (TTFT_S + tokens / PREFILL_TOK_S)
    assert needle["prefill_tok_s"] == pytest.approx(tokens / needle["ttft_s"])
    assert abs(needle["prefill_tok_s"] / truth - 1) < 0.04, (needle["prefill_tok_s"], truth)


def test_every_request_is_greedy_with_thinking_off(obedient):
    _, _, requests = obedient
    # counting, 2 calibrations + needle, tool call, thinking, 2 turns of the conversation,
    # 11 multibyte runs, 4 tool cycles of two turns each
    assert len(requests) == 8 + 11 + 8
    for body in requests:
        assert body["temperature"] == 0.0
        assert body["chat_template_kwargs"] == {"enable_thinking": False}


def test_second_turn_returns_the_servers_tool_call_and_its_result(obedient):
    _, _, requests = obedient
    second = [r for r in requests if r.get("tools") == [tools.WEATHER_TOOL]][-1]["messages"]
    assert [m["role"] for m in second] == ["user", "assistant", "tool"]
    call = second[1]["tool_calls"][0]
    assert call["function"] == {"name": "get_weather", "arguments": '{"location": "Paris"}'}
    assert second[2]["tool_call_id"] == call["id"]
    assert json.loads(second[2]["content"]) == tools.WEATHER_RESULT


def test_needle_salt_and_passcode_differ_run_to_run(tmp_path):
    log = tmp_path / "requests.jsonl"
    with fake_vllm.spawn(*FAST, "--request-log", str(log)) as fake:
        seen = [_run("--base-url", fake.url, "--only", "needle", tmp_path=tmp_path)[1]
                for _ in range(2)]
    details = [doc["probes"]["needle"]["details"] for doc in seen]
    assert all(doc["passed"] for doc in seen)
    assert details[0]["salt"] != details[1]["salt"]
    assert details[0]["needle"] != details[1]["needle"]
    # the calibration requests start with their own salt: none shares the probe's prefix
    heads = [body["messages"][0]["content"].split("]")[0] for body in _requests(log)]
    assert len(heads) == 6 and len(set(heads)) == 4
    assert heads[2] == f"[probe {details[0]['salt']}" and heads[5] == f"[probe {details[1]['salt']}"


FAILURES = [
    # (fake arguments, probe, status, words the summary must hold)
    (("--count-skip", "70,140"), "counting", "fail",
     "longest consecutive run 69 (1..69) of 198 numbers, needs 80"),
    (("--count-stop", "79"), "counting", "fail", "longest consecutive run 79 (1..79)"),
    (("--answer-faults", "needle_missing"), "needle", "fail",
     "came back: 'I found no passcode in the document.'"),
    (("--answer-faults", "tool_as_text"), "tool_call", "fail",
     "came back as text in content, not as a parsed tool_calls entry"),
    (("--answer-faults", "tool_none"), "tool_call", "fail",
     ("no tool_calls entry (tool_calls absent, finish_reason stop); content: "
      "'I cannot look up the weather.'")),
    (("--answer-faults", "tool_none", "--empty-tool-calls", "null"), "tool_call", "fail",
     "no tool_calls entry (tool_calls null"),
    (("--answer-faults", "tool_bad_arguments"), "tool_call", "fail",
     "get_weather arguments are not JSON: '{location: Paris'"),
    (("--answer-faults", "tool_wrong_name"), "tool_call", "fail",
     "called 'get_time', not get_weather"),
    (("--answer-faults", "think_in_content"), "thinking_off", "fail",
     "content holds 2 think tag(s): '<think>Let me think"),
    (("--answer-faults", "reasoning_leak"), "thinking_off", "fail",
     ("reasoning holds 37 chars: 'Let me think about this step by step.'; usage counts 8 "
      "reasoning tokens")),
    (("--answer-faults", "reasoning_leak", "--reasoning-field", "reasoning_content"),
     "thinking_off", "fail", "reasoning_content holds 37 chars"),
    (("--answer-faults", "tool_as_text"), "tool_conversation", "fail",
     "turn 1: the call came back as text in content"),
    (("--answer-faults", "tool_result_ignored"), "tool_conversation", "fail",
     ("turn 2 does not use the tool result (23 C, light drizzle): "
      "'I do not know the weather there.'")),
    (("--answer-faults", "tool_again"), "tool_conversation", "fail",
     "turn 2 called a tool again instead of answering"),
    (("--answer-faults", "not_json"), "thinking_off", "error",
     ("no answer to judge: HTTP 200 but the body is not JSON: "
      "'<html><body>502 Bad Gateway</body></html>'")),
    (("--faults", "http500@1"), "counting", "error",
     "no answer to judge: HTTP 500: fake: injected server error"),
    (("--faults", "http400@3"), "needle", "error",
     "no answer to judge: http_400: fake: injected bad request"),
    (("--faults", "truncate@3"), "needle", "error", "no answer to judge: truncated: "),
    # the integrity probes: multibyte counts in the answer, the reasoning and the token bytes
    (("--answer-faults", "mb_replacement"), "multibyte", "fail",
     "0 clean, 11 faulty, 0 inconclusive of 11 runs; U+FFFD in the answer by run: 4, 4, 4, "),
    (("--answer-faults", "mb_surrogate"), "multibyte", "fail",
     ("first: run 1 ko-field: fault: 0 U+FFFD, 1 lone surrogates, 0 control chars, 0 mojibake "
      "runs in the answer")),
    (("--answer-faults", "mb_control"), "multibyte", "fail",
     ("ko-field: fault: 0 U+FFFD, 0 lone surrogates, 1 control chars, 0 mojibake runs in the "
      "answer")),
    (("--answer-faults", "mb_reasoning"), "multibyte", "fail",
     ("in the answer; 1 U+FFFD, 0 lone surrogates, 0 control chars, 0 mojibake runs in the "
      "reasoning")),
    (("--answer-faults", "mb_token_bytes"), "multibyte", "fail",
     ("ko-field: fault: 0 U+FFFD, 0 lone surrogates, 0 control chars, 0 mojibake runs in the "
      "answer; no repeating tail; 1 invalid UTF-8 sequences in ")),
    # one word of UTF-8 read as CP1252 (한국 as í•œêµ­) inside clean Korean or Japanese
    (("--answer-faults", "mb_mojibake"), "multibyte", "fail",
     ("0 clean, 11 faulty, 0 inconclusive of 11 runs; U+FFFD in the answer by run: 0, 0, 0, 0, "
      "0, 0, 0, 0, 0, 0, 0; first: run 1 ko-field: fault: 0 U+FFFD, 0 lone surrogates, 0 "
      "control chars, 1 mojibake runs in the answer; no repeating tail; 0 invalid UTF-8")),
    # one sentence said 40 times to the end: the field's degenerate repetition
    (("--answer-faults", "mb_loop"), "multibyte", "fail",
     ("first: run 1 ko-field: fault: 0 U+FFFD, 0 lone surrogates, 0 control chars, 0 mojibake "
      "runs in the answer; the answer ends repeating ' 이런 단위를 여러 층으로 쌓아 복잡한 관계를 "
      "배웁니다. 신경망은' 40 times")),
    # tool cycles: markup, JSON, the arguments' round trip, a repeating tail, a call loop
    (("--answer-faults", "tool_markup_leak"), "tool_cycles", "fail",
     ("0 of 4 cycles clean; 0 of 0 calls' JSON parsed, 0 round-tripped, 0 faulty text(s), 2 "
      "markup leak(s), 0 repeating tail(s), 0 of 4 answers used the tool result: ko-weather "
      "call: tool markup <tool_call> </tool_call> <arg_key> </arg_key> <arg_value> </arg_value> "
      "in the content")),
    (("--answer-faults", "tool_broken_json"), "tool_cycles", "fail",
     "ko-weather call: get_weather arguments are not JSON: '{\"city\": \"서울특별'"),
    (("--answer-faults", "tool_changed_arguments"), "tool_cycles", "fail",
     ('ko-weather: get_weather arguments came back {"city": "서\ufffd특별시"}, asked '
      '{"city": "서울특별시"}')),
    (("--answer-faults", "tool_repeating_tail"), "tool_cycles", "fail",
     "ko-weather answer 1: the content ends repeating ' 네, 저장했어요.' 12 times (121 chars)"),
    (("--answer-faults", "tool_again"), "tool_cycles", "fail",
     "ko-weather: still calling tools after 2 extra calls, no answer"),
    # every text of a cycle judged whole: one U+FFFD in the answer after the tool result, one
    # lone surrogate in its reasoning, one U+FFFD in the content streamed beside a call
    (("--answer-faults", "tool_answer_replacement"), "tool_cycles", "fail",
     ("0 of 4 cycles clean; 2 of 2 calls' JSON parsed, 2 round-tripped, 2 faulty text(s), 0 "
      "markup leak(s), 0 repeating tail(s), 2 of 4 answers used the tool result: ko-weather "
      "answer 1: 1 U+FFFD, 0 lone surrogates, 0 control chars, 0 mojibake runs in the content: "
      "'도구 결\ufffd과를 확인했습니다: ")),
    (("--answer-faults", "tool_reasoning_surrogate"), "tool_cycles", "fail",
     ("ko-weather answer 1: 0 U+FFFD, 1 lone surrogates, 0 control chars, 0 mojibake runs in "
      "the reasoning: '결과를 읽어 보면 \\ud83d 좋습니다.'")),
    (("--answer-faults", "tool_call_content_replacement"), "tool_cycles", "fail",
     ("ko-weather call: 1 U+FFFD, 0 lone surrogates, 0 control chars, 0 mojibake runs in the "
      "content: '확인해 볼게요\ufffd.'")),
    # the answer must use the tool's result: quote the number it returned
    (("--answer-faults", "tool_answer_ok"), "tool_cycles", "fail",
     ("0 of 4 cycles clean; 2 of 2 calls' JSON parsed, 2 round-tripped, 0 faulty text(s), 0 "
      "markup leak(s), 0 repeating tail(s), 0 of 4 answers used the tool result: ko-weather: "
      "the answer does not use the tool result (no 21, its temperature_c): 'OK.'; ja-weather: "
      "the answer does not use the tool result (no 17, its temperature_c): 'OK.'")),
    (("--answer-faults", "tool_result_ignored"), "tool_cycles", "fail",
     ("ko-weather: the answer does not use the tool result (no 21, its temperature_c): "
      "'I do not know the weather there.'")),
]


@pytest.mark.parametrize("fake_args,probe,status,summary", FAILURES,
                         ids=[f"{f[1]}-{'-'.join(f[0][1::2])}" for f in FAILURES])
def test_each_planted_fault_fails_its_probe_naming_what_came_back(tmp_path, capsys, fake_args,
                                                                   probe, status, summary):
    with fake_vllm.spawn(*FAST, *fake_args) as fake:
        code, doc = _run("--base-url", fake.url, "--only", probe, tmp_path=tmp_path)
    result = doc["probes"][probe]
    assert code == 1 and not doc["passed"] and doc["failed"] == [probe]
    assert result["status"] == status and summary in result["summary"], result["summary"]
    out = capsys.readouterr().out
    assert f"FAIL {probe}: {result['summary']}" in out
    assert f"probes: FAIL (0 of 1 passed; failed: {probe})" in out


INCONCLUSIVE = [
    (("--answer-faults", "mb_short"), "0 clean, 0 faulty, 11 inconclusive of 11 runs; ko-field: "
                                      "inconclusive (answer of 120 chars, under 400)"),
    (("--answer-faults", "mb_empty"), "ko-field: inconclusive (empty answer (finish_reason stop))"),
    (("--answer-faults", "mb_off_language"),
     ("8 clean, 0 faulty, 3 inconclusive of 11 runs; ja-perceptron: inconclusive (off-language: "
      "0% of its letters in kana and kanji, under 60%)")),
    (("--faults", "http500@1"), ("10 clean, 0 faulty, 1 inconclusive of 11 runs; ")),
    # logprobs given without their bytes: the byte check did not run, so no run is clean
    (("--answer-faults", "mb_no_token_bytes"),
     ("0 clean, 0 faulty, 11 inconclusive of 11 runs; token byte check not run on run(s) 1, 2, "
      "3, 4, 5, 6, 7, 8, 9, 10, 11 (no token bytes given); ko-field: inconclusive (token byte "
      "check not run: no token bytes given): 0 U+FFFD, 0 lone surrogates, 0 control chars, 0 "
      "mojibake runs in the answer; no repeating tail; token byte check not run: no token bytes "
      "given; ")),
]


@pytest.mark.parametrize("fake_args,summary", INCONCLUSIVE,
                         ids=["-".join(f[0][1::2]) for f in INCONCLUSIVE])
def test_a_short_empty_off_language_or_failed_answer_is_inconclusive_never_a_pass(
        tmp_path, capsys, fake_args, summary):
    with fake_vllm.spawn(*FAST, *fake_args) as fake:
        code, doc = _run("--base-url", fake.url, "--only", "multibyte", tmp_path=tmp_path)
    result = doc["probes"]["multibyte"]
    assert code == 1 and not doc["passed"] and doc["failed"] == ["multibyte"]
    assert result["status"] == "inconclusive" and summary in result["summary"], result["summary"]
    assert {run["verdict"] for run in result["details"]["runs"]} >= {"inconclusive"}
    assert "fault" not in {run["verdict"] for run in result["details"]["runs"]}
    out = capsys.readouterr().out
    assert f"INCONCLUSIVE multibyte: {result['summary']}" in out
    assert "probes: FAIL (0 of 1 passed; failed: multibyte)" in out


def test_a_failed_multibyte_run_says_what_came_back(tmp_path):
    with fake_vllm.spawn(*FAST, "--faults", "http500@1") as fake:
        _, doc = _run("--base-url", fake.url, "--only", "multibyte", tmp_path=tmp_path)
    failed = [run for run in doc["probes"]["multibyte"]["details"]["runs"]
              if run["verdict"] == "inconclusive"]
    assert [run["why"] for run in failed] == [
        "no answer: HTTP 500: fake: injected server error"]


def test_multibyte_reports_each_run_and_sends_the_fields_prompt_three_times(obedient):
    _, doc, requests = obedient
    details = doc["probes"]["multibyte"]["details"]
    runs = details["runs"]
    assert [run["name"] for run in runs] == [name for name, _, _, count in multibyte.MULTIBYTE_RUNS
                                             for _ in range(count)]
    assert [run["run"] for run in runs] == list(range(1, 12))
    for run in runs:
        assert run["verdict"] == "clean" and run["chars"] >= 400, run
        assert run["script_share"] >= 0.9 and run["token_bytes"]["invalid"] == 0
        assert run["answer_faults"] == {"replacement": 0, "surrogates": 0, "controls": 0,
                                        "mojibake": 0}
        assert run["byte_check"] == "run" and run["answer_repeat"] is None
        assert run["counts"].startswith("0 U+FFFD, 0 lone surrogates, 0 control chars, 0 "
                                        "mojibake runs in the answer; no repeating tail; 0 "
                                        "invalid UTF-8 sequences in ")
        assert f"{run['chars']} chars, " in run["shape"]
    assert all(run["emoji"] >= 5 for run in runs if run["language"] == "emoji")
    asked = [r for r in requests if r.get("logprobs")]
    assert len(asked) == 11 and all(r["max_tokens"] == 700 for r in asked)
    assert [r["messages"][0]["content"] for r in asked].count(
        "한국어로 퍼셉트론과 신경망의 차이를 자세히 설명해 주세요. 최소 400자 이상으로 작성하세요.") == 3
    assert details["replacement"] == [0] * 11 and details["clean"] == 11
    assert details["byte_check_not_run"] == []
    assert doc["probes"]["multibyte"]["summary"] == (
        "11 clean, 0 faulty, 0 inconclusive of 11 runs: no U+FFFD, lone surrogate, control "
        "character, mojibake, repeating tail or invalid token byte, every run's token bytes "
        "checked")


def test_a_server_that_refuses_logprobs_is_asked_again_without_them(tmp_path):
    """Its text is judged all the same, but the byte check did not run: the run is
    inconclusive, not clean, and the probe's verdict names the run."""
    with fake_vllm.spawn(*FAST, "--faults", "http400@1") as fake:
        code, doc = _run("--base-url", fake.url, "--only", "multibyte", tmp_path=tmp_path)
    result = doc["probes"]["multibyte"]
    runs = result["details"]["runs"]
    unchecked = [run for run in runs if run["note"]]
    assert code == 1 and result["status"] == "inconclusive" and len(unchecked) == 1
    assert unchecked[0]["note"] == ("logprobs refused (HTTP 400: fake: injected bad request): "
                                    "token bytes unchecked")
    assert unchecked[0]["token_bytes"] is None and unchecked[0]["verdict"] == "inconclusive"
    assert unchecked[0]["byte_check"] == "not run"
    assert unchecked[0]["counts"].endswith("token byte check not run: no token bytes given")
    assert result["details"]["byte_check_not_run"] == [unchecked[0]["run"]]
    assert result["summary"].startswith(
        f"10 clean, 0 faulty, 1 inconclusive of 11 runs; token byte check not run on run(s) "
        f"{unchecked[0]['run']} (no token bytes given); ")


def test_tool_cycles_stream_pinned_non_ascii_calls_and_send_the_results_back(obedient):
    _, doc, requests = obedient
    details = doc["probes"]["tool_cycles"]["details"]
    assert (details["clean_cycles"], details["calls"], details["calls_parsed"],
            details["round_trips"], details["results_used"], details["text_faults"]) \
        == (4, 4, 4, 4, 4, 0)
    assert [c["expects"] for c in details["cycles"]] == ["21", "482", "17", "736"]
    assert [c["name"] for c in details["cycles"]] == ["ko-weather", "ko-note", "ja-weather",
                                                      "ja-note"]
    cycles = [r for r in requests if r.get("tools") == tool_cycles.CYCLE_TOOLS]
    assert len(cycles) == 8 and all(r["stream"] for r in cycles)
    # the Korean conversation's last turn: both cycles, each call answered by its result
    last = [r for r in cycles if "서울" in r["messages"][0]["content"]][-1]["messages"]
    assert [m["role"] for m in last] == ["user", "assistant", "tool", "assistant", "user",
                                         "assistant", "tool"]
    assert json.loads(last[1]["tool_calls"][0]["function"]["arguments"]) == {"city": "서울특별시"}
    assert last[2]["tool_call_id"] == last[1]["tool_calls"][0]["id"]
    assert "맑음 ☀️" in last[2]["content"]   # sent as text, not as \u escapes


def test_a_run_of_exactly_80_passes_counting(tmp_path):
    with fake_vllm.spawn(*FAST, "--count-stop", "80") as fake:
        code, doc = _run("--base-url", fake.url, "--only", "counting", tmp_path=tmp_path)
    assert code == 0
    assert doc["probes"]["counting"]["details"]["longest_run"] == 80
    assert not doc["probes"]["counting"]["details"]["complete"]


@pytest.mark.parametrize("shape", [("--reasoning-field", "reasoning_content"),
                                   ("--empty-tool-calls", "null"),
                                   ("--empty-tool-calls", "list"),
                                   ("--no-continuous-usage",)])
def test_vllm_response_shapes_all_pass(tmp_path, shape):
    """reasoning vs reasoning_content, tool_calls absent / null / [], usage only at the end."""
    with fake_vllm.spawn(*FAST, *shape) as fake:
        code, doc = _run("--base-url", fake.url, tmp_path=tmp_path)
    assert code == 0, {name: r["summary"] for name, r in doc["probes"].items()}


def test_only_runs_the_chosen_probes_in_their_order(tmp_path):
    log = tmp_path / "requests.jsonl"
    with fake_vllm.spawn(*FAST, "--request-log", str(log)) as fake:
        code, doc = _run("--base-url", fake.url, "--only", "thinking_off,counting",
                         tmp_path=tmp_path)
    assert code == 0 and list(doc["probes"]) == ["counting", "thinking_off"]
    assert doc["settings"]["only"] == ["thinking_off", "counting"]
    assert [b["messages"][0]["content"] for b in _requests(log)] == [
        serving.COUNT_QUESTION, serving.THINKING_QUESTION]


def test_unknown_probe_name_is_refused(capsys):
    with pytest.raises(SystemExit) as exit_info:
        probes.main(["--only", "counting,vibes"])
    assert exit_info.value.code == 2
    assert "unknown probe(s) vibes: choose from counting, needle" in capsys.readouterr().err


def test_json_alone_goes_to_stdout_with_the_verdicts_on_stderr(capsys):
    with fake_vllm.spawn(*FAST) as fake:
        code = probes.main(["--base-url", fake.url, "--only", "tool_call", "--json", "--quiet"])
    captured = capsys.readouterr()
    doc = json.loads(captured.out)
    assert code == 0 and doc["probes"]["tool_call"]["passed"]
    assert "PASS tool_call: get_weather" in captured.err
    assert "probes: PASS (1 of 1)" in captured.err


def test_json_shape_is_the_documented_one(obedient):
    _, doc, _ = obedient
    assert doc["schema"] == "probes/1"
    assert set(doc) == {"schema", "passed", "failed", "base_url", "model", "vllm_version",
                        "max_model_len", "started_at", "finished_at", "settings", "probes"}
    assert doc["model"] == "org/glm-fake" and doc["vllm_version"] == "0.30.0"
    # the fixture passed URL/v1: the base URL is kept without it
    assert doc["max_model_len"] == 327680 and doc["base_url"].startswith("http://127.0.0.1:")
    assert not doc["base_url"].endswith("/v1")
    assert set(doc["settings"]) == {"only", "prompt_tokens", "timeout_s", "request"}
    for result in doc["probes"].values():
        assert set(result) == {"passed", "status", "summary", "seconds", "details"}
        assert result["seconds"] >= 0
    section = (REPO_ROOT / "docs" / "probes.md").read_text()
    for key in [*doc, *doc["settings"], *doc["probes"]["needle"], *probes.PROBE_NAMES]:
        assert f"`{key}`" in section, key
    for name in probes.PROBE_NAMES:
        for key in doc["probes"][name]["details"]:
            assert f"`{key}`" in section, (name, key)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_unreachable_server_exits_2_with_one_line(capsys):
    port = _free_port()
    code = probes.main(["--base-url", f"http://127.0.0.1:{port}", "--quiet"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1
    assert err.startswith(f"probes: cannot reach http://127.0.0.1:{port}/health")
    assert err.endswith("is the server up? pass --base-url")


def test_a_server_that_is_not_openai_compatible_exits_2(capsys):
    class NotFound(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(404)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), NotFound)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        code = probes.main(["--base-url", f"http://127.0.0.1:{server.server_port}", "--quiet"])
    finally:
        server.shutdown()
        server.server_close()
    assert code == 2 and "answered HTTP 404: is" in capsys.readouterr().err


def test_prompt_beyond_max_model_len_is_refused_before_any_request(tmp_path, capsys):
    log = tmp_path / "requests.jsonl"
    with fake_vllm.spawn(*FAST, "--request-log", str(log)) as fake:
        code = probes.main(["--base-url", fake.url, "--prompt-tokens", "327680", "--quiet"])
    assert code == 2 and not log.exists()
    assert ("--prompt-tokens 327680 plus 48 answer tokens exceed fake/model's max_model_len "
            "327680: pass --prompt-tokens 327632 or less") in capsys.readouterr().err


def test_prompt_too_short_for_the_needle_is_refused(capsys):
    with fake_vllm.spawn(*FAST) as fake:
        code = probes.main(["--base-url", fake.url, "--only", "needle", "--prompt-tokens", "256",
                            "--quiet"])
    err = capsys.readouterr().err
    assert code == 2 and "--prompt-tokens 256 leaves room for" in err and "or more" in err


def test_longest_run_finds_the_longest_stretch_anywhere():
    assert serving.longest_run([]) == (0, None, None)
    assert serving.longest_run([5]) == (1, 5, 5)
    assert serving.longest_run([1, 2, 3, 9, 10, 11, 12, 2, 3]) == (4, 9, 12)
    assert serving.longest_run([1, 2, 2, 3, 4]) == (3, 2, 4)


@pytest.mark.parametrize("message,shape,calls", [
    ({"content": "x"}, "absent", []),
    ({"content": "x", "tool_calls": None}, "null", []),
    ({"content": "x", "tool_calls": []}, "list", []),
    ({"content": None, "tool_calls": [{"id": "a"}]}, "list", [{"id": "a"}]),
])
def test_parse_answer_reads_every_tool_calls_shape(message, shape, calls):
    answer = client.parse_answer({"choices": [{"message": message, "finish_reason": "stop"}]})
    assert (answer.tool_calls_shape, answer.tool_calls) == (shape, calls)
    assert answer.content == (message["content"] or "")


def test_parse_answer_without_a_message_is_a_probe_error():
    with pytest.raises(verdict.ProbeError, match=r"HTTP 200 without choices\[0\]\.message"):
        client.parse_answer({"object": "error", "message": "x"})


def test_needle_sizing_without_usage_falls_back_to_four_characters_a_token(monkeypatch):
    async def no_usage(target, text):
        return None

    monkeypatch.setattr(serving, "_prompt_tokens_of", no_usage)
    target = client.Target(None, "http://unused", "m", 4096)
    notes, sizing = asyncio.run(serving.size_needle_prompt(target))
    prompt = serving.needle_prompt("s" * 20, "XXXX-XXXX", notes)
    assert sizing["calibration"] == "estimated_4_chars"
    assert abs(len(prompt.text) / 4 / 4096 - 1) < 0.01


def test_the_command_runs_as_a_script_with_json_on_stdout():
    """How other tiers call it: the file itself, from any directory."""
    with fake_vllm.spawn(*FAST, "--answer-faults", "reasoning_leak") as fake:
        result = subprocess.run([sys.executable, str(REPO_ROOT / "bench" / "probes.py"),
                                 "--base-url", fake.url, "--only", "thinking_off,tool_call",
                                 "--json"], cwd="/", capture_output=True, text=True,
                                check=False, timeout=HANG_GUARD_S)
    doc = json.loads(result.stdout)
    assert result.returncode == 1 and doc["failed"] == ["thinking_off"]
    assert doc["probes"]["tool_call"]["passed"]
    assert "FAIL thinking_off: reasoning holds 37 chars" in result.stderr
    assert "probes: thinking_off ..." in result.stderr


@pytest.mark.parametrize("answer,used", [
    ("서울은 지금 21도이고 맑습니다.", True),
    ("京都は今２１度で小雨です。", True),           # full-width digits, as Japanese may write
    ("메모를 저장했어요 (번호 21).", True),
    ("OK.", False),
    ("2021년 기록으로는 맑았습니다.", False),      # inside a longer number
    ("기온은 213도입니다.", False),
    ("", False),
])
def test_the_answer_uses_the_result_when_it_quotes_its_number(answer, used):
    assert tool_cycles.quotes(answer, "21") is used
