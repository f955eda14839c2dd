"""Greedy token ids with their top-2 logprob margins, recorded from a server, and the
comparison of two such recordings (identical, a near-tie, or a real difference)."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass

import aiohttp

VERDICT_IDENTICAL = "identical"
VERDICT_NEAR_TIE = "near_tie"
VERDICT_DIFFERS = "differs"
END = "<end>"


class ReceiptError(Exception):
    """A reason a receipt could not be taken, phrased for the user."""


@dataclass
class GreedyOutput:
    tokens: list[str]             # "token_id:N" where the server renders ids, else token text
    margins: list[float | None]   # top-1 minus top-2 logprob (nats) at each position
    text: str
    finish_reason: str | None
    cached_tokens: int | None     # prompt tokens served from the prefix cache, where reported


def greedy_request(model: str, messages: list[dict], max_tokens: int,
                   cache_salt: str | None) -> dict:
    body = {
        "model": model, "messages": messages, "max_tokens": max_tokens, "temperature": 0.0,
        "stream": False, "logprobs": True, "top_logprobs": 2,
        "return_tokens_as_token_ids": True,
        "chat_template_kwargs": {"enable_thinking": False},
    }
    if cache_salt is not None:
        body["cache_salt"] = cache_salt  # vLLM keeps salted prompts out of others' prefix cache
    return body


def _margin(entry: dict) -> float | None:
    ranked = sorted((float(t["logprob"]) for t in entry.get("top_logprobs") or []), reverse=True)
    return ranked[0] - ranked[1] if len(ranked) >= 2 else None


async def record_greedy(session: aiohttp.ClientSession, url: str, model: str,
                        messages: list[dict], max_tokens: int,
                        cache_salt: str | None = None) -> GreedyOutput:
    body = greedy_request(model, messages, max_tokens, cache_salt)
    try:
        async with session.post(url + "/v1/chat/completions", json=body) as reply:
            status, raw = reply.status, await reply.read()
    except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
        raise ReceiptError(f"POST {url}/v1/chat/completions failed ({exc!r}): is it up?") from exc
    if status != 200:
        raise ReceiptError(f"{url}/v1/chat/completions answered HTTP {status}: "
                           f"{raw[:200].decode('utf-8', 'replace')}")
    try:
        answer = json.loads(raw)
        choice = answer["choices"][0]
        entries = choice["logprobs"]["content"]
        usage = answer.get("usage") or {}
    except (ValueError, KeyError, IndexError, TypeError) as exc:
        raise ReceiptError(f"{url} returned no logprobs.content: the server must support "
                           f"logprobs with top_logprobs") from exc
    details = usage.get("prompt_tokens_details") or {}
    return GreedyOutput(
        tokens=[str(e["token"]) for e in entries],
        margins=[_margin(e) for e in entries],
        text=(choice.get("message") or {}).get("content") or "",
        finish_reason=choice.get("finish_reason"),
        cached_tokens=details.get("cached_tokens"),
    )


@dataclass
class Comparison:
    verdict: str
    compared: int                  # positions that matched before the first difference
    position: int | None = None    # first differing position (0-based), None when identical
    token_a: str | None = None
    token_b: str | None = None
    margin_a: float | None = None
    margin_b: float | None = None

    @property
    def passed(self) -> bool:
        return self.verdict != VERDICT_DIFFERS

    def describe(self, near_tie_nats: float) -> str:
        if self.verdict == VERDICT_IDENTICAL:
            return f"identical over {self.compared} tokens"
        margins = "/".join("n/a" if m is None else f"{m:.3f}" for m in (self.margin_a,
                                                                       self.margin_b))
        if self.verdict == VERDICT_NEAR_TIE:
            return (f"near-tie at position {self.position}: {self.token_a} vs {self.token_b}, "
                    f"top-2 margins {margins} nats < {near_tie_nats}; {self.compared} tokens "
                    f"identical before it")
        return (f"differs at position {self.position}: {self.token_a} vs {self.token_b}, "
                f"top-2 margins {margins} nats (near-tie threshold {near_tie_nats}); "
                f"{self.compared} tokens identical before it")

    def to_json(self) -> dict:
        return dict(self.__dict__, passed=self.passed)


def compare_outputs(a: GreedyOutput, b: GreedyOutput, near_tie_nats: float) -> Comparison:
    """First difference of two greedy recordings. It is a near-tie (not a failure) only when
    both servers put the top two candidates there less than near_tie_nats apart; an output
    that ends where the other goes on is a difference (no margin exists for it)."""
    for position in range(max(len(a.tokens), len(b.tokens))):
        token_a = a.tokens[position] if position < len(a.tokens) else END
        token_b = b.tokens[position] if position < len(b.tokens) else END
        if token_a == token_b:
            continue
        margin_a = a.margins[position] if token_a != END else None
        margin_b = b.margins[position] if token_b != END else None
        near = (margin_a is not None and margin_b is not None
                and max(margin_a, margin_b) < near_tie_nats)
        return Comparison(VERDICT_NEAR_TIE if near else VERDICT_DIFFERS, position, position,
                          token_a, token_b, margin_a, margin_b)
    return Comparison(VERDICT_IDENTICAL, len(a.tokens))
