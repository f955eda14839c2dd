"""vLLM's /metrics: spec-decode and prefix-cache counters and process start time, their deltas,
and the acceptance figures derived from them."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

DRAFTS = "vllm:spec_decode_num_drafts"
DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens"
ACCEPTED = "vllm:spec_decode_num_accepted_tokens"
ACCEPTED_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos"
START_TIME = "process_start_time_seconds"
# requests the scheduler holds, not running: beyond max_num_seqs, or out of KV (a gauge)
WAITING = "vllm:num_requests_waiting"
# prefix-cache tokens looked up and found, counted per request at its scheduling (vLLM v1)
PREFIX_QUERIES = "vllm:prefix_cache_queries"
PREFIX_HITS = "vllm:prefix_cache_hits"
_PREFIX = {PREFIX_QUERIES: "queries", PREFIX_HITS: "hits"}
_TOTALS = {DRAFTS: "drafts", DRAFT_TOKENS: "draft_tokens", ACCEPTED: "accepted_tokens"}


@dataclass
class MetricsSnapshot:
    """What /metrics said at one moment; spec is None when the server has no such counters."""

    reachable: bool
    error: str | None = None
    start_time: float | None = None
    spec: dict[str, float] | None = None
    per_position: dict[int, float] = field(default_factory=dict)
    prefix: dict[str, float] | None = None  # {"queries", "hits"}; None without such counters
    waiting: float | None = None  # the WAITING gauge summed over engines; None without it

    def to_json(self) -> dict:
        return {"reachable": self.reachable, "error": self.error, "start_time": self.start_time,
                "spec": self.spec, "per_position": {str(k): v for k, v in
                                                    sorted(self.per_position.items())},
                "prefix": self.prefix, "waiting": self.waiting}


def _base_name(sample_name: str) -> str | None:
    """Counter samples come as NAME_total (or bare NAME without the suffix); skip _created."""
    if sample_name.endswith("_created"):
        return None
    return sample_name.removesuffix("_total")


def parse_metrics(text: str) -> MetricsSnapshot:
    """Sum the spec-decode counters over engines and label sets; read the start time."""
    snapshot = MetricsSnapshot(reachable=True)
    totals: dict[str, float] = {}
    prefix: dict[str, float] = {}
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                name = _base_name(sample.name)
                if name == START_TIME:
                    snapshot.start_time = float(sample.value)
                elif name == WAITING:
                    snapshot.waiting = (snapshot.waiting or 0.0) + float(sample.value)
                elif name in _TOTALS:
                    key = _TOTALS[name]
                    totals[key] = totals.get(key, 0.0) + float(sample.value)
                elif name in _PREFIX:
                    key = _PREFIX[name]
                    prefix[key] = prefix.get(key, 0.0) + float(sample.value)
                elif name == ACCEPTED_PER_POS:
                    position = int(sample.labels.get("position", "-1"))
                    if position < 0:
                        raise ValueError(f"{ACCEPTED_PER_POS} sample without a position label")
                    snapshot.per_position[position] = (
                        snapshot.per_position.get(position, 0.0) + float(sample.value))
    except ValueError as exc:
        return MetricsSnapshot(reachable=True, error=f"unparseable /metrics: {exc}")
    if totals:
        for key in _TOTALS.values():
            totals.setdefault(key, 0.0)
        snapshot.spec = totals
    if prefix:
        snapshot.prefix = {key: prefix.get(key, 0.0) for key in _PREFIX.values()}
    return snapshot


async def fetch_metrics(session: aiohttp.ClientSession, url: str) -> MetricsSnapshot:
    try:
        async with session.get(url + "/metrics") as reply:
            status, text = reply.status, await reply.text()
    except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
        return MetricsSnapshot(reachable=False, error=f"GET {url}/metrics failed: {exc!r}")
    if status == 404:
        return MetricsSnapshot(reachable=False, error=None)  # not a vLLM-style server: no counters
    if status != 200:
        return MetricsSnapshot(reachable=False, error=f"GET {url}/metrics answered HTTP {status}")
    return parse_metrics(text)


def restart_between(before: MetricsSnapshot, after: MetricsSnapshot) -> str | None:
    """Why the two snapshots cannot come from one server life, or None if they can."""
    if before.start_time is not None and after.start_time is not None \
            and before.start_time != after.start_time:
        return (f"server restarted: process_start_time_seconds changed from "
                f"{before.start_time:.3f} to {after.start_time:.3f}")
    if before.spec and after.spec:
        for key, value in before.spec.items():
            if after.spec.get(key, 0.0) < value:
                return f"server restarted: counter {key} went down from {value:g} to " \
                       f"{after.spec.get(key, 0.0):g}"
    return None


@dataclass
class SpecDelta:
    drafts: float
    draft_tokens: float
    accepted_tokens: float
    accepted_per_position: list[float]

    def to_json(self) -> dict:
        return dict(self.__dict__)


def spec_delta(before: MetricsSnapshot, after: MetricsSnapshot) -> SpecDelta | None:
    """Counter growth between two snapshots of one server life; None without counters."""
    if before.spec is None or after.spec is None:
        return None
    positions = range(max(list(before.per_position) + list(after.per_position), default=-1) + 1)
    return SpecDelta(
        drafts=after.spec["drafts"] - before.spec["drafts"],
        draft_tokens=after.spec["draft_tokens"] - before.spec["draft_tokens"],
        accepted_tokens=after.spec["accepted_tokens"] - before.spec["accepted_tokens"],
        accepted_per_position=[after.per_position.get(p, 0.0) - before.per_position.get(p, 0.0)
                               for p in positions],
    )


def prefix_delta(before: MetricsSnapshot, after: MetricsSnapshot) -> dict[str, float] | None:
    """{"queries", "hits"} tokens counted between two snapshots of one server life; None without
    the counters or across a restart (a counter went down)."""
    if before.prefix is None or after.prefix is None:
        return None
    delta = {key: after.prefix[key] - before.prefix[key] for key in _PREFIX.values()}
    return None if min(delta.values()) < 0 else delta


def acceptance(delta: SpecDelta | None) -> dict:
    """Acceptance length = 1 + accepted/drafts; rate = accepted/draft tokens; position p =
    accepted at p / drafts. All None when there were no drafts to judge."""
    if delta is None or delta.drafts <= 0:
        return {"acceptance_length": None, "draft_acceptance_rate": None,
                "per_position_acceptance": None}
    return {
        "acceptance_length": 1.0 + delta.accepted_tokens / delta.drafts,
        "draft_acceptance_rate": (delta.accepted_tokens / delta.draft_tokens
                                  if delta.draft_tokens > 0 else None),
        "per_position_acceptance": [n / delta.drafts for n in delta.accepted_per_position],
    }
