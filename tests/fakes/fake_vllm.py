#!/usr/bin/env python3
"""A stand-in for `vllm serve` whose decode timing, drafting and faults are programmed.

Standard library only (Python 3.11+): it is installed as the `vllm` executable inside
stand-in Docker images, and the bench and receipt tests measure it against its known truth.

Run it like vLLM:

    fake_vllm.py serve MODEL [vllm serve flags...]

Flags it does not know are ignored. Of vLLM's own flags it honours `--host` (default
127.0.0.1, loopback unlike vLLM), `--port` (default 8000; 0 picks a free one),
`--served-model-name` (each name listed by /v1/models), `--model`, `--headless` (serve
no HTTP, stay alive until SIGTERM) and `--speculative-config` (its `num_speculative_tokens`
turns drafting on; invalid JSON exits 1, as vLLM would). SIGTERM or SIGINT ends it cleanly
with exit code 0 in every mode.
Once listening it prints one line `fake-vllm listening on http://HOST:PORT` to stdout.

Programmed behaviour: every option below can also be set by the environment variable named
beside it (the command-line option wins).

  --step-seconds S        FAKE_VLLM_STEP_SECONDS     time of one decode step, i.e. between two
                                                      chunks (the inter-token time without
                                                      drafting); default 0.02
  --ttft-seconds S        FAKE_VLLM_TTFT_SECONDS     request arrival to first token; default 0.05
  --num-spec-tokens K     FAKE_VLLM_NUM_SPEC_TOKENS  draft length K; 0 = no speculative decoding
                                                      (default: from --speculative-config, else 0)
  --accept-pattern LIST   FAKE_VLLM_ACCEPT_PATTERN   accepted drafts per decode step, cycled,
                                                      e.g. "5,2,0,3" (each 0..K); default "K"
  --first-chunk-tokens N  FAKE_VLLM_FIRST_CHUNK_TOKENS tokens in the first chunk; default 1
  --no-continuous-usage   FAKE_VLLM_NO_CONTINUOUS_USAGE=1  ignore continuous_usage_stats
  --no-spec-metrics       FAKE_VLLM_NO_SPEC_METRICS=1  omit spec-decode counters from /metrics
  --metrics-without-total FAKE_VLLM_METRICS_WITHOUT_TOTAL=1  counters without the _total suffix
  --faults LIST           FAKE_VLLM_FAULTS           KIND@N,...: the N-th chat request (1-based,
                                                      arrival order) gets fault KIND, one of
                                                      error_event, truncate, no_done, no_usage,
                                                      http400, http500
  --restart-after LIST    FAKE_VLLM_RESTART_AFTER    N,...: after the N-th chat request finishes,
                                                      simulate a restart (counters reset,
                                                      process_start_time_seconds moves on)
  --start-time T          FAKE_VLLM_START_TIME       process_start_time_seconds; default now
  --near-ties LIST        FAKE_VLLM_NEAR_TIES        output positions whose top-2 logprob margin
                                                      is --near-tie-margin (a property of every
                                                      server given the same list)
  --near-tie-margin M     FAKE_VLLM_NEAR_TIE_MARGIN  nats; default 0.05 (else the margin is 3.0)
  --flip-near-ties        FAKE_VLLM_FLIP_NEAR_TIES=1 emit the runner-up at near-tie positions
  --diverge-at LIST       FAKE_VLLM_DIVERGE_AT       output positions where the runner-up is
                                                      emitted although the margin is clear
  --diverge-when W        FAKE_VLLM_DIVERGE_WHEN     when flips and divergences apply: always
                                                      (default), concurrent (another request was
                                                      in flight at arrival) or cached (the
                                                      request resumes an earlier conversation
                                                      and carries no cache_salt)
  --version-string V      FAKE_VLLM_VERSION          GET /version answer; default 0.30.0
  --request-log FILE      FAKE_VLLM_REQUEST_LOG      append each chat request as a JSON line:
                                                      {"arrival": N, "arrival_monotonic": t0,
                                                      "body": {...}} (t0 in time.monotonic()),
                                                      and at the end of each stream
                                                      {"delivered": N, "first_chunk_monotonic",
                                                      "last_chunk_monotonic", "decode_tokens"}
  --startup-seconds S     FAKE_VLLM_STARTUP_SECONDS  wait before listening (boot time); default 0

Launcher options (for run.sh's memory guard and scripts/doctor):
  --max-model-len N       (vLLM's flag)              the max_model_len /v1/models reports;
                                                      default 327680
  --boot-log              FAKE_VLLM_BOOT_LOG=1       print vLLM 0.30.0's boot-phase lines to
                                                      stderr, spread over --startup-seconds
                                                      ("Model loading took" at 1/3, "GPU KV
                                                      cache size" at 2/3; headless ranks too)

Truth it follows: a chat request arriving at t0 gets its first chunk (with
--first-chunk-tokens tokens) at t0 + ttft, and chunk j >= 1 at exactly t0 + ttft + j * step
(absolute deadlines, so lateness never accumulates), carrying 1 + accepted tokens (accepted
from the pattern), cut at max_tokens. Each decode step adds to /metrics one draft, K draft
tokens, `accepted` accepted tokens and one per position below `accepted`. The greedy token at
each position is derived from the messages (never from cache_salt) and the tokens before it.

Endpoints: GET /health, /version, /v1/models, /metrics; POST /v1/chat/completions (streamed
SSE or not; stream_options.include_usage and continuous_usage_stats; logprobs with
top_logprobs; return_tokens_as_token_ids renders tokens as "token_id:N").
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from typing import Self

VOCAB_SIZE = 154_880
CLEAR_MARGIN_NATS = 3.0
TOP_LOGPROB = -0.01
FAULT_KINDS = ("error_event", "truncate", "no_done", "no_usage", "http400", "http500")
DIVERGE_WHEN = ("always", "concurrent", "cached")
_MASK64 = (1 << 64) - 1


# ----------------------------------------------------------------------------- options


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


def _int_list(text: str, what: str) -> list[int]:
    try:
        return [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise SystemExit(f"fake_vllm: {what} must be comma-separated integers, got {text!r}")


def _faults(text: str) -> dict[int, str]:
    faults: dict[int, str] = {}
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        kind, _, number = item.partition("@")
        if kind not in FAULT_KINDS or not number.isdigit() or int(number) < 1:
            raise SystemExit(
                f"fake_vllm: fault {item!r} must be KIND@N with N >= 1 and KIND one of "
                f"{', '.join(FAULT_KINDS)}"
            )
        faults[int(number)] = kind
    return faults


def build_parser() -> argparse.ArgumentParser:
    env = os.environ.get
    parser = argparse.ArgumentParser(prog="vllm", allow_abbrev=False, add_help=True)
    parser.add_argument("command", choices=["serve"])
    parser.add_argument("model", nargs="?")
    parser.add_argument("--model", dest="model_flag")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--served-model-name", nargs="+")
    parser.add_argument("--headless", action="store_true")
    parser.add_argument("--speculative-config")
    parser.add_argument("--step-seconds", type=float,
                        default=float(env("FAKE_VLLM_STEP_SECONDS", "0.02")))
    parser.add_argument("--ttft-seconds", type=float,
                        default=float(env("FAKE_VLLM_TTFT_SECONDS", "0.05")))
    parser.add_argument("--num-spec-tokens", type=int,
                        default=int(env("FAKE_VLLM_NUM_SPEC_TOKENS", "-1")))
    parser.add_argument("--accept-pattern", default=env("FAKE_VLLM_ACCEPT_PATTERN", ""))
    parser.add_argument("--first-chunk-tokens", type=int,
                        default=int(env("FAKE_VLLM_FIRST_CHUNK_TOKENS", "1")))
    parser.add_argument("--no-continuous-usage", action="store_true",
                        default=_env_flag("FAKE_VLLM_NO_CONTINUOUS_USAGE"))
    parser.add_argument("--no-spec-metrics", action="store_true",
                        default=_env_flag("FAKE_VLLM_NO_SPEC_METRICS"))
    parser.add_argument("--metrics-without-total", action="store_true",
                        default=_env_flag("FAKE_VLLM_METRICS_WITHOUT_TOTAL"))
    parser.add_argument("--faults", default=env("FAKE_VLLM_FAULTS", ""))
    parser.add_argument("--restart-after", default=env("FAKE_VLLM_RESTART_AFTER", ""))
    parser.add_argument("--start-time", type=float,
                        default=float(env("FAKE_VLLM_START_TIME", "0")) or None)
    parser.add_argument("--near-ties", default=env("FAKE_VLLM_NEAR_TIES", ""))
    parser.add_argument("--near-tie-margin", type=float,
                        default=float(env("FAKE_VLLM_NEAR_TIE_MARGIN", "0.05")))
    parser.add_argument("--flip-near-ties", action="store_true",
                        default=_env_flag("FAKE_VLLM_FLIP_NEAR_TIES"))
    parser.add_argument("--diverge-at", default=env("FAKE_VLLM_DIVERGE_AT", ""))
    parser.add_argument("--diverge-when", choices=DIVERGE_WHEN,
                        default=env("FAKE_VLLM_DIVERGE_WHEN", "always"))
    parser.add_argument("--version-string", default=env("FAKE_VLLM_VERSION", "0.30.0"))
    parser.add_argument("--request-log", default=env("FAKE_VLLM_REQUEST_LOG", ""))
    parser.add_argument("--startup-seconds", type=float,
                        default=float(env("FAKE_VLLM_STARTUP_SECONDS", "0")))
    add_launcher_options(parser)
    return parser


def add_launcher_options(parser: argparse.ArgumentParser) -> None:
    """What run.sh's memory guard and scripts/doctor read from a rank: kept apart from the
    bench and probe options above."""
    parser.add_argument("--max-model-len", type=int, default=327680)
    parser.add_argument("--boot-log", action="store_true",
                        default=_env_flag("FAKE_VLLM_BOOT_LOG"))


# vLLM 0.30.0's own lines that end a boot phase (gpu_model_runner.py, kv_cache_utils.py).
BOOT_LOG_LINES = (
    "INFO [gpu_model_runner.py:5417] Model loading took 1.50 GiB memory and 1.000000 seconds",
    "INFO [kv_cache_utils.py:2396] GPU KV cache size: 400,497 tokens, Maximum concurrency for "
    "327,680 tokens per request: 1.22x",
)


async def boot_log(startup_s: float, stop: asyncio.Event) -> bool:
    """Prints the boot-phase lines spread over the start-up; False when stopped meanwhile."""
    for line in BOOT_LOG_LINES:
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(stop.wait(), startup_s / (len(BOOT_LOG_LINES) + 1))
        if stop.is_set():
            return False
        print(line, file=sys.stderr, flush=True)
    return True


@dataclass
class Program:
    """The behaviour a fake server was told to have."""

    model: str
    served_name: str
    served_names: list[str]
    step_s: float
    ttft_s: float
    num_spec: int
    pattern: list[int]
    first_chunk_tokens: int
    continuous_usage: bool
    spec_metrics: bool
    counter_suffix: str
    faults: dict[int, str]
    restart_after: set[int]
    start_time: float
    near_ties: set[int]
    near_tie_margin: float
    flip_near_ties: bool
    diverge_at: set[int]
    diverge_when: str
    version: str
    request_log: str
    max_model_len: int = 327680


def program_from_args(args: argparse.Namespace) -> Program:
    model = args.model or args.model_flag
    if not model:
        raise SystemExit("fake_vllm: serve needs a MODEL (positional or --model)")
    num_spec = args.num_spec_tokens
    if num_spec < 0:
        num_spec = 0
        if args.speculative_config:
            try:
                spec = json.loads(args.speculative_config)
            except json.JSONDecodeError as exc:
                raise SystemExit(f"fake_vllm: --speculative-config is not valid JSON ({exc}): "
                                 f"{args.speculative_config!r}")
            if not isinstance(spec, dict):
                raise SystemExit("fake_vllm: --speculative-config must be a JSON object")
            num_spec = int(spec.get("num_speculative_tokens") or 0)
    pattern = _int_list(args.accept_pattern, "--accept-pattern") or [num_spec]
    if any(a < 0 or a > num_spec for a in pattern):
        raise SystemExit(f"fake_vllm: --accept-pattern values must be within 0..{num_spec} "
                         f"(the draft length), got {args.accept_pattern!r}")
    if args.step_seconds <= 0 or args.ttft_seconds < 0 or args.first_chunk_tokens < 1:
        raise SystemExit("fake_vllm: need --step-seconds > 0, --ttft-seconds >= 0 and "
                         "--first-chunk-tokens >= 1")
    return Program(
        model=model,
        served_name=(args.served_model_name or [model])[0],
        served_names=list(args.served_model_name or [model]),
        step_s=args.step_seconds,
        ttft_s=args.ttft_seconds,
        num_spec=num_spec,
        pattern=pattern,
        first_chunk_tokens=args.first_chunk_tokens,
        continuous_usage=not args.no_continuous_usage,
        spec_metrics=num_spec > 0 and not args.no_spec_metrics,
        counter_suffix="" if args.metrics_without_total else "_total",
        faults=_faults(args.faults),
        restart_after=set(_int_list(args.restart_after, "--restart-after")),
        start_time=args.start_time or time.time(),
        near_ties=set(_int_list(args.near_ties, "--near-ties")),
        near_tie_margin=args.near_tie_margin,
        flip_near_ties=args.flip_near_ties,
        diverge_at=set(_int_list(args.diverge_at, "--diverge-at")),
        diverge_when=args.diverge_when,
        version=args.version_string,
        request_log=args.request_log,
        max_model_len=args.max_model_len,
    )


# ----------------------------------------------------------------------------- the model


def _mix(value: int) -> int:
    # splitmix64 finaliser: cheap, deterministic, well spread
    value = (value + 0x9E3779B97F4A7C15) & _MASK64
    value = ((value ^ (value >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    value = ((value ^ (value >> 27)) * 0x94D049BB133111EB) & _MASK64
    return value ^ (value >> 31)


def canonical_messages(messages: list) -> list[dict]:
    return [{"role": str(m.get("role", "")), "content": m.get("content", "")}
            for m in messages if isinstance(m, dict)]


def conversation_key(messages: list) -> str:
    text = json.dumps(canonical_messages(messages), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass
class TokenStep:
    emitted: int
    best: int
    second: int
    margin: float


def greedy_tokens(program: Program, messages: list, count: int, perturbed: bool) -> list[TokenStep]:
    """The deterministic 'greedy' output for messages; perturbed applies planted flips."""
    seed = int(conversation_key(messages)[:16], 16)
    out: list[TokenStep] = []
    previous = 0
    for position in range(count):
        best = _mix(seed ^ _mix(position) ^ previous) % VOCAB_SIZE
        second = (best + 1 + _mix(best) % (VOCAB_SIZE - 1)) % VOCAB_SIZE
        margin = program.near_tie_margin if position in program.near_ties else CLEAR_MARGIN_NATS
        emitted = best
        if perturbed and (position in program.diverge_at
                          or (program.flip_near_ties and position in program.near_ties)):
            emitted = second
        out.append(TokenStep(emitted, best, second, margin))
        previous = emitted
    return out


def token_text(token: int) -> str:
    return f" w{token}"


# ----------------------------------------------------------------------------- server state


@dataclass
class Counters:
    drafts: int = 0
    draft_tokens: int = 0
    accepted: int = 0
    per_position: list[int] = field(default_factory=list)


class FakeState:
    def __init__(self, program: Program):
        self.program = program
        self.counters = Counters(per_position=[0] * program.num_spec)
        self.start_time = program.start_time
        self.arrivals = 0
        self.finished = 0
        self.in_flight = 0
        self.conversations: set[str] = set()
        self.created = int(time.time())

    def count_step(self, accepted: int) -> None:
        if self.program.num_spec <= 0:
            return
        c = self.counters
        c.drafts += 1
        c.draft_tokens += self.program.num_spec
        c.accepted += accepted
        for position in range(accepted):
            c.per_position[position] += 1

    def finish(self) -> None:
        self.in_flight -= 1
        self.finished += 1
        if self.finished in self.program.restart_after:
            self.counters = Counters(per_position=[0] * self.program.num_spec)
            self.start_time = max(time.time(), self.start_time + 1.0)

    def metrics_text(self) -> str:
        p, c, suffix = self.program, self.counters, self.program.counter_suffix
        labels = f'engine="0",model_name="{p.served_name}"'
        lines = [
            "# HELP process_start_time_seconds Start time of the process since unix epoch.",
            "# TYPE process_start_time_seconds gauge",
            f"process_start_time_seconds {self.start_time:.3f}",
            "# HELP vllm:num_requests_running Number of requests in model execution batches.",
            "# TYPE vllm:num_requests_running gauge",
            f"vllm:num_requests_running{{{labels}}} {float(self.in_flight)}",
        ]
        if p.spec_metrics:
            for name, value in (("vllm:spec_decode_num_drafts", c.drafts),
                                ("vllm:spec_decode_num_draft_tokens", c.draft_tokens),
                                ("vllm:spec_decode_num_accepted_tokens", c.accepted)):
                lines += [f"# HELP {name} Spec decode counter.", f"# TYPE {name} counter",
                          f"{name}{suffix}{{{labels}}} {float(value)}"]
            name = "vllm:spec_decode_num_accepted_tokens_per_pos"
            lines += [f"# HELP {name} Accepted tokens per draft position.",
                      f"# TYPE {name} counter"]
            lines += [f'{name}{suffix}{{{labels},position="{pos}"}} {float(value)}'
                      for pos, value in enumerate(c.per_position)]
        return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------- HTTP plumbing


class ClientGone(Exception):
    pass


async def _read_request(reader: asyncio.StreamReader):
    line = await reader.readline()
    if not line:
        return None
    try:
        method, target, _ = line.decode("latin-1").split(" ", 2)
    except ValueError:
        return None
    headers: dict[str, str] = {}
    while True:
        raw = await reader.readline()
        if raw in (b"\r\n", b"\n", b""):
            break
        name, _, value = raw.decode("latin-1").partition(":")
        headers[name.strip().lower()] = value.strip()
    length = int(headers.get("content-length", "0") or 0)
    body = await reader.readexactly(length) if length else b""
    return method, target.split("?", 1)[0], headers, body


def _response(status: int, body: bytes, content_type: str = "application/json") -> bytes:
    reason = {200: "OK", 400: "Bad Request", 404: "Not Found", 500: "Internal Server Error"}
    head = (f"HTTP/1.1 {status} {reason.get(status, 'Status')}\r\n"
            f"content-type: {content_type}\r\ncontent-length: {len(body)}\r\n\r\n")
    return head.encode() + body


def _json_response(status: int, payload) -> bytes:
    return _response(status, json.dumps(payload).encode())


def _error(status: int, message: str, kind: str) -> bytes:
    return _json_response(status, {"object": "error", "message": message, "type": kind,
                                   "param": None, "code": status})


def _chunk(data: str) -> bytes:
    payload = data.encode()
    return b"%x\r\n%s\r\n" % (len(payload), payload)


# ----------------------------------------------------------------------------- chat


@dataclass
class Plan:
    """When each chunk of one request is due and what it carries."""

    chunk_tokens: list[int]
    chunk_accepted: list[int | None]


def plan_chunks(program: Program, max_tokens: int) -> Plan:
    first = min(program.first_chunk_tokens, max_tokens)
    tokens, accepted = [first], [None]
    remaining, step = max_tokens - first, 0
    while remaining > 0:
        a = program.pattern[step % len(program.pattern)] if program.num_spec > 0 else 0
        n = min(1 + a, remaining)
        tokens.append(n)
        accepted.append(a)
        remaining -= n
        step += 1
    return Plan(tokens, accepted)


def _logprob_entries(steps: list[TokenStep], top_k: int, as_ids: bool) -> list[dict]:
    def name(token: int) -> str:
        return f"token_id:{token}" if as_ids else token_text(token)

    entries = []
    for s in steps:
        ranked = [(s.best, TOP_LOGPROB), (s.second, TOP_LOGPROB - s.margin)]
        ranked += [((s.best + 7 * i) % VOCAB_SIZE, TOP_LOGPROB - s.margin - i)
                   for i in range(1, top_k - 1)]
        entries.append({
            "token": name(s.emitted), "logprob": dict(ranked)[s.emitted], "bytes": None,
            "top_logprobs": [{"token": name(t), "logprob": lp, "bytes": None}
                             for t, lp in ranked[:top_k]],
        })
    return entries


class ChatHandler:
    def __init__(self, state: FakeState):
        self.state = state

    def _perturbed(self, body: dict, messages: list) -> bool:
        when = self.state.program.diverge_when
        if when == "always":
            return True
        if when == "concurrent":
            return self.state.in_flight > 1
        history = messages[:-1]
        return (not body.get("cache_salt") and len(history) >= 2
                and conversation_key(history) in self.state.conversations)

    async def handle(self, body_bytes: bytes, writer: asyncio.StreamWriter) -> bool:
        """Serve one chat request; returns False when the connection must close."""
        state, program = self.state, self.state.program
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        try:
            body = json.loads(body_bytes or b"{}")
        except json.JSONDecodeError:
            writer.write(_error(400, "fake: request body is not JSON", "BadRequestError"))
            return True
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            writer.write(_error(400, "fake: messages must be a non-empty list", "BadRequestError"))
            return True
        state.arrivals += 1
        number = state.arrivals
        if program.request_log:
            # a blocking append of one short line: cheaper than a thread hop, and test-only
            with open(program.request_log, "a", encoding="utf-8") as log:  # noqa: ASYNC230
                log.write(json.dumps({"arrival": number, "arrival_monotonic": t0,
                                      "body": body}) + "\n")
        fault = program.faults.get(number)
        if fault == "http400":
            writer.write(_error(400, "fake: injected bad request", "BadRequestError"))
            return True
        if fault == "http500":
            writer.write(_error(500, "fake: injected server error", "InternalServerError"))
            return True
        max_tokens = int(body.get("max_tokens") or body.get("max_completion_tokens") or 16)
        state.in_flight += 1
        try:
            perturbed = self._perturbed(body, messages)
            steps = greedy_tokens(program, messages, max_tokens, perturbed)
            plan = plan_chunks(program, max_tokens)
            text = "".join(token_text(s.emitted) for s in steps)
            if body.get("stream"):
                keep = await self._stream(body, steps, plan, t0, fault, writer, number)
            else:
                keep = await self._whole(body, steps, plan, t0, writer)
            if not body.get("cache_salt"):
                state.conversations.add(conversation_key(
                    list(messages) + [{"role": "assistant", "content": text}]))
            return keep
        finally:
            state.finish()

    async def _sleep_until(self, deadline: float) -> None:
        delay = deadline - asyncio.get_running_loop().time()
        if delay > 0:
            await asyncio.sleep(delay)

    def _usage(self, prompt_tokens: int, completion: int) -> dict:
        return {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens + completion,
                "completion_tokens": completion}

    async def _whole(self, body, steps, plan, t0, writer) -> bool:
        program = self.state.program
        await self._sleep_until(t0 + program.ttft_s + (len(plan.chunk_tokens) - 1) * program.step_s)
        for a in plan.chunk_accepted[1:]:
            self.state.count_step(a)
        text = "".join(token_text(s.emitted) for s in steps)
        choice: dict = {"index": 0, "message": {"role": "assistant", "reasoning_content": None,
                                                "content": text},
                        "logprobs": None, "finish_reason": "length", "stop_reason": None}
        if body.get("logprobs"):
            top_k = int(body.get("top_logprobs") or 0)
            choice["logprobs"] = {"content": _logprob_entries(
                steps, top_k, bool(body.get("return_tokens_as_token_ids")))}
        prompt_tokens = _prompt_tokens(body)
        writer.write(_json_response(200, {
            "id": f"chatcmpl-fake{self.state.arrivals}", "object": "chat.completion",
            "created": int(time.time()), "model": program.served_name, "choices": [choice],
            "usage": self._usage(prompt_tokens, len(steps)),
        }))
        return True

    async def _stream(self, body, steps, plan, t0, fault, writer, number) -> bool:
        program, state = self.state.program, self.state
        options = body.get("stream_options") or {}
        include_usage = bool(options.get("include_usage")) and fault != "no_usage"
        continuous = (include_usage and program.continuous_usage
                      and bool(options.get("continuous_usage_stats")))
        want_logprobs = bool(body.get("logprobs"))
        top_k = int(body.get("top_logprobs") or 0)
        as_ids = bool(body.get("return_tokens_as_token_ids"))
        prompt_tokens = _prompt_tokens(body)
        head = (f'{{"id":"chatcmpl-fake{state.arrivals}","object":"chat.completion.chunk",'
                f'"created":{int(time.time())},"model":{json.dumps(program.served_name)},'
                f'"choices":[')
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                     b"transfer-encoding: chunked\r\n\r\n")
        cut_at = len(plan.chunk_tokens) // 2 if fault in ("error_event", "truncate") else None
        sent, written = 0, []
        for index, (n_tokens, accepted) in enumerate(zip(plan.chunk_tokens, plan.chunk_accepted)):
            await self._sleep_until(t0 + program.ttft_s + index * program.step_s)
            if index == cut_at:
                if fault == "truncate":
                    with contextlib.suppress(ConnectionError):
                        await writer.drain()
                    return False
                error = {"error": {"object": "error", "message": "fake: injected error event",
                                   "type": "InternalServerError", "code": 500}}
                writer.write(_chunk(f"data: {json.dumps(error)}\n\n"))
                writer.write(_chunk("data: [DONE]\n\n") + b"0\r\n\r\n")
                return True
            if accepted is not None:
                state.count_step(accepted)
            chunk_steps = steps[sent:sent + n_tokens]
            sent += n_tokens
            events = []
            if index == 0:
                role = '{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,' \
                       '"finish_reason":null}]'
                events.append(head + role + (f',"usage":{json.dumps(self._usage(prompt_tokens, 0))}'
                                             if continuous else "") + "}")
            finish = '"length"' if sent >= len(steps) else "null"
            logprobs = (json.dumps({"content": _logprob_entries(chunk_steps, top_k, as_ids)})
                        if want_logprobs else "null")
            content = json.dumps("".join(token_text(s.emitted) for s in chunk_steps))
            event = (head + f'{{"index":0,"delta":{{"content":{content}}},"logprobs":{logprobs},'
                     f'"finish_reason":{finish}}}]')
            if continuous:
                event += f',"usage":{json.dumps(self._usage(prompt_tokens, sent))}'
            events.append(event + "}")
            writer.write(b"".join(_chunk(f"data: {e}\n\n") for e in events))
            written.append(asyncio.get_running_loop().time())
            if writer.transport.get_write_buffer_size() > 1 << 16:
                await writer.drain()
        self._log_delivery(number, written, plan)
        tail = []
        if include_usage:
            tail.append(head + f'],"usage":{json.dumps(self._usage(prompt_tokens, sent))}}}')
        out = b"".join(_chunk(f"data: {e}\n\n") for e in tail)
        if fault != "no_done":
            out += _chunk("data: [DONE]\n\n")
        writer.write(out + b"0\r\n\r\n")
        return True


    def _log_delivery(self, number: int, written: list[float], plan: Plan) -> None:
        """What was really sent and when, so a starved fake cannot pass for a slow client."""
        if self.state.program.request_log and len(written) > 1:
            with open(self.state.program.request_log, "a", encoding="utf-8") as log:
                log.write(json.dumps({"delivered": number, "first_chunk_monotonic": written[0],
                                      "last_chunk_monotonic": written[-1],
                                      "decode_tokens": sum(plan.chunk_tokens[1:])}) + "\n")


def _prompt_tokens(body: dict) -> int:
    text = json.dumps(canonical_messages(body.get("messages") or []))
    return max(1, len(text) // 4)


class FakeServer:
    def __init__(self, program: Program):
        self.state = FakeState(program)
        self.chat = ChatHandler(self.state)

    async def serve_connection(self, reader, writer) -> None:
        try:
            while True:
                request = await _read_request(reader)
                if request is None:
                    break
                method, path, headers, body = request
                keep = await self.route(method, path, body, writer)
                await writer.drain()
                if not keep or headers.get("connection", "").lower() == "close":
                    break
        except (ConnectionError, asyncio.IncompleteReadError, ClientGone):
            pass
        finally:
            with contextlib.suppress(Exception):
                writer.close()

    async def route(self, method: str, path: str, body: bytes, writer) -> bool:
        program = self.state.program
        if method == "GET" and path == "/health":
            writer.write(_response(200, b""))
        elif method == "GET" and path == "/version":
            writer.write(_json_response(200, {"version": program.version}))
        elif method == "GET" and path == "/v1/models":
            writer.write(_json_response(200, {"object": "list", "data": [{
                "id": name, "object": "model", "created": self.state.created,
                "owned_by": "vllm", "root": program.model, "parent": None,
                "max_model_len": program.max_model_len} for name in program.served_names]}))
        elif method == "GET" and path == "/metrics":
            writer.write(_response(200, self.state.metrics_text().encode(),
                                   "text/plain; version=0.0.4; charset=utf-8"))
        elif method == "POST" and path == "/v1/chat/completions":
            return await self.chat.handle(body, writer)
        else:
            writer.write(_error(404, f"fake: no route {method} {path}", "NotFoundError"))
        return True


# ----------------------------------------------------------------------------- main


async def _serve(args: argparse.Namespace, program: Program) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    if args.headless:
        print(f"fake-vllm headless rank for {program.model}", file=sys.stderr, flush=True)
        if args.boot_log:
            await boot_log(args.startup_seconds, stop)
        await stop.wait()
        return 0
    began = loop.time()
    if args.boot_log and not await boot_log(args.startup_seconds, stop):
        return 0
    remaining = args.startup_seconds - (loop.time() - began)
    if remaining > 0:
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(stop.wait(), remaining)
        if stop.is_set():
            return 0
    fake = FakeServer(program)
    server = await asyncio.start_server(fake.serve_connection, args.host, args.port,
                                        reuse_address=True, backlog=512)
    host, port = server.sockets[0].getsockname()[:2]
    print(f"fake-vllm listening on http://{host}:{port}", flush=True)
    print("INFO: Application startup complete.", file=sys.stderr, flush=True)
    async with server:
        await stop.wait()
    return 0


def main(argv: list[str] | None = None) -> int:
    args, _unknown = build_parser().parse_known_args(argv)
    program = program_from_args(args)
    return asyncio.run(_serve(args, program))


# ----------------------------------------------------------------------------- test helper


class RunningFake:
    """A fake server process started by spawn(); use as a context manager."""

    def __init__(self, process: subprocess.Popen, url: str):
        self.process, self.url = process, url

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self.process.stdout:
            self.process.stdout.close()
        return self.process.returncode

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def spawn(*args: str, env: dict | None = None, model: str = "fake/model",
          timeout_s: float = 15.0) -> RunningFake:
    """Start the fake on 127.0.0.1 and a free port; return once it answers /health."""
    command = [sys.executable, os.path.abspath(__file__), "serve", model,
               "--host", "127.0.0.1", "--port", "0", *args]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True,
                               env={**os.environ, **(env or {})})
    line = process.stdout.readline().strip() if process.stdout else ""
    if not line.startswith("fake-vllm listening on "):
        process.kill()
        process.wait()
        raise RuntimeError(f"fake_vllm did not start (exit {process.returncode}): {line!r}")
    url = line.rsplit(" ", 1)[1]
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as reply:
                if reply.status == 200:
                    return RunningFake(process, url)
        except OSError:
            if time.monotonic() > deadline:
                process.kill()
                raise RuntimeError(f"fake_vllm at {url} did not answer /health in {timeout_s}s")
            time.sleep(0.02)


if __name__ == "__main__":
    sys.exit(main())
