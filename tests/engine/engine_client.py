"""Plain requests to an engine, written apart from bench/ so that tests have their own view of
what the server says: greedy token ids and the spec-decode counters."""

from __future__ import annotations

import json
import secrets
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

SPEC_PREFIX = "vllm:spec_decode_num_"


def post_json(url: str, body: dict, timeout: float = 300) -> dict:
    request = urllib.request.Request(url, data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as reply:
        return json.load(reply)


def greedy_ids(server, prompt: str, max_tokens: int, ignore_eos: bool = True) -> list[int]:
    """The token ids a server answers a one-message chat with, greedy, under a fresh cache
    salt (no prefix-cache hit)."""
    answer = post_json(server.url + "/v1/chat/completions", {
        "model": server.model_id, "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens, "temperature": 0.0, "logprobs": True,
        "return_tokens_as_token_ids": True, "ignore_eos": ignore_eos,
        "cache_salt": secrets.token_hex(8)})
    entries = answer["choices"][0]["logprobs"]["content"]
    return [int(e["token"].removeprefix("token_id:")) for e in entries]


# a greedy token compared between two computations that round differently must win by this
# much: about 60 times the float32 rounding of a logit measured on the bigram target
# (1.6e-5 nats, dflash2_models.next_token_table)
MARGIN_FLOOR_NATS = 1e-3


def greedy_path(server, prompt: str, max_tokens: int) -> tuple[list[int], list[float]]:
    """Greedy token ids of a one-message chat (fresh cache salt) and, at each position, the
    top-1 minus top-2 logprob: the margin by which the token won."""
    answer = post_json(server.url + "/v1/chat/completions", {
        "model": server.model_id, "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens, "temperature": 0.0, "logprobs": True, "top_logprobs": 2,
        "return_tokens_as_token_ids": True, "ignore_eos": True,
        "cache_salt": secrets.token_hex(8)})
    entries = answer["choices"][0]["logprobs"]["content"]
    margins = []
    for entry in entries:
        ranked = sorted((t["logprob"] for t in entry["top_logprobs"]), reverse=True)
        margins.append(ranked[0] - ranked[1])
    return [int(e["token"].removeprefix("token_id:")) for e in entries], margins


def near_ties(margins: list[float]) -> list[tuple[int, float]]:
    """(position, margin) wherever a token won by less than MARGIN_FLOOR_NATS."""
    return [(i, m) for i, m in enumerate(margins) if m < MARGIN_FLOOR_NATS]


def spec_counters(server) -> dict:
    """{"drafts", "draft_tokens", "accepted_tokens", "per_position": {p: n}} summed over
    label sets; all zero (or empty) where the server does not draft."""
    out = {"drafts": 0.0, "draft_tokens": 0.0, "accepted_tokens": 0.0, "per_position": {}}
    for family in text_string_to_metric_families(server.metrics_text()):
        for sample in family.samples:
            if not sample.name.startswith(SPEC_PREFIX) or not sample.name.endswith("_total"):
                continue
            key = sample.name[len(SPEC_PREFIX):-len("_total")]
            if key == "accepted_tokens_per_pos":
                position = int(sample.labels["position"])
                out["per_position"][position] = out["per_position"].get(position, 0) \
                    + sample.value
            elif key in out:
                out[key] += sample.value
    return out


def counter_growth(before: dict, after: dict, k: int) -> tuple[float, list[float]]:
    """(drafts, accepted per position) grown between two spec_counters readings."""
    return (after["drafts"] - before["drafts"],
            [after["per_position"].get(p, 0) - before["per_position"].get(p, 0)
             for p in range(k)])
