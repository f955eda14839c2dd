"""bench/probes.py against real vLLM serving the random tiny target (chat template of ours,
vLLM's hermes tool parser): every probe judges a real response shape, none errors out; the
random model fails counting (longest run reported), the needle reports prefill tok/s, and
the tool probes (tool_cycles streamed) fail cleanly: a random model writes no tool call.

And the multibyte probe can fail on real vLLM: a tiny target whose greedy answer carries four
lone UTF-8 lead byte tokens in its Korean cycle fails it, and the same target without those
bytes passes it, every run conclusive and none looping (tests/engine/multibyte_models.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench.probes import PROBE_NAMES
from bench.probing.multibyte import MULTIBYTE_RUNS
from bench.probing.serving import longest_run
from recipekit.text_integrity import FIELD_MAX_TOKENS, FIELD_PROMPT
from tests.engine import multibyte_models
from tests.engine.conftest import TINY_CONTEXT
from tests.engine.engine_client import post_json

REPO_ROOT = Path(__file__).resolve().parents[2]
PROMPT_TOKENS = TINY_CONTEXT // 2
# the random target: every probe but multibyte, whose truth the two targets below give
ON_THE_RANDOM_TARGET = [name for name in PROBE_NAMES if name != "multibyte"]


def run_probes(url: str, out: Path, *args: str) -> tuple[int, str, dict]:
    result = subprocess.run([sys.executable, str(REPO_ROOT / "bench" / "probes.py"),
                             "--base-url", url, "--json", str(out), "--quiet", *args],
                            capture_output=True, text=True, timeout=900, check=False)
    return result.returncode, result.stdout + result.stderr, json.loads(out.read_text())


@pytest.fixture(scope="module")
def probed(server_plain, tmp_path_factory) -> tuple[int, str, dict]:
    out = tmp_path_factory.mktemp("probes") / "probes.json"
    return run_probes(server_plain.url, out, "--prompt-tokens", str(PROMPT_TOKENS),
                      "--only", ",".join(ON_THE_RANDOM_TARGET))


def test_every_probe_judged_a_real_response(probed):
    code, output, doc = probed
    assert code == 1, output  # judged and failed, not "could not run" (2) or a crash
    assert list(doc["probes"]) == ON_THE_RANDOM_TARGET
    assert {name: p["status"] for name, p in doc["probes"].items()
            if p["status"] == "error"} == {}, output
    assert "Traceback" not in output


def test_counting_fails_on_the_random_model_with_its_longest_run(probed):
    _, output, doc = probed
    counting = doc["probes"]["counting"]
    details = counting["details"]
    assert counting["status"] == "fail" and details["longest_run"] < 80
    assert f"longest consecutive run {details['longest_run']}" in counting["summary"]
    assert f"FAIL counting: {counting['summary']}" in output
    # the reported run is the one in what the model really wrote
    numbers = [int(word) for word in
               details["content"].replace(",", " ").replace("\n", " ").split() if word.isdigit()]
    assert longest_run(numbers)[0] <= details["longest_run"]


def test_needle_reports_prefill_tok_s_of_a_prompt_of_the_asked_length(probed):
    needle = probed[2]["probes"]["needle"]["details"]
    assert needle["prefill_tok_s"] > 0 and needle["ttft_s"] > 0
    # docs/probes.md says within 1%, measured against the fake's 4-characters-a-token;
    # with this byte-level BPE vLLM counted 2,027 of 2,048 (1.03%) here
    assert abs(needle["prompt_tokens"] - PROMPT_TOKENS) <= PROMPT_TOKENS * 0.02
    assert needle["prefill_tok_s"] == pytest.approx(needle["prompt_tokens"] / needle["ttft_s"])


def test_tool_probes_fail_cleanly_on_a_model_that_writes_no_tool_call(probed):
    probes = probed[2]["probes"]
    for name in ("tool_call", "tool_conversation", "tool_cycles"):
        assert probes[name]["status"] == "fail", probes[name]
    assert probes["tool_call"]["details"]["tool_calls_shape"] in ("absent", "null", "list")
    # streamed through vLLM's hermes parser: the first cycle of each conversation asked, no
    # call came, and the conversation stopped there
    cycles = probes["tool_cycles"]["details"]["cycles"]
    assert [c["name"] for c in cycles] == ["ko-weather", "ja-weather"]
    assert all("no get_weather call" in " ".join(c["problems"]) for c in cycles), cycles


def test_thinking_off_judged_on_the_real_shape(probed):
    thinking = probed[2]["probes"]["thinking_off"]
    # the template has no thinking and the random text holds no think tags
    assert thinking["status"] == "pass", thinking
    assert thinking["details"]["reasoning_field"] is None


# ----------------------------------------------------------------------------- multibyte


@pytest.fixture(scope="module")
def multibyte(server_multibyte_clean, server_multibyte_corrupt, tmp_path_factory):
    """The multibyte probe on both targets: (exit code, output, document) by target."""
    folder = tmp_path_factory.mktemp("multibyte")
    return {name: run_probes(server.url, folder / f"{name}.json", "--only", "multibyte")
            for name, server in (("clean", server_multibyte_clean),
                                 ("corrupt", server_multibyte_corrupt))}


def expected_excerpt(language: str, corrupt: bool) -> str:
    from bench.probing.verdict import excerpt

    return excerpt(multibyte_models.expected_answer(language, FIELD_MAX_TOKENS, corrupt))


def test_the_clean_target_passes_multibyte_every_run_conclusive(multibyte):
    code, output, doc = multibyte["clean"]
    result = doc["probes"]["multibyte"]
    assert code == 0 and result["status"] == "pass", output
    runs = result["details"]["runs"]
    assert [run["name"] for run in runs] == [name for name, _, _, count in MULTIBYTE_RUNS
                                             for _ in range(count)]
    for run in runs:
        assert run["verdict"] == "clean" and run["why"] == "clean", run
        # 700 tokens, one character each, all in the asked script; the emoji runs' emoji
        assert run["chars"] == FIELD_MAX_TOKENS and run["script_share"] == 1.0, run
        assert run["completion_tokens"] == FIELD_MAX_TOKENS
        assert run["content"] == expected_excerpt(run["language"], corrupt=False), run
        assert run["token_bytes"] == {**run["token_bytes"], "tokens": FIELD_MAX_TOKENS,
                                      "invalid": 0}
    assert all(run["emoji"] == len(multibyte_models.EMOJI) for run in runs
               if run["language"] != "ja")
    assert all(run["answer_repeat"] is None and run["byte_check"] == "run" for run in runs)


def test_the_corrupting_target_fails_multibyte_on_its_korean_runs(multibyte):
    code, output, doc = multibyte["corrupt"]
    result = doc["probes"]["multibyte"]
    assert code == 1 and result["status"] == "fail", output
    # four lone lead bytes in 700 tokens, each followed by a token that cannot continue it
    expected = multibyte_models.expected_answer("ko", FIELD_MAX_TOKENS, corrupt=True)
    assert expected.count("\ufffd") == 4
    by_run = {"ko": 4, "emoji": 4, "ja": 0}
    runs = result["details"]["runs"]
    assert result["details"]["replacement"] == [by_run[run["language"]] for run in runs]
    assert result["summary"].startswith(
        "3 clean, 8 faulty, 0 inconclusive of 11 runs; U+FFFD in the answer by run: 4, 4, 4, 4, "
        "4, 0, 0, 0, 4, 4, 4; first: run 1 ko-field: fault: 4 U+FFFD"), output
    for run in runs:
        assert run["verdict"] == ("clean" if run["language"] == "ja" else "fault"), run
        assert run["content"] == expected_excerpt(run["language"], corrupt=True), run
        # vLLM gives a byte token that nothing completes empty bytes: the concatenation
        # decodes, and the fault shows in the text alone (docs/probes.md)
        assert run["token_bytes"]["invalid"] == 0 and run["token_bytes"]["tokens"] == 700


def test_the_targets_greedy_choices_are_far_from_ties(server_multibyte_corrupt):
    """What makes the two tests above deterministic: every token of the field prompt's answer
    wins by more than a nat (float32 rounds a logit by about 1e-5 nats)."""
    answer = post_json(server_multibyte_corrupt.url + "/v1/chat/completions", {
        "model": server_multibyte_corrupt.model_id,
        "messages": [{"role": "user", "content": FIELD_PROMPT}],
        "max_tokens": 100, "temperature": 0.0, "logprobs": True, "top_logprobs": 2,
        "return_tokens_as_token_ids": True})
    entries = answer["choices"][0]["logprobs"]["content"]
    note = json.loads((Path(server_multibyte_corrupt.model) / "tiny_model.json").read_text())
    cycle = note["korean_cycle"]
    ids = [int(e["token"].removeprefix("token_id:")) for e in entries]
    assert ids == [cycle[i % len(cycle)] for i in range(100)]
    margins = [e["top_logprobs"][0]["logprob"] - e["top_logprobs"][1]["logprob"]
               for e in entries]
    assert min(margins) > 1.0, min(margins)


def test_the_self_check_tells_the_two_targets_apart(server_multibyte_clean,
                                                    server_multibyte_corrupt):
    """run.sh's self-check (launcher/apply/selfcheck.py), as run.sh runs it once ready."""
    def self_check(server) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, str(REPO_ROOT / "launcher" / "entry.py"),
                               "self-check", server.url], capture_output=True, text=True,
                              timeout=900, check=False)

    clean = self_check(server_multibyte_clean)
    assert clean.returncode == 0 and clean.stderr == "", clean.stdout + clean.stderr
    assert clean.stdout == (
        "glm53: self-check: clean: one Korean answer to the field's prompt (700 tokens): 0 "
        "U+FFFD, 0 lone surrogates, 0 control chars, 0 mojibake runs in the answer; no "
        "repeating tail; 0 invalid UTF-8 sequences in 700 tokens' bytes; 700 chars, 100% of "
        "letters in the script, 8 emoji\n")
    corrupt = self_check(server_multibyte_corrupt)
    assert corrupt.returncode == 1, corrupt.stdout + corrupt.stderr
    assert corrupt.stdout.startswith("glm53: self-check: FAULT: one Korean answer to the field's "
                                     "prompt (700 tokens): 4 U+FFFD, 0 lone surrogates")
    assert corrupt.stderr.startswith("glm53: WARNING: the served text is corrupted (4 U+FFFD")
