#!/usr/bin/env python3
"""A stand-in for `vllm serve` whose decode timing, drafting and faults are programmed.

Standard library only (Python 3.11+): it is installed as the `vllm` executable inside
stand-in Docker images, and the bench and receipt tests measure it against its known truth.

Run it like vLLM:

    fake_vllm.py serve MODEL [vllm serve flags...]

Flags it does not know are ignored. Of vLLM's own flags it honours `--host` (default
127.0.0.1, loopback unlike vLLM), `--port` (default 8000; 0 picks a free one),
`--served-model-name` (each name listed by /v1/models), `--api-key` (else VLLM_API_KEY: every
path but /health answers 401 without `Authorization: Bearer KEY`, as the chain's vLLM does
with its v8 layer v8_api_key; OPEN_PATHS here equals patches/v8/api_key_guard.py's, which
tests/unit/test_api_key.py checks), `--model`, `--headless` (serve
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
                                                      "last_chunk_monotonic", "decode_tokens",
                                                      "chunk_monotonic": [when each token-bearing
                                                      chunk was written], "chunk_tokens": [...]}
  --startup-seconds S     FAKE_VLLM_STARTUP_SECONDS  wait before listening (boot time); default 0
  --prefix-cache-block B  FAKE_VLLM_PREFIX_CACHE_BLOCK model a prefix cache of B-token blocks
                                                      (0, the default: none): a chat request's
                                                      cached tokens are the longest prefix it
                                                      shares with an earlier request's messages
                                                      and answer, floored to B, at most its
                                                      prompt tokens - 1 (token i = characters
                                                      4i..4i+3 of the messages' JSON); /metrics
                                                      then counts vllm:prefix_cache_queries
                                                      (prompt tokens) and vllm:prefix_cache_hits
                                                      (cached tokens), the request log gives
                                                      both per request ("prompt_tokens",
                                                      "cached_tokens"), and --prefill-tok-s
                                                      delays the first token by the uncached ones
  --enable-prompt-tokens-details (vLLM's flag)        usage carries prompt_tokens_details
                                                      .cached_tokens
  --max-num-seqs N        (vLLM's flag)              what GET /server_info reports (served, as
                                                      vLLM serves it, only with
                                                      VLLM_SERVER_DEV_MODE=1); with --queue the
                                                      most chat requests decoding at once
  --queue                 FAKE_VLLM_QUEUE=1          honour --max-num-seqs: a chat request
                                                      beyond it waits (vllm:num_requests_waiting)
                                                      until one finishes, its clock starting
                                                      then; off by default, because the
                                                      launcher's tests pass the recipe's 2 and
                                                      the probes send 11 at once
  --logprob-tilt T        FAKE_VLLM_LOGPROB_TILT     /v1/completions: the top-1 token's logprob is
                                                      T nats lower at every position (a candidate
                                                      whose distributions differ by a known KL);
                                                      default 0

Answer mode (the truth bench/probes.py is tested against; the http400, http500 and, on a
streamed request, truncate faults still apply). A conversation holding Hangul or kana (the
integrity probes': multibyte, tool_cycles) is answered so in every mode, --answer-faults
applied, so that a fake model serving the bench in token mode meets them too:

  --answer-probes         FAKE_VLLM_ANSWER_PROBES=1  answer as an obedient model instead of
                                                      pseudo-random tokens: "count from A to B"
                                                      counts, "passcode is X" in the prompt is
                                                      recalled when the last line asks for the
                                                      passcode, an offered get_weather tool is
                                                      called for a weather question, a tool
                                                      result is used in the next turn; an
                                                      offered tool named with a JSON object
                                                      in the question is called with it; a
                                                      Korean or Japanese question gets 450+
                                                      characters in its language (Korean with
                                                      emoji when it asks for 이모지), with
                                                      each token's bytes under logprobs
  --answer-faults LIST    FAKE_VLLM_ANSWER_FAULTS    kinds to plant, from ANSWER_FAULTS below
  --count-skip LIST       FAKE_VLLM_COUNT_SKIP       numbers left out when counting
  --count-stop N          FAKE_VLLM_COUNT_STOP       the last number written when counting
  --reasoning-field F     FAKE_VLLM_REASONING_FIELD  reasoning (vLLM 0.27.1-0.33.0, default) or
                                                      reasoning_content (DeepSeek API, old vLLM)
  --empty-tool-calls S    FAKE_VLLM_EMPTY_TOOL_CALLS without a tool call, tool_calls is absent
                                                      (vLLM 0.30.0, default), null or []
  --prefill-tok-s R       FAKE_VLLM_PREFILL_TOK_S    first token at ttft + prompt tokens / R
                                                      (prompt tokens = JSON of the messages / 4;
                                                      outside answer mode the uncached ones only)

Launcher options (for run.sh's memory guard and scripts/doctor):
  --max-model-len N       (vLLM's flag)              the max_model_len /v1/models reports;
                                                      default 327680
  --boot-log              FAKE_VLLM_BOOT_LOG=1       print vLLM 0.30.0's boot-phase lines to
                                                      stderr, spread over --startup-seconds
                                                      ("Model loading took" at 1/3, "GPU KV
                                                      cache size" at 2/3; headless ranks too)
  --engine-dies-after S   FAKE_VLLM_ENGINE_DIES_AFTER the engine core dies S s after the API
                                                      listens (0: as it comes up): /health
                                                      answers 503 from then on, /v1/models
                                                      still 200, and the process exits
                                                      --api-outlives-engine s later (vLLM
                                                      0.32.0 measured: about 4 s); default
                                                      never; SIGUSR1 kills the engine at once
  --api-outlives-engine S FAKE_VLLM_API_OUTLIVES_ENGINE default 4
  --engine-dies-at-request N FAKE_VLLM_ENGINE_DIES_AT_REQUEST the engine core dies as the N-th
                                                      POST arrives (1-based, any endpoint): it
                                                      and every later POST answer 503, then as
                                                      --engine-dies-after; default never

Truth it follows: a chat request arriving at t0 gets its first chunk (with
--first-chunk-tokens tokens) at t0 + ttft, and chunk j >= 1 at exactly t0 + ttft + j * step
(absolute deadlines, so lateness never accumulates), carrying 1 + accepted tokens (accepted
from the pattern), cut at max_tokens. Each decode step adds to /metrics one draft, K draft
tokens, `accepted` accepted tokens and one per position below `accepted`. The greedy token at
each position is derived from the messages (never from cache_salt) and the tokens before it.

Endpoints: GET /health, /version, /v1/models, /metrics, /server_info (above); POST
/v1/chat/completions (streamed SSE or not; stream_options.include_usage and
continuous_usage_stats; logprobs with top_logprobs; return_tokens_as_token_ids renders
tokens as "token_id:N"); POST /tokenize (chat messages to ids, the last one PROMPT_END) and
POST /v1/completions on token ids (greedy with `logprobs` N, and `prompt_logprobs` N
scoring given ids): there the next token depends on the prompt (the ids up to the last
PROMPT_END), the output position and the previous id, with the same near-ties, flips and
divergences as the chat model.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Self

# The paths served without the key when it is set (patches/v8/api_key_guard.py's OPEN_PATHS).
OPEN_PATHS = frozenset({"/health"})
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
    parser.add_argument("--api-key")
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
    parser.add_argument("--logprob-tilt", type=float,
                        default=float(env("FAKE_VLLM_LOGPROB_TILT", "0")))
    parser.add_argument("--prefix-cache-block", type=int,
                        default=int(env("FAKE_VLLM_PREFIX_CACHE_BLOCK", "0")))
    parser.add_argument("--enable-prompt-tokens-details", action="store_true")
    parser.add_argument("--max-num-seqs", type=int, default=0)
    parser.add_argument("--queue", action="store_true", default=_env_flag("FAKE_VLLM_QUEUE"))
    add_answer_options(parser)
    add_launcher_options(parser)
    return parser


def add_launcher_options(parser: argparse.ArgumentParser) -> None:
    """What run.sh's memory guard and scripts/doctor read from a rank: kept apart from the
    bench and probe options above."""
    parser.add_argument("--max-model-len", type=int, default=327680)
    parser.add_argument("--boot-log", action="store_true",
                        default=_env_flag("FAKE_VLLM_BOOT_LOG"))
    parser.add_argument("--engine-dies-after", type=float,
                        default=float(os.environ.get("FAKE_VLLM_ENGINE_DIES_AFTER", "-1")))
    parser.add_argument("--api-outlives-engine", type=float,
                        default=float(os.environ.get("FAKE_VLLM_API_OUTLIVES_ENGINE", "4")))
    parser.add_argument("--engine-dies-at-request", type=int,
                        default=int(os.environ.get("FAKE_VLLM_ENGINE_DIES_AT_REQUEST", "0")))


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
    answers: AnswerProgram | None = None
    # how a Korean or Japanese conversation is answered in every mode (the integrity probes)
    integrity: AnswerProgram | None = None
    max_model_len: int = 327680
    logprob_tilt: float = 0.0
    prefix_block: int = 0  # 0: no prefix cache modelled
    prompt_tokens_details: bool = False
    prefill_tok_s: float = 0.0  # 0: prefill takes no time
    api_key: str = ""
    max_num_seqs: int = 0       # vLLM's --max-num-seqs (0: not given)
    queue: bool = False         # hold chat requests beyond max_num_seqs waiting
    dev_mode: bool = False      # VLLM_SERVER_DEV_MODE=1: GET /server_info answers


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
    if args.prefix_cache_block < 0 or args.prefill_tok_s < 0:
        raise SystemExit("fake_vllm: need --prefix-cache-block >= 0 and --prefill-tok-s >= 0")
    if args.queue and args.max_num_seqs < 1:
        raise SystemExit("fake_vllm: --queue needs --max-num-seqs >= 1")
    if args.step_seconds <= 0 or args.ttft_seconds < 0 or args.first_chunk_tokens < 1:
        raise SystemExit("fake_vllm: need --step-seconds > 0, --ttft-seconds >= 0 and "
                         "--first-chunk-tokens >= 1")
    return Program(
        api_key=args.api_key or os.environ.get("VLLM_API_KEY", ""),
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
        answers=answer_program_from_args(args),
        integrity=answer_program_from_args(args, always=True),
        max_model_len=args.max_model_len,
        logprob_tilt=args.logprob_tilt,
        prefix_block=args.prefix_cache_block,
        prompt_tokens_details=args.enable_prompt_tokens_details,
        prefill_tok_s=args.prefill_tok_s,
        max_num_seqs=args.max_num_seqs,
        queue=args.queue,
        dev_mode=_env_flag("VLLM_SERVER_DEV_MODE"),
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
        self.waiting = 0  # chat requests held beyond --max-num-seqs (--queue)
        self.places = asyncio.Semaphore(program.max_num_seqs) if program.queue else None
        self.conversations: set[str] = set()
        self.created = int(time.time())
        self.cached_texts: list[str] = []  # each finished request's messages and answer, as JSON
        self.prefix_queries = 0
        self.prefix_hits = 0

    def prefix_lookup(self, messages: list) -> tuple[int, int]:
        """(prompt tokens, cached tokens) of a request, counted in /metrics."""
        text = _messages_json(messages)
        prompt = max(1, len(text) // 4)
        block = self.program.prefix_block
        if block <= 0:
            return prompt, 0
        shared = max((_common_prefix(text, earlier) for earlier in self.cached_texts), default=0)
        cached = min(shared // 4, prompt - 1) // block * block
        self.prefix_queries += prompt
        self.prefix_hits += cached
        return prompt, cached

    def remember(self, messages: list, answer: str) -> None:
        if self.program.prefix_block > 0:
            self.cached_texts.append(_messages_json(list(messages) + [{"role": "assistant", "content": answer}]))

    def count_step(self, accepted: int) -> None:
        if self.program.num_spec <= 0:
            return
        c = self.counters
        c.drafts += 1
        c.draft_tokens += self.program.num_spec
        c.accepted += accepted
        for position in range(accepted):
            c.per_position[position] += 1

    @contextlib.asynccontextmanager
    async def place(self):
        """One of --max-num-seqs places while a request decodes (--queue); a request beyond
        them waits here, counted as vllm:num_requests_waiting. Yields when it got its place
        after waiting (loop time), else None."""
        if self.places is None:
            yield None
            return
        full = self.places.locked()
        self.waiting += 1
        try:
            await self.places.acquire()
        finally:
            self.waiting -= 1
        try:
            yield asyncio.get_running_loop().time() if full else None
        finally:
            self.places.release()

    def finish(self) -> None:
        self.in_flight -= 1
        self.finished += 1
        if self.finished in self.program.restart_after:
            self.counters = Counters(per_position=[0] * self.program.num_spec)
            self.prefix_queries = self.prefix_hits = 0
            self.cached_texts = []
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
            "# HELP vllm:num_requests_waiting Number of requests waiting to be processed.",
            "# TYPE vllm:num_requests_waiting gauge",
            f"vllm:num_requests_waiting{{{labels}}} {float(self.waiting)}",
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
        if p.prefix_block > 0:
            for name, value in (("vllm:prefix_cache_queries", self.prefix_queries),
                                ("vllm:prefix_cache_hits", self.prefix_hits)):
                lines += [f"# HELP {name} Prefix cache tokens.", f"# TYPE {name} counter",
                          f"{name}{suffix}{{{labels}}} {float(value)}"]
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


# ----------------------------------------------------------------------------- token ids

PROMPT_END = VOCAB_SIZE - 1  # ends every /tokenize answer; never generated


def tokenize_messages(messages: list) -> list[int]:
    text = json.dumps(canonical_messages(messages), sort_keys=True, separators=(",", ":"))
    return [1 + ord(ch) % 1000 for ch in text] + [PROMPT_END]


def _id_step(program: Program, context: list[int]) -> tuple[int, TokenStep]:
    """(output position, the step) of the next token after `context` (prompt + output)."""
    end = len(context) - 1 - context[::-1].index(PROMPT_END)
    prompt, position = context[:end + 1], len(context) - end - 1
    seed = int(hashlib.sha256(json.dumps(prompt).encode()).hexdigest()[:16], 16)
    previous = context[-1] if position else 0
    best = _mix(seed ^ _mix(position) ^ previous) % PROMPT_END
    second = (best + 1 + _mix(best) % (PROMPT_END - 1)) % PROMPT_END
    margin = program.near_tie_margin if position in program.near_ties else CLEAR_MARGIN_NATS
    return position, TokenStep(best, best, second, margin)


def _id_ranked(program: Program, step: TokenStep, top_k: int) -> dict[int, float]:
    """The listed logprobs of a step: as the chat model's, the top-1 tilted down."""
    ranked = [(step.best, TOP_LOGPROB - program.logprob_tilt),
              (step.second, TOP_LOGPROB - step.margin)]
    ranked += [((step.best + 7 * i) % PROMPT_END, TOP_LOGPROB - step.margin - i)
               for i in range(1, top_k - 1)]
    return dict(ranked[:max(top_k, 1)])


def completion_answer(program: Program, body: dict) -> dict:
    prompt = body.get("prompt")
    if (not isinstance(prompt, list) or not prompt or PROMPT_END not in prompt
            or not all(isinstance(t, int) for t in prompt)):
        raise ValueError("fake: prompt must be token ids from /tokenize")
    as_ids = bool(body.get("return_tokens_as_token_ids"))

    def name(token: int) -> str:
        return f"token_id:{token}" if as_ids else token_text(token)

    choice: dict = {"index": 0, "finish_reason": "length", "logprobs": None,
                    "prompt_logprobs": None}
    want = body.get("prompt_logprobs")
    if want is not None:
        rows: list = [None]
        for i in range(1, len(prompt)):
            if PROMPT_END not in prompt[:i]:
                rows.append({str(prompt[i]): {"logprob": -1.0, "rank": 1,
                                              "decoded_token": token_text(prompt[i])}})
                continue
            _, step = _id_step(program, prompt[:i])
            listed = _id_ranked(program, step, int(want))
            if prompt[i] not in listed:
                listed[prompt[i]] = min(listed.values()) - 1.0
            order = sorted(listed, key=lambda t: -listed[t])
            rows.append({str(t): {"logprob": listed[t], "rank": order.index(t) + 1,
                                  "decoded_token": token_text(t)} for t in listed})
        choice["prompt_logprobs"] = rows
    context, tokens, tops = list(prompt), [], []
    top_k = int(body.get("logprobs") or 0)
    for _ in range(int(body.get("max_tokens") or 16)):
        position, step = _id_step(program, context)
        flip = position in program.diverge_at or (program.flip_near_ties
                                                  and position in program.near_ties)
        emitted = step.second if flip and program.diverge_when == "always" else step.best
        tokens.append(emitted)
        tops.append(_id_ranked(program, step, top_k))
        context.append(emitted)
    choice["text"] = "".join(token_text(t) for t in tokens)
    if body.get("logprobs") is not None:
        choice["logprobs"] = {
            "tokens": [name(t) for t in tokens],
            "token_logprobs": [top.get(t, -30.0) for t, top in zip(tokens, tops)],
            "top_logprobs": [{name(t): lp for t, lp in top.items()} for top in tops],
            "text_offset": [0] * len(tokens)}
    return {"id": "cmpl-fake", "object": "text_completion", "created": int(time.time()),
            "model": program.served_name, "choices": [choice],
            "usage": {"prompt_tokens": len(prompt), "completion_tokens": len(tokens),
                      "total_tokens": len(prompt) + len(tokens)}}


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
        if program.answers is not None:
            return await answer_request(state, body, t0, writer, program.answers)
        if integrity_conversation(messages):
            return await answer_request(state, body, t0, writer, program.integrity)
        async with state.place() as placed_at:
            # a request held waiting starts its clock when it gets its place
            return await self._run(body, messages, fault, writer, number,
                                   t0 if placed_at is None else placed_at)

    async def _run(self, body, messages, fault, writer, number, t0) -> bool:
        """Decode one chat request in token mode from T0 on."""
        state, program = self.state, self.state.program
        max_tokens = int(body.get("max_tokens") or body.get("max_completion_tokens") or 16)
        prompt_tokens, cached = state.prefix_lookup(messages)
        if program.request_log and program.prefix_block > 0:
            with open(program.request_log, "a", encoding="utf-8") as log:  # noqa: ASYNC230
                log.write(json.dumps({"prefix": number, "prompt_tokens": prompt_tokens,
                                      "cached_tokens": cached}) + "\n")
        # the first token waits for the prefill of what the cache did not hold
        t0 += (prompt_tokens - cached) / program.prefill_tok_s if program.prefill_tok_s else 0.0
        state.in_flight += 1
        try:
            perturbed = self._perturbed(body, messages)
            steps = greedy_tokens(program, messages, max_tokens, perturbed)
            plan = plan_chunks(program, max_tokens)
            text = "".join(token_text(s.emitted) for s in steps)
            if body.get("stream"):
                keep = await self._stream(body, steps, plan, t0, fault, writer, number, cached)
            else:
                keep = await self._whole(body, steps, plan, t0, writer, cached)
            if not body.get("cache_salt"):
                state.conversations.add(conversation_key(
                    list(messages) + [{"role": "assistant", "content": text}]))
            state.remember(messages, text)
            return keep
        finally:
            state.finish()

    async def _sleep_until(self, deadline: float) -> None:
        delay = deadline - asyncio.get_running_loop().time()
        if delay > 0:
            await asyncio.sleep(delay)

    def _usage(self, prompt_tokens: int, completion: int, cached: int = 0) -> dict:
        usage = {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens + completion,
                 "completion_tokens": completion}
        if self.state.program.prompt_tokens_details:
            usage["prompt_tokens_details"] = {"cached_tokens": cached}
        return usage

    async def _whole(self, body, steps, plan, t0, writer, cached) -> bool:
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
            "usage": self._usage(prompt_tokens, len(steps), cached),
        }))
        return True

    async def _stream(self, body, steps, plan, t0, fault, writer, number, cached) -> bool:
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
                events.append(head + role + (f',"usage":{json.dumps(self._usage(prompt_tokens, 0, cached))}'
                                             if continuous else "") + "}")
            finish = '"length"' if sent >= len(steps) else "null"
            logprobs = (json.dumps({"content": _logprob_entries(chunk_steps, top_k, as_ids)})
                        if want_logprobs else "null")
            content = json.dumps("".join(token_text(s.emitted) for s in chunk_steps))
            event = (head + f'{{"index":0,"delta":{{"content":{content}}},"logprobs":{logprobs},'
                     f'"finish_reason":{finish}}}]')
            if continuous:
                event += f',"usage":{json.dumps(self._usage(prompt_tokens, sent, cached))}'
            events.append(event + "}")
            writer.write(b"".join(_chunk(f"data: {e}\n\n") for e in events))
            written.append(asyncio.get_running_loop().time())
            if writer.transport.get_write_buffer_size() > 1 << 16:
                await writer.drain()
        self._log_delivery(number, written, plan)
        tail = []
        if include_usage:
            tail.append(head + f'],"usage":{json.dumps(self._usage(prompt_tokens, sent, cached))}}}')
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
                                      "decode_tokens": sum(plan.chunk_tokens[1:]),
                                      "chunk_monotonic": written,
                                      "chunk_tokens": plan.chunk_tokens}) + "\n")


def _prompt_tokens(body: dict) -> int:
    return max(1, len(_messages_json(body.get("messages") or [])) // 4)


def _messages_json(messages: list) -> str:
    return json.dumps(canonical_messages(messages))


def _common_prefix(a: str, b: str) -> int:
    """Length of the longest common prefix of A and B."""
    n = min(len(a), len(b))
    low, high = 0, n  # binary search on equal slices: C speed on long prompts
    while low < high:
        middle = (low + high + 1) // 2
        if a[:middle] == b[:middle]:
            low = middle
        else:
            high = middle - 1
    return low


# ----------------------------------------------------------------------------- obedient answers
# The probes' truth (bench/probes.py): with --answer-probes the fake answers as a model that
# obeys would, and each planted answer fault breaks one thing a probe must catch.

ANSWER_FAULTS = (
    "needle_missing",      # the passcode planted in the prompt is not recalled
    "tool_as_text",        # the tool call comes back as text in content, not in tool_calls
    "tool_none",           # no tool call at all, a plain answer instead
    "tool_bad_arguments",  # tool_calls[0].function.arguments is not JSON
    "tool_wrong_name",     # the call names a function the request did not offer
    "think_in_content",    # every text answer starts with a <think>...</think> block
    "reasoning_leak",      # every text answer carries text in the reasoning field
    "tool_result_ignored", # the turn after a tool result does not use it
    "tool_again",          # the turn after a tool result calls the tool again
    "not_json",            # HTTP 200 with an HTML body (a proxy's error page)
    # the integrity probes' faults (multibyte: every Korean or Japanese answer; tool: every
    # call a question pins with a JSON object, and every turn after a tool result)
    "mb_replacement",      # four U+FFFD in the answer, as a corrupted byte token leaves them
    "mb_surrogate",        # a lone surrogate in the answer (JSON "\ud83d")
    "mb_control",          # an escape character (U+001B) in the answer
    "mb_reasoning",        # a U+FFFD in the reasoning field; the answer clean
    "mb_token_bytes",      # the text clean, but the token bytes hold a lone lead byte 0xEA
    #                        followed by a token that does not continue it
    "mb_short",            # a 120-character answer
    "mb_off_language",     # the Japanese questions answered in English
    "mb_empty",            # an empty answer
    "tool_markup_leak",    # the pinned call written as glm47 markup in the content
    "tool_broken_json",    # the pinned call's streamed arguments stop mid-JSON
    "tool_changed_arguments",  # the pinned call's string values lose a character to U+FFFD
    "tool_repeating_tail", # the answer after a tool result ends in one phrase said 12 times
    "mb_mojibake",         # one word's UTF-8 read as CP1252 (한국 as í•œêµ­) in the answer
    "mb_loop",             # one sentence said 40 times to the end, cut by max_tokens
    "mb_no_token_bytes",   # logprobs given, but their entries carry no bytes
    "tool_answer_ok",      # the answer after a tool result is "OK.", the result unused
    "tool_answer_replacement",  # a U+FFFD in the (Korean or Japanese) answer after a result
    "tool_reasoning_surrogate",  # a lone surrogate in the reasoning of that answer
    "tool_call_content_replacement",  # a pinned call comes with content holding a U+FFFD
)
REASONING_FIELDS = ("reasoning", "reasoning_content")
EMPTY_TOOL_CALLS = ("absent", "null", "list")
LEAKED_THOUGHT = "Let me think about this step by step."


@dataclass
class AnswerProgram:
    faults: set[str]
    count_skip: set[int]
    count_stop: int | None
    reasoning_field: str
    empty_tool_calls: str
    prefill_tok_s: float


def add_answer_options(parser: argparse.ArgumentParser) -> None:
    env = os.environ.get
    parser.add_argument("--answer-probes", action="store_true",
                        default=_env_flag("FAKE_VLLM_ANSWER_PROBES"))
    parser.add_argument("--answer-faults", default=env("FAKE_VLLM_ANSWER_FAULTS", ""))
    parser.add_argument("--count-skip", default=env("FAKE_VLLM_COUNT_SKIP", ""))
    parser.add_argument("--count-stop", type=int,
                        default=int(env("FAKE_VLLM_COUNT_STOP", "0")) or None)
    parser.add_argument("--reasoning-field", choices=REASONING_FIELDS,
                        default=env("FAKE_VLLM_REASONING_FIELD", "reasoning"))
    parser.add_argument("--empty-tool-calls", choices=EMPTY_TOOL_CALLS,
                        default=env("FAKE_VLLM_EMPTY_TOOL_CALLS", "absent"))
    parser.add_argument("--prefill-tok-s", type=float,
                        default=float(env("FAKE_VLLM_PREFILL_TOK_S", "0")))


def answer_program_from_args(args: argparse.Namespace,
                             always: bool = False) -> AnswerProgram | None:
    """Answer mode's program, None without --answer-probes (unless always: what the
    integrity conversations are answered with in token mode)."""
    if not args.answer_probes and not always:
        return None
    faults = {part.strip() for part in args.answer_faults.split(",") if part.strip()}
    unknown = faults - set(ANSWER_FAULTS)
    if unknown:
        raise SystemExit(f"fake_vllm: --answer-faults {', '.join(sorted(unknown))} unknown; "
                         f"use some of {', '.join(ANSWER_FAULTS)}")
    if args.prefill_tok_s < 0:
        raise SystemExit("fake_vllm: --prefill-tok-s must be >= 0")
    return AnswerProgram(faults=faults, count_skip=set(_int_list(args.count_skip, "--count-skip")),
                         count_stop=args.count_stop, reasoning_field=args.reasoning_field,
                         empty_tool_calls=args.empty_tool_calls,
                         prefill_tok_s=args.prefill_tok_s)


@dataclass
class Reply:
    content: str | None
    reasoning: str | None = None
    tool_calls: list[dict] = field(default_factory=list)
    finish_reason: str = "stop"
    token_bytes: list[bytes] | None = None   # each output token's bytes, for logprobs
    bytes_in_logprobs: bool = True           # False: logprobs entries without their bytes


def _text_of(message: dict) -> str:
    content = message.get("content")
    if isinstance(content, list):  # OpenAI content parts
        return " ".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return content if isinstance(content, str) else ""


def _tool_call(name: str, arguments: str) -> dict:
    return {"id": "chatcmpl-tool-" + hashlib.sha256(arguments.encode()).hexdigest()[:16],
            "type": "function", "function": {"name": name, "arguments": arguments}}


def _count_reply(answers: AnswerProgram, first: int, last: int) -> Reply:
    last = min(last, answers.count_stop) if answers.count_stop else last
    numbers = [str(n) for n in range(first, last + 1) if n not in answers.count_skip]
    return Reply("\n".join(numbers))


def _weather_call(answers: AnswerProgram, question: str) -> Reply:
    found = re.search(r"\bin ([A-Z]\w*(?: [A-Z]\w*)*)", question)
    location = found.group(1) if found else "unknown"
    if "tool_as_text" in answers.faults:
        return Reply(f"<tool_call>get_weather\n<arg_key>location</arg_key>\n"
                     f"<arg_value>{location}</arg_value>\n</tool_call>")
    if "tool_none" in answers.faults:
        return Reply("I cannot look up the weather.")
    name = "get_time" if "tool_wrong_name" in answers.faults else "get_weather"
    arguments = ("{location: " + location if "tool_bad_arguments" in answers.faults
                 else json.dumps({"location": location}))
    return Reply(None, tool_calls=[_tool_call(name, arguments)], finish_reason="tool_calls")


# ----- the integrity probes' answers

# Each answer's sentences, every one its own: 450 characters never repeat a sentence, as a
# healthy answer does not (a looped one does: mb_loop)
KOREAN_SENTENCES = (
    "퍼셉트론은 입력에 가중치를 곱해 더한 값을 활성화 함수에 넣어 출력을 정합니다.",
    "신경망은 이런 단위를 여러 층으로 쌓아 복잡한 관계를 배웁니다.",
    "단층 퍼셉트론은 직선 하나로 나눌 수 있는 문제만 풀 수 있습니다.",
    "다층 신경망은 은닉층 덕분에 XOR 같은 문제도 풀 수 있습니다.",
    "학습은 오차를 줄이는 방향으로 가중치를 조금씩 고치는 과정입니다.",
    "은닉층의 뉴런은 시그모이드나 렐루 같은 비선형 함수를 씁니다.",
    "역전파는 출력의 오차를 각 층의 가중치까지 거슬러 전달합니다.",
    "경사 하강법은 손실이 줄어드는 쪽으로 매개변수를 조금씩 옮깁니다.",
    "층이 깊어질수록 더 많은 데이터와 계산 자원이 필요합니다.",
    "그래서 신경망은 이미지 인식과 번역 같은 어려운 과제도 다룹니다.",
    "정리하면 퍼셉트론은 신경망이 시작된 출발점이라고 할 수 있습니다.",
    "오늘날의 언어 모델도 결국 이 단순한 단위에서 자라났습니다.",
    "마지막으로 과적합을 막으려면 검증 데이터로 성능을 꼭 확인해야 합니다.",
    "이상으로 두 개념의 차이를 간단히 정리해 보았습니다.",
)
JAPANESE_SENTENCES = (
    "パーセプトロンは入力に重みを掛けて足し合わせ、その値で出力を決めます。",
    "ニューラルネットワークはこの単位を何層も重ねて、複雑な関係を学びます。",
    "単純なパーセプトロンは直線で分けられる問題しか解けません。",
    "隠れ層があると、XORのような問題も解けるようになります。",
    "学習とは、誤差が小さくなるように重みを少しずつ直すことです。",
    "隠れ層のニューロンは、シグモイドのような非線形の関数を使います。",
    "誤差逆伝播法は、出力の誤差を各層の重みまでさかのぼって伝えます。",
    "勾配降下法は、損失が小さくなる方向へパラメータを動かします。",
    "層が深くなるほど、多くのデータと計算資源が必要になります。",
    "そのおかげで、画像認識や翻訳のような難しい課題も扱えます。",
    "まとめると、パーセプトロンはニューラルネットワークの出発点です。",
    "今日の言語モデルも、この単純な単位から育ってきました。",
    "最後に、過学習を防ぐために検証データで性能を確かめることが大切です。",
    "以上で、二つの考え方の違いを簡単にまとめました。",
)
ENGLISH_SENTENCES = (
    "A perceptron multiplies its inputs by weights and passes the sum through a step.",
    "A neural network stacks many such units in layers and learns richer relations.",
    "A single perceptron only separates what one straight line can separate.",
    "Hidden units use non-linear activations such as the sigmoid or ReLU.",
    "Backpropagation carries the output error back to every layer's weights.",
    "Gradient descent then moves each parameter a little way downhill.",
    "Deeper networks need more data and more computation to train.",
    "In short, the perceptron is where neural networks began.",
)
LOOPED_TIMES = 40     # mb_loop: one sentence said this many times, the field's degeneration
EMOJI_CYCLE = ("🌊", "🍊", "🐶", "🎂", "🎈", "🎁")
MULTIBYTE_CHARS = 450
GLM47_CALL = "<tool_call>{name}\n<arg_key>{key}</arg_key>\n<arg_value>{value}</arg_value>\n</tool_call>"
REPEATED_PHRASE = "네, 저장했어요. "


def _has(text: str, low: int, high: int) -> bool:
    return any(low <= ord(char) <= high for char in text)


def _long_text(sentences: tuple[str, ...], emoji: bool = False) -> str:
    parts, index = [], 0
    while sum(map(len, parts)) < MULTIBYTE_CHARS:
        sentence = sentences[index % len(sentences)]
        parts.append(sentence + (f" {EMOJI_CYCLE[index % len(EMOJI_CYCLE)]} " if emoji else " "))
        index += 1
    return "".join(parts).strip()


def _byte_tokens(text: str) -> list[bytes]:
    """The answer as tokens: a character each, but an emoji split into two 2-byte tokens and
    every third Hangul syllable into its three bytes, as byte-level tokenizers split what
    their vocabulary lacks (whole only once joined)."""
    tokens: list[bytes] = []
    for index, char in enumerate(text):
        raw = char.encode("utf-8", "surrogatepass")
        if len(raw) == 4:
            tokens += [raw[:2], raw[2:]]
        elif _has(char, 0xAC00, 0xD7A3) and index % 3 == 0:
            tokens += [raw[i:i + 1] for i in range(len(raw))]
        else:
            tokens.append(raw)
    return tokens


def multibyte_reply(answers: AnswerProgram, question: str) -> Reply:
    """A Korean (with emoji when asked) or Japanese answer of 450+ characters, faults applied."""
    japanese = _has(question, 0x3040, 0x30FF)
    if japanese and "mb_off_language" in answers.faults:
        text = _long_text(ENGLISH_SENTENCES)
    else:
        text = _long_text(JAPANESE_SENTENCES if japanese else KOREAN_SENTENCES,
                          emoji="이모지" in question)
    faults = answers.faults
    if "mb_short" in faults:
        text = text[:120]
    if "mb_empty" in faults:
        text = ""
    if "mb_replacement" in faults:
        text = "\ufffd".join(text[i:i + 100] for i in range(0, len(text), 100))
    if "mb_surrogate" in faults:
        text = text[:50] + "\ud83d" + text[50:]
    if "mb_control" in faults:
        text = text[:50] + "\x1b" + text[50:]
    if "mb_mojibake" in faults:
        # one word's UTF-8 read as CP1252: 한국 shows as í•œêµ­
        text = text[:50] + " " + "한국".encode().decode("cp1252") + " " + text[50:]
    finish_reason = "stop"
    if "mb_loop" in faults:
        # one sentence said over and over until max_tokens cuts it
        sentence = (JAPANESE_SENTENCES if japanese else KOREAN_SENTENCES)[1]
        text = text[:150] + " " + (sentence + " ") * LOOPED_TIMES + sentence[:5]
        finish_reason = "length"
    tokens = _byte_tokens(text)
    if "mb_token_bytes" in faults:
        tokens.insert(10, b"\xea")   # the next token starts a character: 0xEA stays alone
    reasoning = ("생각해 보면 \ufffd 퍼셉트론부터 설명하겠습니다." if "mb_reasoning" in faults
                 else None)
    return Reply(text, reasoning=reasoning, token_bytes=tokens, finish_reason=finish_reason,
                 bytes_in_logprobs="mb_no_token_bytes" not in faults)


def pinned_call(answers: AnswerProgram, question: str, offered: set) -> Reply | None:
    """The call a question pins: an offered tool's name and a JSON object in the question."""
    names = sorted(name for name in offered if name and name in question)
    start = question.find("{")
    if not names or start < 0:
        return None
    try:
        arguments, _ = json.JSONDecoder().raw_decode(question[start:])
    except ValueError:
        return None
    name = names[0]
    if "tool_markup_leak" in answers.faults:
        key, value = next(iter(arguments.items()))
        return Reply(GLM47_CALL.format(name=name, key=key, value=value))
    if "tool_changed_arguments" in answers.faults:
        arguments = {key: value[:1] + "\ufffd" + value[2:] if isinstance(value, str) else value
                     for key, value in arguments.items()}
    text = json.dumps(arguments, ensure_ascii=False)
    if "tool_broken_json" in answers.faults:
        text = text[:-3]
    beside = ("확인해 볼게요\ufffd." if "tool_call_content_replacement" in answers.faults
              else None)
    return Reply(beside, tool_calls=[_tool_call(name, text)], finish_reason="tool_calls")


def _tool_result_reply(answers: AnswerProgram, messages: list) -> Reply:
    """The turn after a tool result; a malformed conversation is refused as vLLM would."""
    called = {call.get("id") for m in messages if m.get("role") == "assistant"
              for call in (m.get("tool_calls") or []) if isinstance(call, dict)}
    result = messages[-1]
    if result.get("tool_call_id") not in called:
        raise ValueError(f"tool message tool_call_id {result.get('tool_call_id')!r} matches no "
                         f"assistant tool_calls id {sorted(map(str, called))}")
    if "tool_again" in answers.faults:
        return Reply(None, tool_calls=[_tool_call("get_weather", '{"location": "Paris"}')],
                     finish_reason="tool_calls")
    if "tool_result_ignored" in answers.faults:
        return Reply("I do not know the weather there.")
    if "tool_answer_ok" in answers.faults:
        return Reply("OK.")
    result_text = _text_of(result)
    conversation = " ".join(_text_of(m) for m in messages if isinstance(m, dict))
    if integrity_conversation(messages):
        # answered in the conversation's language, the result's values quoted
        japanese = _has(conversation, 0x3040, 0x30FF)
        said = (f"ツールの結果を確認しました: {result_text}。" if japanese
                else f"도구 결과를 확인했습니다: {result_text}.")
        if "tool_repeating_tail" in answers.faults:
            said += " " + REPEATED_PHRASE * 12
        if "tool_answer_replacement" in answers.faults:
            said = said[:4] + "\ufffd" + said[4:]
        reasoning = ("결과를 읽어 보면 \ud83d 좋습니다." if "tool_reasoning_surrogate" in answers.faults
                     else None)
        return Reply(said, reasoning=reasoning)
    try:
        weather = json.loads(_text_of(result))
        return Reply(f"It is {weather['temperature_c']} degrees C with {weather['condition']} "
                     f"in {weather['location']}.")
    except (ValueError, KeyError, TypeError):
        return Reply(f"The tool said: {_text_of(result)}")


def obedient_reply(answers: AnswerProgram, messages: list, tools: object) -> Reply:
    """What an obedient model says to these messages, faults applied."""
    last = messages[-1] if isinstance(messages[-1], dict) else {}
    if last.get("role") == "tool":
        return _tool_result_reply(answers, messages)
    question = _text_of(last)
    offered = {t.get("function", {}).get("name") for t in tools
               if isinstance(t, dict)} if isinstance(tools, list) else set()
    if offered and (pinned := pinned_call(answers, question, offered)):
        return pinned
    if not offered and (_has(question, 0xAC00, 0xD7A3) or _has(question, 0x3040, 0x30FF)):
        return multibyte_reply(answers, question)
    if "get_weather" in offered and "weather" in question.lower():
        return _weather_call(answers, question)
    counting = re.search(r"count from (\d+) to (\d+)", question, re.IGNORECASE)
    needle = re.search(r"passcode is ([A-Za-z0-9-]+)", " ".join(_text_of(m) for m in messages
                                                               if isinstance(m, dict)))
    if counting:
        reply = _count_reply(answers, int(counting.group(1)), int(counting.group(2)))
    elif needle and "passcode" in question.lower().rsplit("\n", 1)[-1]:
        reply = Reply("I found no passcode in the document." if "needle_missing" in answers.faults
                      else f"The passcode is {needle.group(1)}.")
    else:
        reply = Reply("Twelve times twelve is 144.")
    if "think_in_content" in answers.faults:
        reply.content = f"<think>{LEAKED_THOUGHT}</think>{reply.content}"
    if "reasoning_leak" in answers.faults:
        reply.reasoning = LEAKED_THOUGHT
    return reply


def _pieces(text: str | None) -> list[str]:
    """One 'token' per word with its leading whitespace: what each chunk carries."""
    return re.findall(r"\s*\S+", text or "")


def _answer_message(answers: AnswerProgram, reply: Reply) -> dict:
    message: dict = {"role": "assistant", "content": reply.content,
                     answers.reasoning_field: reply.reasoning}
    if reply.tool_calls:
        message["tool_calls"] = reply.tool_calls
    elif answers.empty_tool_calls != "absent":
        message["tool_calls"] = None if answers.empty_tool_calls == "null" else []
    return message


def _answer_usage(prompt_tokens: int, reply: Reply, completion: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens + completion,
            "completion_tokens": completion,
            "completion_tokens_details": {"reasoning_tokens": len(_pieces(reply.reasoning))}}


def _answer_logprobs(body: dict, reply: Reply) -> dict | None:
    """OpenAI logprobs with each token's raw bytes (a token may hold part of a character)."""
    if not body.get("logprobs") or reply.token_bytes is None:
        return None
    entries = [{"token": raw.decode("utf-8", "replace"), "logprob": TOP_LOGPROB,
                "bytes": list(raw), "top_logprobs": []} for raw in reply.token_bytes]
    if not reply.bytes_in_logprobs:
        for entry in entries:
            del entry["bytes"]
    return {"content": entries}


def _tool_call_deltas(index: int, call: dict) -> list[dict]:
    """A call streamed as vLLM streams it: id, type and name first, the arguments in pieces."""
    arguments = call["function"]["arguments"]
    head = {"index": index, "id": call["id"], "type": "function",
            "function": {"name": call["function"]["name"], "arguments": ""}}
    return [{"tool_calls": [head]}] + [
        {"tool_calls": [{"index": index, "function": {"arguments": arguments[i:i + 8]}}]}
        for i in range(0, len(arguments), 8)]


def integrity_conversation(messages: list) -> bool:
    """A conversation holding Hangul or kana: the integrity probes' (and no bench prompt's).
    The fake answers it as answer mode does in every mode, so that scripts/compare's boots,
    whose fake models serve the bench in token mode, meet the same truth."""
    text = " ".join(_text_of(m) for m in messages if isinstance(m, dict))
    return _has(text, 0xAC00, 0xD7A3) or _has(text, 0x3040, 0x30FF)


async def answer_request(state: FakeState, body: dict, t0: float,
                         writer: asyncio.StreamWriter, answers: AnswerProgram) -> bool:
    """Serve one chat request in answer mode, whole or streamed, on the programmed clock: the
    first token at t0 + ttft (+ prompt tokens / --prefill-tok-s), one word per step after."""
    program = state.program
    if "not_json" in answers.faults:
        writer.write(_response(200, b"<html><body>502 Bad Gateway</body></html>", "text/html"))
        return True
    try:
        reply = obedient_reply(answers, body["messages"], body.get("tools"))
    except ValueError as exc:
        writer.write(_error(400, f"fake: {exc}", "BadRequestError"))
        return True
    prompt_tokens = _prompt_tokens(body)
    first_at = t0 + program.ttft_s + (prompt_tokens / answers.prefill_tok_s
                                      if answers.prefill_tok_s else 0.0)
    reasoning, content = _pieces(reply.reasoning), _pieces(reply.content)
    completion = (len(reasoning) + (len(reply.token_bytes) if reply.token_bytes is not None
                                    else len(content)) + len(reply.tool_calls))
    loop = asyncio.get_running_loop()
    state.in_flight += 1
    try:
        if not body.get("stream"):
            await asyncio.sleep(max(0.0, first_at + max(completion - 1, 0) * program.step_s
                                    - loop.time()))
            writer.write(_json_response(200, {
                "id": f"chatcmpl-fake{state.arrivals}", "object": "chat.completion",
                "created": int(time.time()), "model": program.served_name,
                "choices": [{"index": 0, "message": _answer_message(answers, reply),
                             "logprobs": _answer_logprobs(body, reply),
                             "finish_reason": reply.finish_reason, "stop_reason": None}],
                "usage": _answer_usage(prompt_tokens, reply, completion)}))
            return True
        head = {"id": f"chatcmpl-fake{state.arrivals}", "object": "chat.completion.chunk",
                "created": int(time.time()), "model": program.served_name}
        options = body.get("stream_options") or {}
        continuous = bool(options.get("include_usage") and options.get("continuous_usage_stats")
                          and program.continuous_usage)
        deltas = ([{answers.reasoning_field: p} for p in reasoning]
                  + [{"content": p} for p in content]
                  + [delta for i, call in enumerate(reply.tool_calls)
                     for delta in _tool_call_deltas(i, call)])
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                     b"transfer-encoding: chunked\r\n\r\n")
        events = [dict(head, choices=[{"index": 0, "delta": {"role": "assistant", "content": ""},
                                       "logprobs": None, "finish_reason": None}])]
        cut_at = len(deltas) // 2 if program.faults.get(state.arrivals) == "truncate" else None
        for index, delta in enumerate(deltas):
            await asyncio.sleep(max(0.0, first_at + index * program.step_s - loop.time()))
            if index == cut_at:
                return False   # the connection closes mid-stream
            last = index == len(deltas) - 1
            event = dict(head, choices=[{"index": 0, "delta": delta, "logprobs": None,
                                         "finish_reason": reply.finish_reason if last else None}])
            if continuous:
                event["usage"] = _answer_usage(prompt_tokens, reply, index + 1)
            events.append(event)
            writer.write(b"".join(_chunk(f"data: {json.dumps(e)}\n\n") for e in events))
            events = []
            await writer.drain()
        tail = b"".join(_chunk(f"data: {json.dumps(e)}\n\n") for e in events)  # no deltas
        if options.get("include_usage"):
            usage = dict(head, choices=[], usage=_answer_usage(prompt_tokens, reply, completion))
            tail += _chunk(f"data: {json.dumps(usage)}\n\n")
        writer.write(tail + _chunk("data: [DONE]\n\n") + b"0\r\n\r\n")
        return True
    finally:
        state.finish()


class FakeServer:
    def __init__(self, program: Program, dies_at_request: int = 0,
                 killed: asyncio.Event | None = None):
        self.state = FakeState(program)
        self.chat = ChatHandler(self.state)
        self.engine_dead = False
        self.posts, self.dies_at_request, self.killed = 0, dies_at_request, killed

    async def serve_connection(self, reader, writer) -> None:
        try:
            while True:
                request = await _read_request(reader)
                if request is None:
                    break
                method, path, headers, body = request
                keep = await self.route(method, path, body, writer, headers)
                await writer.drain()
                if not keep or headers.get("connection", "").lower() == "close":
                    break
        except (ConnectionError, asyncio.IncompleteReadError, ClientGone):
            pass
        finally:
            with contextlib.suppress(Exception):
                writer.close()

    async def route(self, method: str, path: str, body: bytes, writer, headers=None) -> bool:
        program = self.state.program
        if program.api_key and path not in OPEN_PATHS and (headers or {}).get(
                "authorization") != f"Bearer {program.api_key}":
            writer.write(_json_response(401, {"error": "Unauthorized"}))  # as the chain's vLLM
            return True
        if method == "POST":
            self.posts += 1
            if self.dies_at_request and self.posts >= self.dies_at_request:
                self.engine_dead = True
                self.killed.set()
            if self.engine_dead:
                writer.write(_error(503, "fake: the engine core is dead", "EngineDeadError"))
                return False
        if method == "GET" and path == "/health":
            writer.write(_response(503, b"") if self.engine_dead else _response(200, b""))
        elif method == "GET" and path == "/version":
            writer.write(_json_response(200, {"version": program.version}))
        elif method == "GET" and path == "/v1/models":
            writer.write(_json_response(200, {"object": "list", "data": [{
                "id": name, "object": "model", "created": self.state.created,
                "owned_by": "vllm", "root": program.model, "parent": None,
                "max_model_len": program.max_model_len} for name in program.served_names]}))
        elif method == "GET" and path == "/server_info" and program.dev_mode:
            # vLLM 0.30.0's dev endpoint (?config_format=json): the config's fields that matter here
            writer.write(_json_response(200, {"vllm_config": {"scheduler_config": {
                "max_num_seqs": program.max_num_seqs or None}}, "vllm_env": {}, "system_env": {}}))
        elif method == "GET" and path == "/metrics":
            writer.write(_response(200, self.state.metrics_text().encode(),
                                   "text/plain; version=0.0.4; charset=utf-8"))
        elif method == "POST" and path == "/v1/chat/completions":
            return await self.chat.handle(body, writer)
        elif method == "POST" and path in ("/tokenize", "/v1/completions"):
            try:
                request = json.loads(body or b"{}")
                answer = (completion_answer(program, request) if path == "/v1/completions"
                          else {"tokens": tokenize_messages(request["messages"]),
                                "max_model_len": program.max_model_len})
            except (ValueError, KeyError, TypeError) as exc:
                writer.write(_error(400, f"fake: {exc}", "BadRequestError"))
            else:
                writer.write(_json_response(200, answer))
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
    killed = asyncio.Event()  # SIGUSR1 or --engine-dies-at-request: the engine core dies now
    fake = FakeServer(program, args.engine_dies_at_request, killed)
    server = await asyncio.start_server(fake.serve_connection, args.host, args.port,
                                        reuse_address=True, backlog=512)
    host, port = server.sockets[0].getsockname()[:2]
    print(f"fake-vllm listening on http://{host}:{port}", flush=True)
    print("INFO: Application startup complete.", file=sys.stderr, flush=True)
    loop.add_signal_handler(signal.SIGUSR1, killed.set)
    async with server:
        waits = [asyncio.ensure_future(stop.wait()), asyncio.ensure_future(killed.wait())]
        timeout = None if args.engine_dies_after < 0 else args.engine_dies_after
        await asyncio.wait(waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        for waiting in waits:
            waiting.cancel()
        if stop.is_set():
            return 0
        fake.engine_dead = True
        print("ERROR: EngineCore died; the API server follows", file=sys.stderr, flush=True)
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(stop.wait(), args.api_outlives_engine)
    return 0 if stop.is_set() else 1


def main(argv: list[str] | None = None) -> int:
    args, _unknown = build_parser().parse_known_args(argv)
    program = program_from_args(args)
    return asyncio.run(_serve(args, program))


# ----------------------------------------------------------------------------- test helper


@dataclass(frozen=True)
class Delivery:
    """What the fake really sent on one completed stream, from its --request-log."""

    prefix: str                 # the first line's "[bench ...]" tag, as the bench names streams
    chunk_monotonic: list[float]
    chunk_tokens: list[int]
    decode_tokens: int

    @property
    def span_s(self) -> float:
        return self.chunk_monotonic[-1] - self.chunk_monotonic[0]

    @property
    def tok_s(self) -> float:
        """The rate the fake delivered, by its own clock: load may make it late, never wrong."""
        return self.decode_tokens / self.span_s


def deliveries(request_log: str | os.PathLike) -> dict[str, Delivery]:
    """prefix -> Delivery of every stream the fake finished, read from its request log."""
    entries = [json.loads(line) for line in Path(request_log).read_text().splitlines()]
    prefix_of = {e["arrival"]: e["body"]["messages"][0]["content"].split("]")[0] + "]"
                 for e in entries if "body" in e}
    return {prefix_of[e["delivered"]]: Delivery(prefix_of[e["delivered"]], e["chunk_monotonic"],
                                                e["chunk_tokens"], e["decode_tokens"])
            for e in entries if "delivered" in e}


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
