#!/usr/bin/env python3
"""Quality probes: does the model an OpenAI-compatible server serves really work?

    bench/probes.py [--base-url http://127.0.0.1:8000] [--model ID] [--only NAME,...]
                    [--prompt-tokens 8192] [--json [FILE]] [--timeout 600] [--quiet]

Every request is greedy (temperature 0) with thinking off (`chat_template_kwargs:
{"enable_thinking": false}`). The probes, run one after another in this order:

  counting           count from 1 to 200; passes on a consecutive run of at least 80 numbers
  needle             recall a passcode planted at 95% of a --prompt-tokens long prompt (fresh
                     salt and passcode every run); reports prefill tok/s = prompt tokens / TTFT
  tool_call          a weather question with a get_weather tool must come back as a parsed
                     tool_calls entry (name get_weather, JSON arguments naming Paris)
  thinking_off       no <think> tags in the content and nothing in the reasoning fields
  tool_conversation  the tool result sent back in a second turn is used in the answer
  multibyte          eleven Korean, Japanese and emoji answers of 400+ characters (the
                     field's Korean prompt three times, eight others once), sent together: no
                     U+FFFD, lone surrogate or control character in the answer or the
                     reasoning, no invalid UTF-8 in the token bytes; a short, empty,
                     off-language or failed answer is inconclusive, never a pass
  tool_cycles        streamed multi-turn tool calls with Korean, Japanese and emoji
                     arguments: the call's JSON parses, its arguments round-trip, no tool
                     markup in the text, no repeating tail

Exit code: 0 when every probe passed; 1 when one failed or was inconclusive (each line
names the probe and what came back); 2 when the probes could not run (bad option, server unreachable, model
ambiguous, --prompt-tokens beyond the server's max_model_len). docs/probes.md
documents the JSON result (`--json`).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import re
import secrets
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the `bench` package importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from recipekit.one_line_parser import OneLineParser

if __name__ == "__main__":  # a missing package: one line naming the install command
    from bench import requires

    requires.require("bench/probes.py", requires.CLIENT_MODULES, __doc__)

import aiohttp

from bench.bench_decode import BenchError, api_key_of, server_identity
from bench.stream_client import chat_request, error_message, stream_text
from recipekit import apikey
from recipekit import text_integrity as integrity

SCHEMA = "probes/1"
DEFAULT_URL = "http://127.0.0.1:8000"
DEFAULT_PROMPT_TOKENS = 8192
MIN_PROMPT_TOKENS = 256

COUNT_TO = 200
COUNT_PASS_RUN = 80           # the seed's threshold: a consecutive run of at least 80 numbers
COUNT_MAX_TOKENS = 1200       # 200 numbers and newlines, with room for digit-wise tokenizers
NEEDLE_DEPTH = 0.95
NEEDLE_MAX_TOKENS = 48
NEEDLE_MIN_NOTES = 20
CALIBRATION_NOTES = 100
TOOL_MAX_TOKENS = 256
THINKING_MAX_TOKENS = 128
ANSWER_MAX_TOKENS = 128
EXCERPT = 160

THINK_TAG = re.compile(r"</?think>", re.IGNORECASE)
WEATHER_QUESTION = "What is the weather like in Paris right now? Use the get_weather tool."
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather for a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "location": {"type": "string", "description": "the city, e.g. Paris"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["location"],
        },
    },
}
WEATHER_RESULT = {"location": "Paris", "temperature_c": 23, "condition": "light drizzle"}
THINKING_QUESTION = "What is twelve times twelve? Answer in one short sentence."
COUNT_QUESTION = f"Count from 1 to {COUNT_TO}, one number per line, with nothing else."


class ProbesCannotRun(BenchError):
    """A reason no probe result would mean anything (exit 2), phrased for the user."""


class ProbeError(Exception):
    """A probe got no answer it could judge; the message says what came back instead."""


@dataclass
class ProbeResult:
    name: str
    status: str                   # pass, fail (judged and wrong), inconclusive (nothing wrong
    #                               found, but not enough to judge) or error (nothing to judge)
    summary: str                  # one line: what was found, or what came back instead
    seconds: float = 0.0
    details: dict = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return self.status == "pass"

    def to_json(self) -> dict:
        return {"passed": self.passed, "status": self.status, "summary": self.summary,
                "seconds": round(self.seconds, 3), "details": self.details}


def excerpt(text: str | None, limit: int = EXCERPT) -> str:
    """The start and end of a long text, so a failure line shows what came back."""
    text = text or ""
    if len(text) <= limit:
        return text
    return text[:limit * 2 // 3] + " ... " + text[-limit // 3:]


# ----------------------------------------------------------------------------- one request


def probe_request(model: str, messages: list[dict], max_tokens: int, **extra) -> dict:
    """The bench's greedy, thinking-off request, not streamed."""
    body = chat_request(model, messages, max_tokens, ignore_eos=False)
    body["stream"] = False
    del body["stream_options"]
    return {**body, **extra}


@dataclass
class Answer:
    """The parts of a chat completion the probes judge, whatever shape the server used."""

    content: str
    reasoning: str
    reasoning_field: str | None   # which field held it: reasoning (vLLM 0.27.1-0.33.0) or
    #                               reasoning_content (the DeepSeek API, older vLLM)
    tool_calls: list              # [] whether the server sent [], null or nothing
    tool_calls_shape: str         # "list", "null" or "absent", as received
    finish_reason: str | None
    usage: dict
    token_bytes: list | None = None  # each output token's `bytes` (logprobs), None: not given


def _token_bytes(logprobs: object) -> list | None:
    """Each token's `bytes` from an OpenAI logprobs object; None when it carries none."""
    entries = logprobs.get("content") if isinstance(logprobs, dict) else None
    if not isinstance(entries, list) or not entries:
        return None
    found = [entry.get("bytes") if isinstance(entry, dict) else None for entry in entries]
    return found if all(isinstance(b, list) for b in found) else None


def parse_answer(answer: object) -> Answer:
    try:
        choice = answer["choices"][0]
        message = choice["message"]
        if not isinstance(message, dict):
            raise TypeError("message is not an object")
    except (KeyError, IndexError, TypeError) as exc:
        raise ProbeError(f"HTTP 200 without choices[0].message ({exc!r}): "
                         f"{excerpt(json.dumps(answer))}") from exc
    reasoning_field = next((name for name in ("reasoning", "reasoning_content")
                            if message.get(name)), None)
    raw_calls = message.get("tool_calls")
    shape = "absent" if "tool_calls" not in message else ("null" if raw_calls is None else "list")
    content = message.get("content")
    return Answer(
        content=content if isinstance(content, str) else "",
        reasoning=str(message.get(reasoning_field) or "") if reasoning_field else "",
        reasoning_field=reasoning_field,
        tool_calls=raw_calls if isinstance(raw_calls, list) else [],
        tool_calls_shape=shape,
        finish_reason=choice.get("finish_reason"),
        usage=answer.get("usage") if isinstance(answer.get("usage"), dict) else {},
        token_bytes=_token_bytes(choice.get("logprobs")),
    )


async def complete(session: aiohttp.ClientSession, url: str, body: dict) -> Answer:
    """One non-streamed chat completion; ProbeError says what came back when it is unusable."""
    try:
        async with session.post(url + "/v1/chat/completions", json=body) as reply:
            status, raw = reply.status, await reply.read()
    except asyncio.TimeoutError as exc:
        raise ProbeError("no answer within --timeout seconds") from exc
    except aiohttp.ClientError as exc:
        raise ProbeError(f"POST {url}/v1/chat/completions failed ({exc!r})") from exc
    if status != 200:
        try:
            message = error_message(json.loads(raw))
        except ValueError:
            message = raw[:300].decode("utf-8", "replace")
        raise ProbeError(f"HTTP {status}: {message}")
    try:
        answer = json.loads(raw)
    except ValueError as exc:
        raise ProbeError(f"HTTP 200 but the body is not JSON: "
                         f"{excerpt(raw.decode('utf-8', 'replace'))!r}") from exc
    return parse_answer(answer)


@dataclass
class Target:
    """Where and what the probes ask."""

    session: aiohttp.ClientSession
    url: str
    model: str
    prompt_tokens: int


# ----------------------------------------------------------------------------- counting


def longest_run(numbers: list[int]) -> tuple[int, int | None, int | None]:
    """(length, first, last) of the longest stretch where each number is the previous + 1."""
    best, start, length = (0, None, None), 0, 0
    for index, number in enumerate(numbers):
        if index and number == numbers[index - 1] + 1:
            length += 1
        else:
            start, length = index, 1
        if length > best[0]:
            best = (length, numbers[start], number)
    return best


async def probe_counting(target: Target) -> ProbeResult:
    answer = await complete(target.session, target.url, probe_request(
        target.model, [{"role": "user", "content": COUNT_QUESTION}], COUNT_MAX_TOKENS))
    numbers = [int(n) for n in re.findall(r"\d+", answer.content)]
    run, first, last = longest_run(numbers)
    details = {"longest_run": run, "run_first": first, "run_last": last,
               "numbers_seen": len(numbers), "expected": COUNT_TO, "pass_at": COUNT_PASS_RUN,
               "complete": numbers == list(range(1, COUNT_TO + 1)),
               "finish_reason": answer.finish_reason,
               "completion_tokens": answer.usage.get("completion_tokens"),
               "content": excerpt(answer.content)}
    found = (f"longest consecutive run {run}" + (f" ({first}..{last})" if run else "")
             + f" of {len(numbers)} numbers")
    if run >= COUNT_PASS_RUN:
        return ProbeResult("counting", "pass", found + (", 1..200 complete" if details["complete"]
                                                         else ""), details=details)
    where = "" if answer.content else (
        f"; content is empty, {answer.reasoning_field} holds {len(answer.reasoning)} chars"
        if answer.reasoning else "; content is empty")
    return ProbeResult("counting", "fail", f"{found}, needs {COUNT_PASS_RUN}{where}; came back: "
                                           f"{excerpt(answer.content)!r}", details=details)


# ----------------------------------------------------------------------------- needle

_SUBJECTS = ("The harbour master", "A lighthouse keeper", "The ferry captain",
             "An old fisherman", "The weather station", "A young cartographer",
             "The night watchman")
_ACTIONS = ("logged", "noticed", "repaired", "counted", "painted", "measured", "recorded")
_OBJECTS = ("the tide tables", "a cracked lantern", "seventeen gulls", "the northern buoy",
            "the fog signal", "a drifting crate", "the signal flags")
_TIMES = ("before dawn", "at noon", "in the evening", "after the storm", "during the fog",
          "at low tide")


def filler_note(number: int) -> str:
    return (f"Note {number}: {_SUBJECTS[number % 7]} {_ACTIONS[number // 7 % 7]} "
            f"{_OBJECTS[number // 49 % 7]} {_TIMES[number % 6]}.")


@dataclass
class NeedlePrompt:
    text: str
    notes: int                    # filler notes (the needle's note not counted)
    needle_note: int              # the needle's note number
    depth: float                  # characters before the needle / all characters


def needle_prompt(salt: str, needle: str, notes: int, depth: float = NEEDLE_DEPTH) -> NeedlePrompt:
    """A unique header (salt: no prefix-cache hit), numbered notes, the needle among them so
    that depth of the message's characters come before it, and the question as the last line."""
    head = (f"[probe {salt}] Read the numbered notes below. One of them gives a secret "
            f"passcode. Answer the question at the end.\n\n")
    question = ("\nQuestion: what is the secret passcode written in the notes? "
                "Reply with the passcode only.")

    def build(at: int) -> tuple[str, int]:
        before = "".join(filler_note(n) + "\n" for n in range(1, at + 1))
        needle_line = f"Note {at + 1}: The secret passcode is {needle}. Remember it.\n"
        after = "".join(filler_note(n) + "\n" for n in range(at + 2, notes + 2))
        return head + before + needle_line + after + question, len(head + before)

    text, _ = build(round(notes * depth))
    # the filler notes before the needle whose characters come closest to depth of the text
    prefix, at = len(head), 0
    goal = depth * len(text)
    while at < notes and abs(prefix + len(filler_note(at + 1)) + 1 - goal) < abs(prefix - goal):
        at += 1
        prefix += len(filler_note(at)) + 1
    text, before = build(at)
    return NeedlePrompt(text, notes, at + 1, before / len(text))


async def _prompt_tokens_of(target: Target, text: str) -> int | None:
    answer = await complete(target.session, target.url, probe_request(
        target.model, [{"role": "user", "content": text}], 1))
    tokens = answer.usage.get("prompt_tokens")
    return int(tokens) if isinstance(tokens, int) else None


async def size_needle_prompt(target: Target) -> tuple[int, dict]:
    """Filler notes that bring the prompt to --prompt-tokens, measured with the server's own
    tokenizer: two one-token requests (no notes, and some notes) read usage.prompt_tokens.
    Their salt differs from the probe's, so neither warms the probe's prefix cache."""
    salt = "calibration-" + secrets.token_hex(4)
    # about 20 tokens a note: stay well inside a small max_model_len
    sample_notes = max(10, min(CALIBRATION_NOTES, target.prompt_tokens // 40))
    frame, sample = (needle_prompt(salt, "XXXX-XXXX", n).text for n in (0, sample_notes))
    base = await _prompt_tokens_of(target, frame)
    full = await _prompt_tokens_of(target, sample)
    if base is None or full is None or full <= base:
        # no usage from this server: about four characters per token
        base, full, method = len(frame) // 4, len(sample) // 4, "estimated_4_chars"
    else:
        method = "usage"
    # per character, not per note: later notes carry longer numbers than the sample's
    per_char = (full - base) / (len(sample) - len(frame))
    budget, notes = (target.prompt_tokens - base) / per_char, 0
    while budget >= len(filler_note(notes + 1)) + 1:
        budget -= len(filler_note(notes + 1)) + 1
        notes += 1
    if notes < NEEDLE_MIN_NOTES:
        least = base + per_char * sum(len(filler_note(n)) + 1
                                      for n in range(1, NEEDLE_MIN_NOTES + 1))
        raise ProbesCannotRun(f"--prompt-tokens {target.prompt_tokens} leaves room for "
                              f"{notes} notes around the needle; pass "
                              f"--prompt-tokens {int(least) + 1} or more")
    return notes, {"tokens_per_char": round(per_char, 4), "frame_tokens": base,
                   "calibration": method}


async def probe_needle(target: Target) -> ProbeResult:
    notes, sizing = await size_needle_prompt(target)
    salt = secrets.token_hex(8)
    needle = f"{secrets.token_hex(2).upper()}-{secrets.token_hex(2).upper()}"
    prompt = needle_prompt(salt, needle, notes)
    body = chat_request(target.model, [{"role": "user", "content": prompt.text}],
                        NEEDLE_MAX_TOKENS, ignore_eos=False)
    reply = await stream_text(target.session, target.url, body)
    record = reply.record
    if not reply.delivered:
        raise ProbeError(f"{record.failure}: {record.detail}")
    usage = reply.usage or {}
    prompt_tokens = usage.get("prompt_tokens")
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
    prefill = (prompt_tokens / reply.ttft_s if isinstance(prompt_tokens, int) and reply.ttft_s
               else None)
    found = needle.lower() in reply.content.lower()
    details = {"salt": salt, "needle": needle, "needle_note": prompt.needle_note,
               "notes": notes, "needle_depth": round(prompt.depth, 4),
               "target_prompt_tokens": target.prompt_tokens, "prompt_tokens": prompt_tokens,
               "cached_tokens": cached, "ttft_s": reply.ttft_s, "prefill_tok_s": prefill,
               "found": found, "in_reasoning_only": not found and needle.lower()
               in reply.reasoning.lower(), "finish_reason": record.finish_reason,
               "stream_note": None if record.ok else f"{record.failure}: {record.detail}",
               "content": excerpt(reply.content), **sizing}
    where = (f"at {prompt.depth:.0%} of {prompt_tokens if prompt_tokens is not None else '?'}"
             f" prompt tokens")
    rate = (f"; prefill {prefill:,.0f} tok/s (TTFT {reply.ttft_s:.2f} s)" if prefill
            else "; prefill rate unknown (no usage.prompt_tokens or no token-bearing chunk)")
    if found:
        return ProbeResult("needle", "pass", f"found {needle} {where}{rate}", details=details)
    also = " (it is in the reasoning field only)" if details["in_reasoning_only"] else ""
    return ProbeResult("needle", "fail", f"the answer lacks the passcode {needle} planted "
                                         f"{where}{also}; came back: "
                                         f"{excerpt(reply.content)!r}", details=details)


# ----------------------------------------------------------------------------- tools


@dataclass
class WeatherCall:
    problem: str | None           # why this is not a good get_weather call, None when it is
    call: dict | None
    arguments: object = None


def judge_weather_call(answer: Answer) -> WeatherCall:
    if not answer.tool_calls:
        if "get_weather" in answer.content or "<tool_call>" in answer.content:
            return WeatherCall("the call came back as text in content, not as a parsed "
                               "tool_calls entry (is a tool-call parser on? vLLM: "
                               "--enable-auto-tool-choice --tool-call-parser): "
                               f"{excerpt(answer.content)!r}", None)
        return WeatherCall(f"no tool_calls entry (tool_calls {answer.tool_calls_shape}, "
                           f"finish_reason {answer.finish_reason}); content: "
                           f"{excerpt(answer.content)!r}", None)
    call = answer.tool_calls[0]
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict):
        return WeatherCall(f"tool_calls[0] has no function object: {excerpt(json.dumps(call))}",
                           None)
    if function.get("name") != "get_weather":
        return WeatherCall(f"called {function.get('name')!r}, not get_weather", call)
    arguments = function.get("arguments")
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return WeatherCall(f"get_weather arguments are not JSON: "
                               f"{excerpt(function.get('arguments'))!r}", call)
    location = arguments.get("location") if isinstance(arguments, dict) else None
    if not isinstance(location, str):
        return WeatherCall(f"get_weather arguments name no location: "
                           f"{excerpt(json.dumps(arguments))}", call, arguments)
    if "paris" not in location.lower():
        return WeatherCall(f"get_weather location {location!r}, the question asked about Paris",
                           call, arguments)
    return WeatherCall(None, call, arguments)


async def _ask_weather(target: Target) -> tuple[Answer, WeatherCall]:
    answer = await complete(target.session, target.url, probe_request(
        target.model, [{"role": "user", "content": WEATHER_QUESTION}], TOOL_MAX_TOKENS,
        tools=[WEATHER_TOOL], tool_choice="auto"))
    return answer, judge_weather_call(answer)


async def probe_tool_call(target: Target) -> ProbeResult:
    answer, verdict = await _ask_weather(target)
    details = {"tool_calls": answer.tool_calls, "tool_calls_shape": answer.tool_calls_shape,
               "arguments": verdict.arguments, "finish_reason": answer.finish_reason,
               "content": excerpt(answer.content)}
    if verdict.problem:
        return ProbeResult("tool_call", "fail", verdict.problem, details=details)
    return ProbeResult("tool_call", "pass", f"get_weather({json.dumps(verdict.arguments)}) as a "
                                            f"parsed tool_calls entry", details=details)


async def probe_tool_conversation(target: Target) -> ProbeResult:
    first, verdict = await _ask_weather(target)
    details: dict = {"turn1_tool_calls": first.tool_calls, "turn1_content": excerpt(first.content)}
    if verdict.problem:
        return ProbeResult("tool_conversation", "fail", f"turn 1: {verdict.problem}",
                           details=details)
    call_id = verdict.call.get("id") or "call_probe_" + secrets.token_hex(6)
    function = verdict.call["function"]
    arguments = function["arguments"] if isinstance(function["arguments"], str) \
        else json.dumps(function["arguments"])
    messages = [
        {"role": "user", "content": WEATHER_QUESTION},
        {"role": "assistant", "content": first.content,
         "tool_calls": [{"id": call_id, "type": "function",
                         "function": {"name": "get_weather", "arguments": arguments}}]},
        {"role": "tool", "tool_call_id": call_id, "content": json.dumps(WEATHER_RESULT)},
    ]
    second = await complete(target.session, target.url, probe_request(
        target.model, messages, ANSWER_MAX_TOKENS, tools=[WEATHER_TOOL], tool_choice="auto"))
    temperature = str(WEATHER_RESULT["temperature_c"])
    details.update(turn2_tool_calls=second.tool_calls, turn2_content=excerpt(second.content),
                   turn2_finish_reason=second.finish_reason, tool_result=WEATHER_RESULT)
    if second.tool_calls:
        return ProbeResult("tool_conversation", "fail", "turn 2 called a tool again instead of "
                                                        "answering from the tool result: "
                                                        f"{excerpt(json.dumps(second.tool_calls))}",
                           details=details)
    if not re.search(rf"\b{temperature}\b", second.content):
        return ProbeResult("tool_conversation", "fail", f"turn 2 does not use the tool result "
                                                        f"({temperature} C, "
                                                        f"{WEATHER_RESULT['condition']}): "
                                                        f"{excerpt(second.content)!r}",
                           details=details)
    return ProbeResult("tool_conversation", "pass", f"get_weather called, its result used: "
                                                    f"{excerpt(second.content, 80)!r}",
                       details=details)


# ----------------------------------------------------------------------------- thinking


async def probe_thinking_off(target: Target) -> ProbeResult:
    answer = await complete(target.session, target.url, probe_request(
        target.model, [{"role": "user", "content": THINKING_QUESTION}], THINKING_MAX_TOKENS))
    tags = THINK_TAG.findall(answer.content)
    reasoning_tokens = (answer.usage.get("completion_tokens_details") or {}).get(
        "reasoning_tokens")
    details = {"content": excerpt(answer.content), "think_tags_in_content": len(tags),
               "reasoning_field": answer.reasoning_field, "reasoning": excerpt(answer.reasoning),
               "reasoning_tokens": reasoning_tokens, "finish_reason": answer.finish_reason}
    problems = []
    if tags:
        problems.append(f"content holds {len(tags)} think tag(s): {excerpt(answer.content)!r}")
    if answer.reasoning.strip():
        problems.append(f"{answer.reasoning_field} holds {len(answer.reasoning)} chars: "
                        f"{excerpt(answer.reasoning)!r}")
    if isinstance(reasoning_tokens, int) and reasoning_tokens > 0:
        problems.append(f"usage counts {reasoning_tokens} reasoning tokens")
    if not answer.content.strip():
        problems.append(f"content is empty (finish_reason {answer.finish_reason})")
    if problems:
        return ProbeResult("thinking_off", "fail", "; ".join(problems), details=details)
    return ProbeResult("thinking_off", "pass", f"no think tags, no reasoning: "
                                               f"{excerpt(answer.content, 80)!r}", details=details)


# ----------------------------------------------------------------------------- multibyte

# (name, language, prompt, runs). The field's prompt runs three times, as the field ran it;
# the emoji prompts ask Korean prose with a four-byte emoji per sentence, so 3-byte and
# 4-byte sequences meet in one answer.
_EMOJI_ASK = "모든 문장 끝에 어울리는 이모지를 하나씩 넣어 주세요 (예: {}). 최소 400자 이상으로 작성하세요."
MULTIBYTE_RUNS = (
    ("ko-field", integrity.KOREAN, integrity.FIELD_PROMPT, 3),
    ("ko-kimchi", integrity.KOREAN, "한국어로 김치를 담그는 과정을 재료 준비부터 숙성까지 자세히 "
                                    "설명해 주세요. 최소 400자 이상으로 작성하세요.", 1),
    ("ko-hangul", integrity.KOREAN, "한국어로 세종대왕이 한글을 만든 배경과 그 의의를 자세히 설명해 "
                                    "주세요. 최소 400자 이상으로 작성하세요.", 1),
    ("ja-perceptron", integrity.JAPANESE, "日本語で、パーセプトロンとニューラルネットワークの違いを"
                                          "詳しく説明してください。400文字以上で書いてください。", 1),
    ("ja-miso", integrity.JAPANESE, "日本語で、味噌汁の作り方を材料の準備から仕上げまで詳しく"
                                    "説明してください。400文字以上で書いてください。", 1),
    ("ja-kyoto", integrity.JAPANESE, "日本語で、桜の季節に京都を一日で巡る旅の計画を詳しく"
                                     "書いてください。400文字以上で書いてください。", 1),
    ("emoji-jeju", integrity.KOREAN_WITH_EMOJI,
     "한국어로 제주도 여행 일기를 써 주세요. " + _EMOJI_ASK.format("🌊 🍊 🐴"), 1),
    ("emoji-dog", integrity.KOREAN_WITH_EMOJI,
     "한국어로 반려견과 보낸 주말 이야기를 써 주세요. " + _EMOJI_ASK.format("🐶 🦴 🌳"), 1),
    ("emoji-party", integrity.KOREAN_WITH_EMOJI,
     "한국어로 생일 파티를 준비하는 과정을 써 주세요. " + _EMOJI_ASK.format("🎂 🎈 🎁"), 1),
)
MULTIBYTE_MAX_TOKENS = integrity.FIELD_MAX_TOKENS   # the field's, for every run


async def _multibyte_answer(target: Target, prompt: str) -> tuple[Answer, str | None]:
    """One greedy answer with its token bytes; (answer, note). A server that refuses logprobs
    (HTTP 400) is asked again without them, and the note says the bytes went unchecked."""
    messages = [{"role": "user", "content": prompt}]
    try:
        return await complete(target.session, target.url, probe_request(
            target.model, messages, MULTIBYTE_MAX_TOKENS, logprobs=True)), None
    except ProbeError as error:
        if not str(error).startswith("HTTP 400"):
            raise
        refused = str(error)
    answer = await complete(target.session, target.url, probe_request(
        target.model, messages, MULTIBYTE_MAX_TOKENS))
    return answer, f"logprobs refused ({refused}): token bytes unchecked"


async def _multibyte_run(target: Target, name: str, language: integrity.Language,
                         prompt: str) -> dict:
    try:
        answer, note = await _multibyte_answer(target, prompt)
    except ProbeError as failed:
        return {"name": name, "language": language.name, "verdict": "inconclusive",
                "why": f"no answer: {failed}", "note": None}
    judged = integrity.judge(language, answer.content, answer.reasoning, answer.token_bytes,
                             answer.finish_reason)
    return {"name": name, **judged.to_json(), "finish_reason": answer.finish_reason,
            "completion_tokens": answer.usage.get("completion_tokens"),
            "counts": judged.counts(), "shape": judged.shape(), "note": note,
            "content": excerpt(answer.content)}


def multibyte_line(run: dict) -> str:
    """One run as the result says it: name, verdict, counts, length and script share."""
    if "counts" not in run:
        return f"{run['name']}: {run['verdict']} ({run['why']})"
    why = "" if run["verdict"] != "inconclusive" else f" ({run['why']})"
    return f"{run['name']}: {run['verdict']}{why}: {run['counts']}; {run['shape']}"


async def probe_multibyte(target: Target) -> ProbeResult:
    # sent together: a server batches them (MAX_NUM_SEQS at a time), and greedy runs need
    # no order; each is judged alone
    runs = await asyncio.gather(*(_multibyte_run(target, name, language, prompt)
                                  for name, language, prompt, count in MULTIBYTE_RUNS
                                  for _ in range(count)))
    for index, run in enumerate(runs):
        run["run"] = index + 1
    verdicts = [run["verdict"] for run in runs]
    faults = [run for run in runs if run["verdict"] == "fault"]
    details = {"runs": runs, "max_tokens": MULTIBYTE_MAX_TOKENS,
               "min_chars": integrity.MIN_ANSWER_CHARS,
               "min_script_share": integrity.MIN_SCRIPT_SHARE,
               "replacement": [run.get("answer_faults", {}).get("replacement") for run in runs],
               "clean": verdicts.count("clean"), "fault": len(faults),
               "inconclusive": verdicts.count("inconclusive")}
    tally = (f"{verdicts.count('clean')} clean, {len(faults)} faulty, "
             f"{verdicts.count('inconclusive')} inconclusive of {len(runs)} runs")
    if faults:
        by_run = ", ".join("-" if run.get("answer_faults") is None else
                           str(run["answer_faults"]["replacement"]) for run in runs)
        return ProbeResult("multibyte", "fail", f"{tally}; U+FFFD in the answer by run: "
                                                f"{by_run}; first: run {faults[0]['run']} "
                                                f"{multibyte_line(faults[0])}", details=details)
    if "inconclusive" in verdicts:
        unclear = [run for run in runs if run["verdict"] == "inconclusive"]
        return ProbeResult("multibyte", "inconclusive", f"{tally}; " + "; ".join(
            multibyte_line(run) for run in unclear[:3]), details=details)
    return ProbeResult("multibyte", "pass", f"{tally}: no U+FFFD, lone surrogate, control "
                                            f"character or invalid token byte", details=details)


# ----------------------------------------------------------------------------- tool cycles

CYCLE_TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Get the current weather for a city.",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "description": "the city, as the user names it"}},
            "required": ["city"]}}},
    {"type": "function", "function": {
        "name": "save_note", "description": "Save a note with a title and a body.",
        "parameters": {"type": "object", "properties": {
            "title": {"type": "string"}, "body": {"type": "string"}},
            "required": ["title", "body"]}}},
]


@dataclass(frozen=True)
class Cycle:
    """One user turn that must come back as a call of `tool` with exactly `arguments`, then
    an answer once `result` is sent back."""

    name: str
    ask: str
    tool: str
    arguments: dict
    result: dict


def _pinned(text: str, tool: str, arguments: dict) -> str:
    return text.format(tool=tool, arguments=json.dumps(arguments, ensure_ascii=False))


# two conversations of two cycles each: a city, then a note with emoji, in Korean and Japanese
CONVERSATIONS = (
    ("ko", (
        Cycle("ko-weather", _pinned("서울 날씨를 알려 주세요. {tool} 도구를 다음 인자 그대로 호출하세요: "
                                    "{arguments}", "get_weather", {"city": "서울특별시"}),
              "get_weather", {"city": "서울특별시"},
              {"city": "서울특별시", "temperature_c": 21, "condition": "맑음 ☀️"}),
        Cycle("ko-note", _pinned("고마워요. 이제 {tool} 도구를 다음 인자 그대로 호출해 메모를 "
                                 "저장하세요: {arguments}", "save_note",
                                 {"title": "서울 날씨 메모 🌤️", "body": "우산은 두고 가도 돼요 😊"}),
              "save_note", {"title": "서울 날씨 메모 🌤️", "body": "우산은 두고 가도 돼요 😊"},
              {"saved": True, "id": "메모-1"}),
    )),
    ("ja", (
        Cycle("ja-weather", _pinned("京都の天気を教えてください。{tool} ツールを次の引数のまま呼んで"
                                    "ください: {arguments}", "get_weather", {"city": "京都市"}),
              "get_weather", {"city": "京都市"},
              {"city": "京都市", "temperature_c": 17, "condition": "小雨 🌧️"}),
        Cycle("ja-note", _pinned("ありがとう。次に {tool} ツールを次の引数のまま呼んでメモを保存して"
                                 "ください: {arguments}", "save_note",
                                 {"title": "京都の天気 🌸", "body": "傘を持っていくこと ☂️"}),
              "save_note", {"title": "京都の天気 🌸", "body": "傘を持っていくこと ☂️"},
              {"saved": True, "id": "メモ-2"}),
    )),
)
CYCLE_MAX_TOKENS = 384
# after a tool result the model may call again; a call beyond these is a loop
CYCLE_MAX_EXTRA_CALLS = 2
CYCLE_EXTRA_RESULT = {"ok": True}


@dataclass
class Turn:
    """One streamed response of a cycle, judged."""

    content: str
    calls: list[dict]                  # assembled: id, name, arguments (string), parsed
    finish_reason: str | None
    problems: list[str]
    leaks: int = 0                     # texts holding tool markup
    repeats: int = 0                   # texts ending in a repeating tail


async def _cycle_turn(target: Target, messages: list[dict], label: str) -> Turn:
    body = chat_request(target.model, messages, CYCLE_MAX_TOKENS, ignore_eos=False)
    body.update(tools=CYCLE_TOOLS, tool_choice="auto")
    reply = await stream_text(target.session, target.url, body)
    if not reply.delivered:
        raise ProbeError(f"{label}: {reply.record.failure}: {reply.record.detail}")
    problems, calls = [], []
    for call in reply.tool_calls:
        function = call["function"]
        entry = {"id": call["id"], "name": function["name"], "arguments": function["arguments"],
                 "parsed": None}
        try:
            entry["parsed"] = json.loads(function["arguments"] or "{}")
        except ValueError:
            problems.append(f"{label}: {function['name'] or '(no name)'} arguments are not "
                            f"JSON: {excerpt(function['arguments'])!r}")
        else:
            if not isinstance(entry["parsed"], dict):
                problems.append(f"{label}: {function['name']} arguments are not a JSON object: "
                                f"{excerpt(function['arguments'])!r}")
        calls.append(entry)
    turn = Turn(reply.content, calls, reply.record.finish_reason, problems)
    for where, text in (("content", reply.content), ("reasoning", reply.reasoning),
                        *(("arguments", c["arguments"]) for c in calls)):
        if tags := integrity.leaked_markup(text):
            turn.leaks += 1
            problems.append(f"{label}: tool markup {' '.join(tags)} in the {where}: "
                            f"{excerpt(text)!r}")
    for where, text in (("content", reply.content), ("reasoning", reply.reasoning)):
        if loop := integrity.repeating_tail(text):
            turn.repeats += 1
            problems.append(f"{label}: the {where} ends repeating {loop.unit!r} {loop.copies} "
                            f"times ({loop.chars} chars)")
    return turn


def _assistant_message(turn: Turn) -> dict:
    return {"role": "assistant", "content": turn.content or None,
            "tool_calls": [{"id": call["id"], "type": "function",
                            "function": {"name": call["name"], "arguments": call["arguments"]}}
                           for call in turn.calls]}


def _tool_messages(turn: Turn, result: dict) -> list[dict]:
    return [{"role": "tool", "tool_call_id": call["id"],
             "content": json.dumps(result, ensure_ascii=False)} for call in turn.calls]


async def _run_cycle(target: Target, messages: list[dict], cycle: Cycle) -> dict:
    """The call turn and the turns after its result; appends them to messages."""
    messages.append({"role": "user", "content": cycle.ask})
    record: dict = {"name": cycle.name, "tool": cycle.tool, "asked": cycle.arguments,
                    "calls": [], "round_trip": False, "answer": None, "problems": [],
                    "markup_leaks": 0, "repeating_tails": 0}

    def judged(turn: Turn) -> Turn:
        record["problems"] += turn.problems
        record["markup_leaks"] += turn.leaks
        record["repeating_tails"] += turn.repeats
        return turn

    turn = judged(await _cycle_turn(target, messages, f"{cycle.name} call"))
    record["calls"] += turn.calls
    asked = [call for call in turn.calls if call["name"] == cycle.tool]
    if not asked:
        record["problems"].append(
            f"{cycle.name}: no {cycle.tool} call (tool calls {[c['name'] for c in turn.calls]}, "
            f"finish_reason {turn.finish_reason}); content: {excerpt(turn.content)!r}")
        return record
    got = asked[0]["parsed"]
    if isinstance(got, dict):
        wrong = {key: got.get(key) for key, value in cycle.arguments.items()
                 if got.get(key) != value}
        record["round_trip"] = not wrong
        if wrong:
            record["problems"].append(
                f"{cycle.name}: {cycle.tool} arguments came back "
                f"{json.dumps(got, ensure_ascii=False)}, asked "
                f"{json.dumps(cycle.arguments, ensure_ascii=False)}")
    messages.append(_assistant_message(turn))
    messages += _tool_messages(turn, cycle.result)
    for extra in range(CYCLE_MAX_EXTRA_CALLS + 1):
        turn = judged(await _cycle_turn(target, messages, f"{cycle.name} answer {extra + 1}"))
        if not turn.calls:
            record["answer"] = excerpt(turn.content)
            if not turn.content.strip():
                record["problems"].append(f"{cycle.name}: empty answer after the tool result "
                                          f"(finish_reason {turn.finish_reason})")
            messages.append({"role": "assistant", "content": turn.content})
            return record
        record["calls"] += turn.calls
        messages.append(_assistant_message(turn))
        messages += _tool_messages(turn, CYCLE_EXTRA_RESULT)
    record["problems"].append(f"{cycle.name}: still calling tools after "
                              f"{CYCLE_MAX_EXTRA_CALLS} extra calls, no answer")
    return record


async def probe_tool_cycles(target: Target) -> ProbeResult:
    cycles = []
    for _, conversation in CONVERSATIONS:
        messages: list[dict] = []
        for cycle in conversation:
            record = await _run_cycle(target, messages, cycle)
            cycles.append(record)
            if record["problems"]:
                break   # the rest of this conversation would build on a broken turn
    calls = [call for record in cycles for call in record["calls"]]
    parsed = sum(isinstance(call["parsed"], dict) for call in calls)
    problems = [problem for record in cycles for problem in record["problems"]]
    total = sum(len(conversation) for _, conversation in CONVERSATIONS)
    clean = sum(not record["problems"] for record in cycles)
    details = {"cycles": cycles, "asked_cycles": total, "clean_cycles": clean,
               "calls": len(calls), "calls_parsed": parsed,
               "round_trips": sum(record["round_trip"] for record in cycles),
               "markup_leaks": sum(record["markup_leaks"] for record in cycles),
               "repeating_tails": sum(record["repeating_tails"] for record in cycles)}
    tally = (f"{clean} of {total} cycles clean; {parsed} of {len(calls)} calls' JSON parsed, "
             f"{details['round_trips']} round-tripped, {details['markup_leaks']} markup leak(s), "
             f"{details['repeating_tails']} repeating tail(s)")
    if problems:
        return ProbeResult("tool_cycles", "fail", f"{tally}: " + "; ".join(problems[:3]),
                           details=details)
    return ProbeResult("tool_cycles", "pass", tally, details=details)


# ----------------------------------------------------------------------------- running

PROBES: dict[str, Callable[[Target], Awaitable[ProbeResult]]] = {
    "counting": probe_counting,
    "needle": probe_needle,
    "tool_call": probe_tool_call,
    "thinking_off": probe_thinking_off,
    "tool_conversation": probe_tool_conversation,
    "multibyte": probe_multibyte,
    "tool_cycles": probe_tool_cycles,
}
PROBE_NAMES = tuple(PROBES)


def normalize_base_url(url: str) -> str:
    """Accept http://host:port, with or without a trailing / or /v1."""
    return url.rstrip("/").removesuffix("/v1").rstrip("/")


def _now_iso() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def _max_model_len(models: object, model: str) -> int | None:
    try:
        for card in models["data"]:
            if card.get("id") == model and isinstance(card.get("max_model_len"), int):
                return card["max_model_len"]
    except (KeyError, TypeError, AttributeError):
        pass
    return None


async def run_probes_async(base_url: str, model: str | None = None,
                           only: tuple[str, ...] | list[str] = PROBE_NAMES,
                           prompt_tokens: int = DEFAULT_PROMPT_TOKENS, timeout: float = 600.0,
                           note: Callable[[str], None] | None = None,
                           api_key_file: str | None = None) -> dict:
    """Run the chosen probes; return the result document (docs/probes.md). Raises
    ProbesCannotRun (a BenchError) when no result would mean anything."""
    url = normalize_base_url(base_url)
    unknown = [name for name in only if name not in PROBES]
    if unknown or not only:
        raise ProbesCannotRun(f"unknown probe(s) {', '.join(unknown) or '(none given)'}: "
                              f"choose from {', '.join(PROBE_NAMES)}")
    client_timeout = aiohttp.ClientTimeout(total=None, sock_connect=10.0, sock_read=timeout)
    key = api_key_of(api_key_file)
    async with aiohttp.ClientSession(timeout=client_timeout, headers=key.headers()) as session:
        model, models, version = await server_identity(session, url, model, "--base-url", key)
        limit = _max_model_len(models, model)
        if "needle" in only and limit is not None \
                and prompt_tokens + NEEDLE_MAX_TOKENS > limit:
            raise ProbesCannotRun(f"--prompt-tokens {prompt_tokens} plus {NEEDLE_MAX_TOKENS} "
                                  f"answer tokens exceed {model}'s max_model_len {limit}: pass "
                                  f"--prompt-tokens {limit - NEEDLE_MAX_TOKENS} or less")
        target = Target(session, url, model, prompt_tokens)
        doc = {"schema": SCHEMA, "passed": False, "failed": [], "base_url": url, "model": model,
               "vllm_version": version, "max_model_len": limit,
               "started_at": _now_iso(), "finished_at": None,
               "settings": {"only": list(only), "prompt_tokens": prompt_tokens,
                            "timeout_s": timeout,
                            "request": {"temperature": 0.0,
                                        "chat_template_kwargs": {"enable_thinking": False}}},
               "probes": {}}
        for name in PROBE_NAMES:
            if name not in only:
                continue
            if note:
                note(f"probes: {name} ...")
            started = time.perf_counter()
            try:
                result = await PROBES[name](target)
            except ProbeError as exc:
                result = ProbeResult(name, "error", f"no answer to judge: {exc}")
            result.seconds = time.perf_counter() - started
            doc["probes"][name] = result.to_json()
            if note:
                note(f"probes: {name} {result.status} after {result.seconds:.1f} s")
    doc["failed"] = [name for name, r in doc["probes"].items() if not r["passed"]]
    doc["passed"] = not doc["failed"]
    doc["finished_at"] = _now_iso()
    return doc


def run_probes(base_url: str, **kwargs) -> dict:
    """run_probes_async for callers without an event loop."""
    return asyncio.run(run_probes_async(base_url, **kwargs))


def result_line(name: str, result: dict) -> str:
    word = {"pass": "PASS", "inconclusive": "INCONCLUSIVE"}.get(result["status"], "FAIL")
    return f"{word} {name}: {result['summary']}"


# ----------------------------------------------------------------------------- command line


def _probe_list(text: str) -> list[str]:
    names = [part.strip() for part in text.split(",") if part.strip()]
    unknown = [name for name in names if name not in PROBES]
    if not names or unknown:
        raise argparse.ArgumentTypeError(f"unknown probe(s) {', '.join(unknown) or repr(text)}: "
                                         f"choose from {', '.join(PROBE_NAMES)}")
    return list(dict.fromkeys(names))


def _prompt_tokens(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < MIN_PROMPT_TOKENS:
        raise argparse.ArgumentTypeError(f"must be an integer >= {MIN_PROMPT_TOKENS}, got {text!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="probes.py", description=__doc__.split("\n\n")[0],
                      allow_abbrev=False)
    p.add_argument("--base-url", "--url", dest="base_url", default=DEFAULT_URL,
                   help=f"server base URL, a trailing /v1 is fine (default {DEFAULT_URL})")
    p.add_argument("--model", help="model id (default: the one /v1/models lists)")
    apikey.add_client_argument(p)
    p.add_argument("--only", type=_probe_list, default=list(PROBE_NAMES),
                   help=f"comma-separated probes to run (default all: {', '.join(PROBE_NAMES)})")
    p.add_argument("--prompt-tokens", type=_prompt_tokens, default=DEFAULT_PROMPT_TOKENS,
                   help=f"the needle prompt's length in tokens (default {DEFAULT_PROMPT_TOKENS})")
    p.add_argument("--json", dest="json_path", nargs="?", const="-", metavar="FILE",
                   help="write the result as JSON: to FILE, or alone on stdout when no FILE "
                        "is given (the PASS/FAIL lines then go to stderr)")
    p.add_argument("--timeout", type=float, default=600.0,
                   help="seconds a request may wait for its next bytes (default 600)")
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    opts = parser.parse_args(argv)
    if not opts.base_url.startswith(("http://", "https://")):
        parser.error(f"--base-url must start with http:// or https://, got {opts.base_url!r}")
    if opts.timeout <= 0:
        parser.error(f"--timeout must be > 0 seconds, got {opts.timeout}")
    to_stdout = opts.json_path == "-"
    lines = sys.stderr if to_stdout else sys.stdout

    def progress(text: str) -> None:
        if not opts.quiet:
            print(text, file=sys.stderr, flush=True)

    try:
        doc = run_probes(opts.base_url, model=opts.model, only=opts.only,
                         prompt_tokens=opts.prompt_tokens, timeout=opts.timeout, note=progress,
                         api_key_file=opts.api_key_file)
    except BenchError as exc:
        print(f"probes: {exc}", file=sys.stderr)
        return 2
    for name, result in doc["probes"].items():
        print(result_line(name, result), file=lines)
    total = len(doc["probes"])
    verdict = (f"probes: PASS ({total} of {total})" if doc["passed"] else
               f"probes: FAIL ({total - len(doc['failed'])} of {total} passed; failed: "
               f"{', '.join(doc['failed'])})")
    print(verdict, file=lines)
    text = json.dumps(doc, indent=1) + "\n"
    if to_stdout:
        sys.stdout.write(text)
    elif opts.json_path:
        Path(opts.json_path).write_text(text, encoding="utf-8")
    return 0 if doc["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
