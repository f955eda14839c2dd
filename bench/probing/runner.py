"""The probes in their order against one server: the result document (docs/probes.md,
"The result"), a contract other tools read."""

from __future__ import annotations

import asyncio
import datetime
import time
from collections.abc import Awaitable, Callable

import aiohttp

from bench.bench_decode import api_key_of, server_identity
from bench.probing.client import Target
from bench.probing.multibyte import probe_multibyte
from bench.probing.serving import (NEEDLE_MAX_TOKENS, probe_counting, probe_needle,
                                   probe_thinking_off)
from bench.probing.tool_cycles import probe_tool_cycles
from bench.probing.tools import probe_tool_call, probe_tool_conversation
from bench.probing.verdict import ProbeError, ProbeResult, ProbesCannotRun, failed_probes

SCHEMA = "probes/1"
DEFAULT_URL = "http://127.0.0.1:8000"
DEFAULT_PROMPT_TOKENS = 8192

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
    doc["failed"] = failed_probes(doc["probes"])
    doc["passed"] = not doc["failed"]
    doc["finished_at"] = _now_iso()
    return doc


def run_probes(base_url: str, **kwargs) -> dict:
    """run_probes_async for callers without an event loop."""
    return asyncio.run(run_probes_async(base_url, **kwargs))
