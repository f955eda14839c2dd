#!/usr/bin/env python3
"""The bench's own cost and ceiling, measured against the fake server whose truth is known.

    bench/bench_cost.py [--concurrency 16,32,64] [--rate 200] [--tokens-per-chunk 1]

For each concurrency it starts tests/fakes/fake_vllm.py streaming at --rate tok/s per stream,
runs bench_decode (one wave, in this process) and prints, per concurrency: the worst
per-stream and the aggregate error against what the fake really sent and when (its request
log), how late the fake itself ran against its programme, and the CPU seconds per 1,000
streamed tokens of the bench and of the fake.
Run it on an otherwise idle machine: the fake and the bench share its cores.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import sys
import tempfile
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from recipekit.one_line_parser import OneLineParser

if __name__ == "__main__":  # a missing package: one line naming the install command
    from bench import requires

    requires.require("bench/bench_cost.py", requires.CLIENT_MODULES, __doc__)

from bench import bench_decode

FAKE = Path(__file__).resolve().parent.parent / "tests" / "fakes" / "fake_vllm.py"


def _cpu_seconds(pid: int) -> float:
    """utime + stime of a process from /proc (Linux), in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure(concurrency: int, rate: float, tokens_per_chunk: int, decode_s: float,
            ttft_s: float) -> dict:
    sys.path.insert(0, str(FAKE.parent))
    import fake_vllm  # the fake is a test fixture, not part of the bench package

    step_s = tokens_per_chunk / rate
    steps = round(decode_s / step_s)
    max_tokens = 1 + steps * tokens_per_chunk
    spec = ["--num-spec-tokens", str(tokens_per_chunk - 1)] if tokens_per_chunk > 1 else []
    with tempfile.TemporaryDirectory() as tmp:
        log, out = Path(tmp) / "requests.jsonl", Path(tmp) / "result.json"
        with fake_vllm.spawn("--step-seconds", repr(step_s), "--ttft-seconds", repr(ttft_s),
                             "--request-log", str(log), *spec) as fake:
            fake_cpu0 = _cpu_seconds(fake.process.pid)
            with contextlib.redirect_stdout(io.StringIO()):  # only this tool's table is shown
                code = bench_decode.main([
                    "--url", fake.url, "--quiet", "--warmup", "0", "--phase", "prose",
                    "--runs", "1", "--concurrency", str(concurrency),
                    "--max-tokens", str(max_tokens), "--json", str(out)])
            fake_cpu = _cpu_seconds(fake.process.pid) - fake_cpu0
        doc = json.loads(out.read_text())
        entries = [json.loads(line) for line in log.read_text().splitlines()]
    arrivals = [e["arrival_monotonic"] for e in entries if "body" in e]
    delivered = [e for e in entries if e.get("delivered")]
    wave = doc["waves"][0]
    # what the fake really sent and when: the bench is judged against this, and the fake's
    # own lateness against its programme is shown apart
    sent_rates = [e["decode_tokens"] / (e["last_chunk_monotonic"] - e["first_chunk_monotonic"])
                  for e in delivered]
    sent_aggregate = sum(e["decode_tokens"] for e in delivered) / (
        max(e["last_chunk_monotonic"] for e in delivered)
        - min(e["first_chunk_monotonic"] for e in delivered))
    per_stream_truth = (max_tokens - 1) / (steps * step_s)
    prefix_of = {e["arrival"]: e["body"]["messages"][0]["content"].split("]")[0] + "]"
                 for e in entries if "body" in e}
    sent_by_prefix = {prefix_of[e["delivered"]]: rate for e, rate in zip(delivered, sent_rates)}
    pairs = [(s["tok_s"], sent_by_prefix[s["prefix"]]) for s in wave["streams"] if s["ok"]]
    return {
        "concurrency": concurrency, "exit_code": code, "measured_streams": len(pairs),
        "per_stream_truth": per_stream_truth,
        "fake_worst_lateness": max(abs(r / per_stream_truth - 1) for r in sent_rates),
        "per_stream_worst_error": max((abs(r / t - 1) for r, t in pairs), default=None),
        "aggregate_sent": sent_aggregate,
        "aggregate": wave["aggregate_tok_s"],
        "aggregate_error": (None if wave["aggregate_tok_s"] is None
                            else wave["aggregate_tok_s"] / sent_aggregate - 1),
        "arrival_spread_s": max(arrivals) - min(arrivals),
        "bench_cpu_s_per_1000_tokens": doc["self_cost"]["cpu_seconds_per_1000_tokens"],
        "fake_cpu_s_per_1000_tokens": fake_cpu / doc["self_cost"]["streamed_tokens"] * 1000,
    }


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(prog="bench_cost.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--concurrency", default="16,32,64")
    parser.add_argument("--rate", type=float, default=200.0, help="tok/s per stream")
    parser.add_argument("--tokens-per-chunk", type=int, default=1)
    parser.add_argument("--decode-seconds", type=float, default=2.0)
    parser.add_argument("--ttft-seconds", type=float, default=1.0,
                        help="fake prefill time; must outlast the bench's send burst")
    opts = parser.parse_args(argv)
    if not FAKE.is_file():
        parser.error(f"{FAKE} is missing: run from a full checkout of the repository")
    try:
        levels = [int(c) for c in opts.concurrency.split(",")]
    except ValueError:
        parser.error(f"--concurrency must be comma-separated integers, got {opts.concurrency!r}")
    print("| c | programmed tok/s/stream | fake's worst lateness | worst per-stream error "
          "| aggregate sent | aggregate measured | aggregate error | send spread s "
          "| bench CPU s/1k tok | fake CPU s/1k tok | within 1% |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for c in levels:
        r = measure(c, opts.rate, opts.tokens_per_chunk, opts.decode_seconds, opts.ttft_seconds)
        ok = (r["exit_code"] == 0 and r["measured_streams"] == c
              and r["per_stream_worst_error"] < 0.01 and abs(r["aggregate_error"]) < 0.01)
        print(f"| {c} | {r['per_stream_truth']:.1f} | {r['fake_worst_lateness'] * 100:.2f}% | "
              f"{r['per_stream_worst_error'] * 100:.2f}% | {r['aggregate_sent']:.0f} | "
              f"{r['aggregate']:.0f} | {r['aggregate_error'] * 100:+.2f}% | "
              f"{r['arrival_spread_s']:.3f} | {r['bench_cpu_s_per_1000_tokens']:.4f} | "
              f"{r['fake_cpu_s_per_1000_tokens']:.4f} | {'yes' if ok else 'NO'} |", flush=True)
        time.sleep(0.5)
    return 0


if __name__ == "__main__":
    sys.exit(main())
