"""From raw stream records to wave figures, and from waves to the per-phase, per-concurrency
cells of the JSON contract."""

from __future__ import annotations

import statistics

from bench.server_metrics import SpecDelta, acceptance
from bench.stream_client import StreamRecord


def spread(values: list[float]) -> dict | None:
    """Median with min and max; None when nothing was measured."""
    if not values:
        return None
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def wave_figures(streams: list[StreamRecord]) -> dict:
    """Per-stream tok/s is the mean over measured streams; aggregate tok/s is all their
    post-first-chunk tokens over the span from the earliest first chunk to the latest last."""
    measured = [s for s in streams if s.ok]
    if not measured:
        return {"per_stream_tok_s": None, "aggregate_tok_s": None, "ttft_s": None,
                "first_chunk_spread_s": None}
    firsts = [s.t_first_s for s in measured]
    span = max(s.t_last_s for s in measured) - min(firsts)
    return {
        "per_stream_tok_s": statistics.fmean(s.tok_s for s in measured),
        "aggregate_tok_s": sum(s.decode_tokens for s in measured) / span,
        "ttft_s": statistics.fmean(s.ttft_s for s in measured),
        # streams that start apart lower the aggregate: this says by how much they did
        "first_chunk_spread_s": max(firsts) - min(firsts),
    }


def cell_method(streams: list[StreamRecord]) -> str | None:
    methods = sorted({s.method for s in streams if s.ok and s.method})
    if not methods:
        return None
    return methods[0] if len(methods) == 1 else "mixed:" + ",".join(methods)


def build_cell(phase: str, concurrency: int, waves: list[dict], records: list[list[StreamRecord]],
               delta: SpecDelta | None, spec_status: str, invalid_reason: str | None,
               restarts: int) -> dict:
    """One cell of the contract; waves are the raw wave dicts, records their stream records."""
    every = [r for wave in records for r in wave]
    measured = [r for r in every if r.ok]
    failures = [{"run": wave["run"], "stream": r.stream, "kind": r.failure, "detail": r.detail}
                for wave, wave_records in zip(waves, records) for r in wave_records if not r.ok]
    chunk_counts = [n for r in measured for n in r.chunk_tokens if n is not None]

    def over_runs(key: str) -> dict | None:
        return spread([w[key] for w in waves if w[key] is not None])

    # no measured stream, no acceptance: the counters moved for streams that failed
    figures = acceptance(None if invalid_reason or not measured else delta)
    return {
        "phase": phase,
        "concurrency": concurrency,
        "runs": len(waves),
        "streams": len(every),
        "measured_streams": len(measured),
        "per_stream_tok_s": over_runs("per_stream_tok_s"),
        "aggregate_tok_s": over_runs("aggregate_tok_s"),
        "ttft_s": over_runs("ttft_s"),
        "completion_tokens": spread([r.completion_tokens for r in measured]),
        "mean_tokens_per_chunk": (statistics.fmean(chunk_counts) if chunk_counts else None),
        **figures,
        "spec_decode": spec_status,
        "spec_counters": delta.to_json() if delta and not invalid_reason else None,
        "failed_streams": len(failures),
        "failures": failures,
        "restarts": restarts,
        "invalid": invalid_reason is not None,
        "invalid_reason": invalid_reason,
        "method": cell_method(every),
    }
