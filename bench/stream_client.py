"""One streamed chat completion: when its chunks arrived, how many tokens each carried, and
what went wrong with it, if anything."""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field

import aiohttp

# how tokens per chunk were counted (the `method` of a result)
METHOD_CONTINUOUS_USAGE = "continuous_usage"
METHOD_FINAL_USAGE = "final_usage_first_chunk_one"

# failure kinds a stream can be given (HTTP errors are named http_<status>)
FAILURE_KINDS = (
    "error_event",      # the server sent an error object inside the stream
    "truncated",        # the stream stopped before finish_reason / the connection broke
    "missing_done",     # the stream ended without `data: [DONE]`
    "missing_usage",    # no final usage chunk, so completion tokens are unknown
    "usage_mismatch",   # per-chunk usage does not add up to the final usage
    "bad_chunk",        # a data line that is not JSON
    "too_short",        # fewer than two token-bearing chunks: no decode rate exists
    "timeout",
    "connect_error",
)


def chat_request(model: str, messages: list[dict], max_tokens: int, ignore_eos: bool) -> dict:
    """The streamed, greedy, thinking-off request every bench stream sends."""
    return {
        "model": model,
        "messages": messages,
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
        "chat_template_kwargs": {"enable_thinking": False},
        "ignore_eos": ignore_eos,
    }


class Tally:
    """Tokens seen so far in a wave, read by the progress display."""

    def __init__(self) -> None:
        self.tokens = 0
        self.finished = 0
        self.failed = 0


@dataclass
class StreamRecord:
    stream: int
    prefix: str
    ok: bool = False
    failure: str | None = None
    detail: str = ""
    http_status: int | None = None
    ttft_s: float | None = None
    t_first_s: float | None = None
    t_last_s: float | None = None
    completion_tokens: int | None = None
    decode_tokens: int | None = None
    tok_s: float | None = None
    method: str | None = None
    finish_reason: str | None = None
    saw_done: bool = False
    chunk_times_s: list[float] = field(default_factory=list)
    chunk_tokens: list[int | None] = field(default_factory=list)

    def to_json(self) -> dict:
        out = dict(self.__dict__)
        out["chunk_times_s"] = [round(t, 6) for t in self.chunk_times_s]
        return out


def error_message(payload: object) -> str:
    if isinstance(payload, dict):
        inner = payload.get("error", payload)
        if isinstance(inner, dict):
            return str(inner.get("message") or inner)[:300]
        return str(inner)[:300]
    return str(payload)[:300]


class _StreamParse:
    """Accumulates what the SSE lines of one stream say."""

    def __init__(self, record: StreamRecord, wave_t0: float, tally: Tally,
                 keep_text: bool = False):
        self.record, self.wave_t0, self.tally = record, wave_t0, tally
        self.error: str | None = None
        self.final_usage: dict | None = None
        self.cumulative = 0
        self.every_chunk_has_usage = True
        self.first_chunk_abs: float | None = None
        # the bench never reads the text; the probes do (keep_text), at a string per chunk
        self.keep_text = keep_text
        self.content: list[str] = []
        self.reasoning: list[str] = []
        self.tool_call_deltas: list[dict] = []
        self.last_usage: dict | None = None

    def line(self, line: str, now: float) -> None:
        if not line.startswith("data:"):
            return  # SSE comments, event names and blank separators carry no data
        data = line[5:].strip()
        if data == "[DONE]":
            self.record.saw_done = True
            return
        try:
            obj = json.loads(data)
        except json.JSONDecodeError:
            if self.error is None:
                self.error = f"bad_chunk: {data[:120]!r}"
            return
        if not isinstance(obj, dict):
            return
        if "error" in obj or obj.get("object") == "error":
            self.error = self.error or f"error_event: {error_message(obj)}"
            return
        usage = obj.get("usage")
        choices = obj.get("choices") or []
        if not choices:
            if isinstance(usage, dict):
                self.final_usage = usage
            return
        choice = choices[0]
        self.record.finish_reason = choice.get("finish_reason") or self.record.finish_reason
        if self.keep_text:
            self._keep(choice.get("delta") or {}, usage)
        if isinstance(usage, dict) and "completion_tokens" in usage:
            tokens = int(usage["completion_tokens"]) - self.cumulative
            self.cumulative = int(usage["completion_tokens"])
            bearing = tokens > 0
        else:
            self.every_chunk_has_usage = False
            delta = choice.get("delta") or {}
            tokens = None
            bearing = bool(delta.get("content") or delta.get("reasoning_content")
                           or delta.get("reasoning") or delta.get("tool_calls"))
        if bearing:
            if self.first_chunk_abs is None:
                self.first_chunk_abs = now
            self.record.chunk_times_s.append(now - self.wave_t0)
            self.record.chunk_tokens.append(tokens)
            self.tally.tokens += tokens or 1

    def _keep(self, delta: dict, usage: object) -> None:
        self.content.append(delta.get("content") or "")
        # vLLM 0.27.1-0.33.0 name the field reasoning; the DeepSeek API reasoning_content
        self.reasoning.append(delta.get("reasoning") or delta.get("reasoning_content") or "")
        calls = delta.get("tool_calls")
        if isinstance(calls, list):
            self.tool_call_deltas += [call for call in calls if isinstance(call, dict)]
        if isinstance(usage, dict):
            self.last_usage = usage


def _fail(record: StreamRecord, kind: str, detail: str) -> StreamRecord:
    record.ok, record.failure, record.detail = False, kind, detail
    return record


def _finish(record: StreamRecord, parse: _StreamParse, t_sent: float) -> StreamRecord:
    """Decide whether the stream is measurable and, if so, measure it."""
    if parse.error:
        kind, _, detail = parse.error.partition(": ")
        return _fail(record, kind, detail)
    if not record.saw_done and record.finish_reason is None:
        return _fail(record, "truncated", "stream ended without finish_reason or [DONE]")
    if parse.final_usage is None or "completion_tokens" not in parse.final_usage:
        return _fail(record, "missing_usage", "no final usage chunk (stream_options.include_usage)")
    if not record.saw_done:
        return _fail(record, "missing_done", "stream ended without data: [DONE]")
    record.completion_tokens = int(parse.final_usage["completion_tokens"])
    times = record.chunk_times_s
    if len(times) < 2 or times[-1] <= times[0]:
        return _fail(record, "too_short",
                     f"{len(times)} token-bearing chunk(s): no decode interval to measure")
    continuous = parse.every_chunk_has_usage and all(n is not None for n in record.chunk_tokens)
    if continuous:
        counted = sum(n or 0 for n in record.chunk_tokens)
        if counted != record.completion_tokens:
            return _fail(record, "usage_mismatch", f"chunks carry {counted} tokens, final usage "
                                                   f"says {record.completion_tokens}")
        record.method = METHOD_CONTINUOUS_USAGE
        record.decode_tokens = record.completion_tokens - int(record.chunk_tokens[0] or 0)
    else:
        record.method = METHOD_FINAL_USAGE
        record.chunk_tokens = [None] * len(times)
        record.decode_tokens = record.completion_tokens - 1
    record.t_first_s, record.t_last_s = times[0], times[-1]
    record.ttft_s = (parse.first_chunk_abs or t_sent) - t_sent
    record.tok_s = record.decode_tokens / (times[-1] - times[0])
    record.ok = True
    return record


async def run_stream(session: aiohttp.ClientSession, url: str, body: dict, stream: int,
                     prefix: str, wave_t0: float, tally: Tally) -> StreamRecord:
    """Send one streamed request and return its record; never raises for server faults."""
    record = await _send(session, url, body, StreamRecord(stream=stream, prefix=prefix),
                         wave_t0, tally)
    tally.finished += 1
    tally.failed += 0 if record.ok else 1
    return record


async def _send(session: aiohttp.ClientSession, url: str, body: dict, record: StreamRecord,
                wave_t0: float, tally: Tally) -> StreamRecord:
    parse = _StreamParse(record, wave_t0, tally)
    failed, t_sent = await _post_and_parse(session, url, body, parse)
    return failed or _finish(record, parse, t_sent)


async def _post_and_parse(session: aiohttp.ClientSession, url: str, body: dict,
                          parse: _StreamParse) -> tuple[StreamRecord | None, float]:
    """POST body and feed every SSE line to parse: (the failed record when the transport or
    the HTTP status failed, else None; the perf_counter time the request was sent)."""
    record = parse.record
    clock = time.perf_counter
    t_sent = clock()
    try:
        async with session.post(url + "/v1/chat/completions", json=body) as reply:
            record.http_status = reply.status
            if reply.status != 200:
                raw = await reply.read()
                try:
                    message = error_message(json.loads(raw))
                except ValueError:
                    message = raw[:300].decode("utf-8", "replace")
                return _fail(record, f"http_{reply.status}", message), t_sent
            async for raw_line in reply.content:
                parse.line(raw_line.decode("utf-8", "replace"), clock())
    except asyncio.TimeoutError:
        return _fail(record, "timeout", f"no bytes for too long, after "
                                        f"{clock() - t_sent:.1f}s"), t_sent
    except aiohttp.ClientConnectorError as exc:
        return _fail(record, "connect_error", str(exc) or type(exc).__name__), t_sent
    except (aiohttp.ClientPayloadError, aiohttp.ServerDisconnectedError,
            aiohttp.ClientOSError) as exc:
        return _fail(record, "truncated", f"connection broke mid-stream ({exc})"), t_sent
    except ValueError as exc:   # aiohttp refuses an over-long line
        return _fail(record, "bad_chunk", str(exc)), t_sent
    return None, t_sent


@dataclass
class StreamedText:
    """One streamed reply with its text kept: what the probes judge and time."""

    record: StreamRecord          # the bench's verdict on the stream (ok, failure, detail)
    delivered: bool               # the HTTP exchange completed (the text can be judged)
    content: str
    reasoning: str
    usage: dict | None            # the final usage chunk, else the last usage seen
    ttft_s: float | None          # request sent to the first token-bearing chunk
    tool_calls: list[dict] = field(default_factory=list)  # assembled from the deltas


def assemble_tool_calls(deltas: list[dict]) -> list[dict]:
    """The tool calls a stream's deltas spell, in index order: the first id and type seen for
    an index, its name and arguments pieces joined (vLLM sends the name once, then the
    arguments in pieces). The arguments stay a string: whether it is JSON is the caller's
    question."""
    calls: dict[int, dict] = {}
    for delta in deltas:
        index = delta.get("index") if isinstance(delta.get("index"), int) else len(calls)
        call = calls.setdefault(index, {"id": None, "type": None,
                                        "function": {"name": "", "arguments": ""}})
        call["id"] = call["id"] or delta.get("id")
        call["type"] = call["type"] or delta.get("type")
        function = delta.get("function") if isinstance(delta.get("function"), dict) else {}
        for part in ("name", "arguments"):
            if isinstance(function.get(part), str):
                call["function"][part] += function[part]
    return [calls[index] for index in sorted(calls)]


async def stream_text(session: aiohttp.ClientSession, url: str, body: dict) -> StreamedText:
    """Send one streamed request and keep its text; never raises for server faults."""
    record = StreamRecord(stream=0, prefix="")
    parse = _StreamParse(record, time.perf_counter(), Tally(), keep_text=True)
    failed, t_sent = await _post_and_parse(session, url, body, parse)
    if failed is None:
        _finish(record, parse, t_sent)
    # the text is whole unless the stream broke; a missing usage or [DONE], or a one-chunk
    # answer, spoil only the timing
    delivered = failed is None and record.failure not in ("error_event", "truncated",
                                                          "bad_chunk")
    ttft = None if parse.first_chunk_abs is None else parse.first_chunk_abs - t_sent
    return StreamedText(record=record, delivered=delivered, content="".join(parse.content),
                        reasoning="".join(parse.reasoning),
                        usage=parse.final_usage or parse.last_usage, ttft_s=ttft,
                        tool_calls=assemble_tool_calls(parse.tool_call_deltas))
