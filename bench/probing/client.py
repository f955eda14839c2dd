"""One chat request, not streamed, and the parts of its answer the probes judge, whatever
shape the server used."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass

import aiohttp

from bench.probing.verdict import ProbeError, excerpt
from bench.stream_client import chat_request, error_message


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
