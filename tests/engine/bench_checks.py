"""What a bench result must say about a real engine whose truth is known. Each check returns
the problems it found (empty when the claim holds), so a test can assert both that a true
claim passes and that a planted fault is caught."""

from __future__ import annotations

import sys

from prometheus_client.parser import text_string_to_metric_families

from bench.prompts import phase_messages
from bench.stream_client import METHOD_CONTINUOUS_USAGE
from tests.engine.engine_client import greedy_path, near_ties
from tests.engine.relay import RelayedStream

# docs/bench.md: per-stream tok/s within 1% of what the server really sent
TOK_S_TOLERANCE = 0.01


def counter(metrics_text: str, name: str) -> float:
    """Sum of a counter's samples (NAME_total) over label sets."""
    total = 0.0
    for family in text_string_to_metric_families(metrics_text):
        for sample in family.samples:
            if sample.name in (name, name + "_total"):
                total += sample.value
    return total


def streams(doc: dict) -> list[dict]:
    return [s for wave in doc["waves"] for s in wave["streams"]]


def check_methods(doc: dict) -> list[str]:
    problems = []
    for cell in doc["cells"]:
        where = f"{cell['phase']} c={cell['concurrency']}"
        if cell["method"] != METHOD_CONTINUOUS_USAGE:
            problems.append(f"{where}: method {cell['method']!r}")
        if cell["failed_streams"] or cell["measured_streams"] != cell["streams"]:
            problems.append(f"{where}: {cell['failed_streams']} failed: {cell['failures']}")
    return problems


def check_oracle(doc: dict, k: int) -> list[str]:
    """Every draft of an oracle is accepted: length k+1, each position's rate 1.0."""
    problems = []
    for cell in doc["cells"]:
        where = f"{cell['phase']} c={cell['concurrency']}"
        counters = cell["spec_counters"] or {}
        if cell["spec_decode"] != "measured":
            problems.append(f"{where}: spec_decode {cell['spec_decode']!r}")
            continue
        if cell["acceptance_length"] != k + 1:
            problems.append(f"{where}: acceptance length {cell['acceptance_length']} != {k + 1}")
        if cell["per_position_acceptance"] != [1.0] * k:
            problems.append(f"{where}: per-position {cell['per_position_acceptance']}")
        if counters.get("draft_tokens") != k * counters.get("drafts", -1):
            problems.append(f"{where}: {counters} is not {k} draft tokens per draft")
    return problems


def check_oracle_beyond_near_ties(doc: dict, k: int, undrafted) -> list[str]:
    """check_oracle, where a cell that falls short is excused only if one of its streams'
    paths holds a near-tie: a token the undrafted server chose by less than
    MARGIN_FLOOR_NATS within the positions drafted (max_tokens + k), where the drafter and
    the verifier, rounding differently, may choose apart. An excused cell is reported
    (stderr) with its near-ties; on a path without one, every draft must be accepted."""
    problems = []
    max_tokens = doc["settings"]["max_tokens"]
    for cell in doc["cells"]:
        found = check_oracle({"cells": [cell]}, k)
        if not found:
            continue
        ties = {}
        for wave in doc["waves"]:
            if (wave["phase"], wave["concurrency"]) != (cell["phase"], cell["concurrency"]):
                continue
            for stream in wave["streams"]:
                prompt = phase_messages(cell["phase"], stream["prefix"])[0]["content"]
                _, margins = greedy_path(undrafted, prompt, max_tokens + k)
                if near_ties(margins):
                    ties[stream["prefix"]] = near_ties(margins)
        if ties:
            print(f"oracle check: {cell['phase']} c={cell['concurrency']} excused, near-ties "
                  f"(position, nats) on its paths: {ties}; it found {found}", file=sys.stderr)
        else:
            problems += found
    return problems


def check_undrafted(doc: dict) -> list[str]:
    problems = []
    for cell in doc["cells"]:
        where = f"{cell['phase']} c={cell['concurrency']}"
        got = {key: cell[key] for key in ("spec_decode", "acceptance_length",
                                          "draft_acceptance_rate", "per_position_acceptance",
                                          "spec_counters")}
        if got != {"spec_decode": "absent", "acceptance_length": None,
                   "draft_acceptance_rate": None, "per_position_acceptance": None,
                   "spec_counters": None}:
            problems.append(f"{where}: {got}")
    return problems


def check_usage(doc: dict, relayed: list[RelayedStream], generated: float) -> list[str]:
    """Each stream's completion tokens equal the final usage the server sent it, and all of
    them (with the warm-up's) add up to the engine's own vllm:generation_tokens counter."""
    problems = []
    seen = {s.prefix.split("]")[0] + "]": s.figures() for s in relayed}
    for stream in streams(doc):
        relay = seen.get(stream["prefix"])
        if relay is None:
            problems.append(f"{stream['prefix']}: the relay saw no such stream")
        elif stream["completion_tokens"] != relay["completion_tokens"]:
            problems.append(f"{stream['prefix']}: bench {stream['completion_tokens']} completion "
                            f"tokens, server's usage {relay['completion_tokens']}")
    warmup = sum(f["completion_tokens"] or 0 for p, f in seen.items() if " warmup " in p)
    counted = sum(s["completion_tokens"] or 0 for s in streams(doc)) + warmup
    if counted != generated:
        problems.append(f"streams' completion tokens plus warm-up ({counted}) != the engine's "
                        f"vllm:generation_tokens growth ({generated:g})")
    return problems


# the bench writes chunk times rounded to the microsecond (stream_client.StreamRecord)
STAMP_ROUNDING_S = 1e-6


def check_against_relay(doc: dict, relayed: list[RelayedStream],
                        tolerance: float = TOK_S_TOLERANCE) -> list[str]:
    """Per stream, against the second client (the relay between the bench and the engine):
    the same decode tokens and token-bearing chunks; tok/s the bench's decode tokens over
    its own first-to-last chunk span (to the rounding of the two stamps it wrote); and each
    chunk stamped no earlier than the relay read it. Both stamp the host's monotonic clock
    (the wave's t0_monotonic_s lines the bench's times up with the relay's), and the relay
    writes a chunk on only after stamping it, so a bench stamp before the relay's is a clock
    other than the chunk's arrival.
    The span may then differ from the relay's by 1% plus the bench's own read delays,
    measured chunk by chunk in the process that reads (a reader descheduled on a loaded
    2-core machine reads a burst late: 30-40 ms at c=4 under CI's load)."""
    if not streams(doc):
        return ["the bench measured no stream: nothing to hold against the second client"]
    problems = []
    seen = {s.prefix.split("]")[0] + "]": s.figures() for s in relayed}
    for wave in doc["waves"]:
        for stream in wave["streams"]:
            problems += _stream_against_relay(stream, wave["t0_monotonic_s"],
                                              seen.get(stream["prefix"]), tolerance)
    return problems


def _stream_against_relay(stream: dict, t0: float, relay: dict | None,
                          tolerance: float) -> list[str]:
    where = stream["prefix"]
    if relay is None:
        return [f"{where}: the relay saw no such stream"]
    if not stream["ok"]:
        return [f"{where}: the bench did not measure it ({stream['failure']})"]
    problems = []
    if not relay["every_chunk_has_usage"]:
        problems.append(f"{where}: the server sent a chunk without usage")
    if stream["decode_tokens"] != relay["decode_tokens"]:
        problems.append(f"{where}: bench {stream['decode_tokens']} decode tokens, "
                        f"second client {relay['decode_tokens']}")
    times = stream["chunk_times_s"]
    if len(times) != relay["token_chunks"]:
        return problems + [f"{where}: bench {len(times)} token chunks, second client "
                           f"{relay['token_chunks']}"]
    own = stream["decode_tokens"] / (times[-1] - times[0])
    # the two stamps' rounding moves the written span by up to STAMP_ROUNDING_S: relative to
    # a burst's short span that is more than any fixed tolerance (16 ms: 6e-5)
    if abs(stream["tok_s"] / own - 1) > STAMP_ROUNDING_S / (times[-1] - times[0]) + 1e-9:
        problems.append(f"{where}: bench {stream['tok_s']:.4f} tok/s, its own tokens over "
                        f"its own span {own:.4f}")
    delays = [t0 + t - read for t, read in zip(times, relay["token_chunk_stamps"])]
    early = min(range(len(delays)), key=delays.__getitem__)
    if delays[early] < -STAMP_ROUNDING_S:
        problems.append(f"{where}: bench stamped token chunk {early} "
                        f"{-delays[early] * 1000:.3f} ms before the second client read it")
        return problems
    span = stream["decode_tokens"] / stream["tok_s"]
    allowance = tolerance * relay["span_s"] + delays[0] + delays[-1] + 2 * STAMP_ROUNDING_S
    if abs(span - relay["span_s"]) > allowance:
        problems.append(f"{where}: bench {stream['tok_s']:.2f} tok/s over {span:.4f} s, second "
                        f"client {relay['tok_s']:.2f} over {relay['span_s']:.4f} s (more apart "
                        f"than {tolerance:.0%} and the bench's read delays of "
                        f"{delays[0] * 1000:.1f} and {delays[-1] * 1000:.1f} ms at its ends)")
    return problems
