#!/usr/bin/env python3
"""Measure streamed decode speed and draft acceptance of an OpenAI-compatible server.

    bench/bench_decode.py [--url http://127.0.0.1:8000] [--phase all] [--concurrency 1,2,4]
                          [--runs 3] [--max-tokens 200] [--json results.json]
                          [--turn-tokens 8192,32768,65536] [--max-num-seqs N]
    bench/bench_decode.py --compare A.json B.json

For each phase (prose, structured, code) and concurrency c it runs `--runs` waves of c
streams at once, every stream greedy, thinking off, with its own unique prompt prefix. It
reads the spec-decode counters of /metrics around each concurrency block. The concurrencies
stop at the server's max_num_seqs (bench/max_num_seqs.py says how it is learned): by default
1,2,4 up to it; one given beyond it is refused; a wave the server held requests waiting
through invalidates its cell. The turns phase (`--phase turns`, or `all,turns`; not in `all`)
times one conversation growing to the `--turn-tokens` prompt sizes, turn by turn
(bench/turns.py). Exit code: 0 when every stream was measured and no block was invalidated,
1 otherwise (a summary says what), 2 when it could not start (bad option, server unreachable,
model ambiguous, a concurrency beyond max_num_seqs, a failed warm-up). The JSON contract is
documented in docs/bench.md.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import secrets
import sys
import time
from collections import Counter
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the `bench` package importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from recipekit.one_line_parser import OneLineParser

if __name__ == "__main__":  # a missing package: one line naming the install command
    from bench import requires

    requires.require("bench/bench_decode.py", requires.CLIENT_MODULES, __doc__)

import aiohttp

from bench import max_num_seqs, platform_state, prompts, report, server_url, turns
from bench.progress import BenchProgress
from bench.server_metrics import (
    MetricsSnapshot,
    acceptance,
    fetch_metrics,
    restart_between,
    spec_delta,
)
from bench.stream_client import Tally, chat_request, run_stream
from bench.summary import build_cell, wave_figures
from recipekit import apikey

WARMUP_TOKENS = 16
# the default concurrencies, those up to the server's max_num_seqs
DEFAULT_CONCURRENCY = (1, 2, 4)
# how often a wave looks for its first token, then reads /metrics once (seconds)
WATCH_S = 0.005


class BenchError(Exception):
    """A reason the bench cannot start, phrased for the user."""


def _concurrency_list(text: str) -> list[int]:
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        values = []
    if not values or any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(
            f"--concurrency must be comma-separated positive integers like 1,2,4, got {text!r}")
    return list(dict.fromkeys(values))


def _phase_list(text: str) -> list[str]:
    names = [name for part in text.split(",")
             for name in (prompts.PHASES if part.strip() == "all" else [part.strip()])]
    known = (*prompts.PHASES, turns.PHASE)
    if not names or any(name not in known for name in names):
        raise argparse.ArgumentTypeError(
            f"--phase must be all or a comma list of {', '.join(known)} (all: the first "
            f"{len(prompts.PHASES)}), got {text!r}")
    return list(dict.fromkeys(names))


def _positive(minimum: int):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = minimum - 1
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be an integer >= {minimum}, got {text!r}")
        return value
    return parse


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="bench_decode.py", description=__doc__.split("\n\n")[0],
                      allow_abbrev=False)
    server_url.add_argument(p)
    p.add_argument("--model", help="model id (default: the one /v1/models lists)")
    apikey.add_client_argument(p)
    p.add_argument("--phase", dest="phases", type=_phase_list, default="all",
                   help=f"all (default) or a comma list of {', '.join(prompts.PHASES)}")
    p.add_argument("--concurrency", type=_concurrency_list,
                   help="comma-separated stream counts per wave (default "
                        f"{','.join(map(str, DEFAULT_CONCURRENCY))}, those up to the server's "
                        "max_num_seqs); one beyond max_num_seqs is refused")
    p.add_argument("--max-num-seqs", type=_positive(1),
                   help="the server's max_num_seqs (vLLM's --max-num-seqs), when the bench "
                        "cannot learn it (docs/bench.md)")
    p.add_argument("--runs", type=_positive(1), default=3, help="waves per cell (default 3)")
    p.add_argument("--max-tokens", type=_positive(2), default=200)
    p.add_argument("--turn-tokens", type=turns.turn_tokens, default=list(turns.DEFAULT_TURN_TOKENS),
                   help="the turns phase's prompt size at each turn, growing (default "
                        f"{','.join(map(str, turns.DEFAULT_TURN_TOKENS))})")
    p.add_argument("--warmup", type=_positive(0), default=1,
                   help=f"unmeasured {WARMUP_TOKENS}-token requests sent first (default 1)")
    p.add_argument("--timeout", type=float, default=600.0,
                   help="seconds a stream may wait for its next bytes (default 600)")
    p.add_argument("--no-ignore-eos", dest="ignore_eos", action="store_false",
                   help="let the model stop early (default: ignore_eos, exactly max-tokens)")
    p.add_argument("--platform", choices=platform_state.MODES, default="auto",
                   help="auto (default): record the platform probe of every rank at the start "
                        "and the end (scripts/doctor --platform --json; where the launcher "
                        "cannot reach the ranks, why not); off: record that it was not asked")
    p.add_argument("--json", dest="json_path", metavar="FILE", help="write the result file")
    p.add_argument("--quiet", action="store_true", help="no progress display")
    p.add_argument("--compare", nargs=2, metavar=("A.json", "B.json"),
                   help="print the per-cell change from A to B and exit")
    return p


def _now_iso() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


async def _get_json(session: aiohttp.ClientSession, url: str):
    """(HTTP status, parsed JSON or None)."""
    async with session.get(url) as reply:
        status = reply.status
        try:
            return status, await reply.json(content_type=None)
        except ValueError:
            return status, None


def api_key_of(api_key_file: str | None) -> apikey.ClientKey:
    """The key a tool sends (recipekit/apikey.py: --api-key-file, else OPENAI_API_KEY, else
    the default key file when it exists, else none); BenchError naming a file that cannot
    be used."""
    try:
        return apikey.client_key(api_key_file)
    except apikey.KeyFileError as exc:
        raise BenchError(f"API key: {exc}") from None


async def server_identity(session: aiohttp.ClientSession, url: str, model: str | None,
                          url_flag: str = "--url", key: apikey.ClientKey | None = None):
    """(model id, the /v1/models answer, vLLM version or None); BenchError when the server
    cannot be reached, its engine is not healthy (/health: vLLM's /v1/models answers for
    seconds after the engine died), wants an API key SESSION does not send (401: where KEY
    came from), is not OpenAI-compatible, or serves several models and none was given."""
    try:
        async with session.get(url + "/health") as reply:
            health = reply.status
    except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
        raise BenchError(f"cannot reach {url}/health ({exc!r}): is the server up? "
                         f"pass {url_flag}") from exc
    if health >= 500:  # a server without /health (404) is judged by /v1/models below
        raise BenchError(f"{url}/health answered HTTP {health}: the engine is not healthy; "
                         "scripts/doctor says more")
    try:
        status, models = await _get_json(session, url + "/v1/models")
    except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
        raise BenchError(f"cannot reach {url}/v1/models ({exc!r}): is the server up? "
                         f"pass {url_flag}") from exc
    if status == 401:
        raise BenchError((key or apikey.ClientKey(None, "no key given")).unauthorized(
            url + "/v1/models"))
    if status != 200:
        raise BenchError(f"{url}/v1/models answered HTTP {status}: is {url} an "
                         f"OpenAI-compatible server?")
    try:
        ids = [m["id"] for m in models["data"]]
    except (KeyError, TypeError) as exc:
        raise BenchError(f"{url}/v1/models did not return an OpenAI model list") from exc
    if model is None:
        if len(ids) != 1:
            raise BenchError(f"{url} serves {len(ids)} models ({', '.join(ids) or 'none'}): "
                             f"pass --model")
        model = ids[0]
    version = None
    try:
        status, answer = await _get_json(session, url + "/version")
        if status == 200 and isinstance(answer, dict):
            version = answer.get("version")
    except (aiohttp.ClientError, asyncio.TimeoutError):
        version = None  # /version is a vLLM extra; other servers lack it
    return model, models, version


def _spec_status(before: MetricsSnapshot, after: MetricsSnapshot, delta) -> tuple[str, str | None]:
    """(status, reason the block is invalid or None)."""
    for snap in (before, after):
        if snap.error:
            return "unavailable", snap.error
    if delta is None:
        return "absent", None
    return ("no_drafts" if delta.drafts <= 0 else "measured"), None


def _write_json(path: str, doc: dict) -> None:
    target = Path(path)
    temporary = target.with_name(target.name + ".partial")
    # compact: the indenting encoder is pure Python and would cost the bench real CPU
    temporary.write_text(json.dumps(doc, separators=(",", ":")) + "\n", encoding="utf-8")
    os.replace(temporary, target)


def concurrency_for(asked: list[int] | None, seqs: max_num_seqs.Learned) -> list[int]:
    """The concurrencies to run: ASKED, else the defaults up to max_num_seqs; BenchError for
    one asked beyond a known max_num_seqs (its cell would time the server's queue)."""
    if asked is None:
        return [c for c in DEFAULT_CONCURRENCY if seqs.value is None or c <= seqs.value]
    beyond = [c for c in asked if seqs.value is not None and c > seqs.value]
    if beyond:
        raise BenchError(
            f"--concurrency {','.join(map(str, asked))}: {','.join(map(str, beyond))} is beyond "
            f"the server's max_num_seqs {seqs.value} (from {seqs.source}), so those streams "
            f"would wait in its queue; ask at most {seqs.value}, or pass --max-num-seqs if the "
            "server runs more")
    return asked


async def run_bench(opts: argparse.Namespace, progress: BenchProgress) -> dict:
    """Run every cell; return the result document (the JSON contract)."""
    phases = [phase for phase in opts.phases if phase != turns.PHASE]  # the decode phases
    url = opts.url
    widest = max(opts.concurrency or DEFAULT_CONCURRENCY)
    connector = aiohttp.TCPConnector(limit=widest + 4)
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=10.0, sock_read=opts.timeout)
    cpu0 = time.process_time()
    key = api_key_of(opts.api_key_file)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout,
                                     headers=key.headers()) as client:
        model, models, version = await server_identity(client, url, opts.model, key=key)
        seqs = await max_num_seqs.learn(client, url, opts.max_num_seqs, models)
        # the turns phase alone runs no cell, so no concurrency of it can be beyond
        concurrency = concurrency_for(opts.concurrency, seqs) if phases else []
        progress.set_total(len(phases) * len(concurrency) * opts.runs)
        bench_id = secrets.token_hex(4)
        request_template = chat_request(model, [], opts.max_tokens, opts.ignore_eos)
        del request_template["messages"]
        doc = {
            "schema": report.SCHEMA,
            "settings": {"url": url, "model": model, "phases": opts.phases,
                         "concurrency": concurrency, "runs": opts.runs,
                         "max_tokens": opts.max_tokens, "warmup": opts.warmup,
                         "timeout_s": opts.timeout, "ignore_eos": opts.ignore_eos,
                         "bench_id": bench_id, "request": request_template,
                         "prompts": {ph: prompts.phase_messages(ph, "<prefix>")[0]["content"]
                                     for ph in phases}},
            "server": {"models": models, "vllm_version": version,
                       "max_num_seqs": seqs.to_json()},
            "started_at": _now_iso(), "finished_at": None,
            "waves": [], "cells": [], "notes": [],
            "platform": {"start": await asyncio.to_thread(platform_state.measure, opts.platform)},
        }
        if seqs.value is None and phases:
            doc["notes"].append(f"max_num_seqs {seqs.source}")
            progress.note(doc["notes"][-1])
        for n in range(opts.warmup):
            body = chat_request(model, prompts.phase_messages(
                (phases or prompts.PHASES)[0], prompts.unique_prefix(bench_id, "warmup", 1, n, 0)),
                WARMUP_TOKENS, opts.ignore_eos)
            record = await run_stream(client, url, body, 0, "warmup", time.perf_counter(), Tally())
            if not record.ok:  # a server that fails this would hold every cell to its timeout
                raise BenchError(f"the {WARMUP_TOKENS}-token warm-up request {n + 1} failed "
                                 f"({record.failure}: {record.detail}), so no cell was run; "
                                 "scripts/doctor says more")
        streamed = 0
        for phase in phases:
            for c in concurrency:
                streamed += await _run_cell(client, url, model, phase, c, opts, bench_id, doc,
                                            progress)
                if opts.json_path:
                    _write_json(opts.json_path, doc)
        if turns.PHASE in opts.phases:
            try:
                doc["turns"] = await turns.run_turns(client, url, model, opts, bench_id, progress)
            except turns.TurnsError as exc:
                raise BenchError(str(exc)) from exc
    cpu = time.process_time() - cpu0
    doc["platform"]["end"] = await asyncio.to_thread(platform_state.measure, opts.platform)
    doc["finished_at"] = _now_iso()
    doc["self_cost"] = {"cpu_seconds": cpu, "streamed_tokens": streamed,
                        "cpu_seconds_per_1000_tokens": (cpu / streamed * 1000 if streamed
                                                        else None)}
    return doc


async def _run_cell(client, url, model, phase, c, opts, bench_id, doc, progress) -> int:
    """Run the waves of one (phase, concurrency) cell; append waves and cell to doc."""
    snapshots = [await fetch_metrics(client, url)]
    waves, records, restarts, queued = [], [], [], []
    streamed = 0
    for run in range(1, opts.runs + 1):
        tally = Tally()
        label = f"{phase} c={c} run {run}/{opts.runs}"
        prefixes = [prompts.unique_prefix(bench_id, phase, c, run, s) for s in range(c)]
        bodies = [chat_request(model, prompts.phase_messages(phase, p), opts.max_tokens,
                               opts.ignore_eos) for p in prefixes]
        started = time.time()
        async with progress.wave(label, c * opts.max_tokens, tally):
            wave_t0 = time.perf_counter()
            watch = asyncio.create_task(waiting_in_wave(client, url, tally, c))
            wave_records = await asyncio.gather(*(
                run_stream(client, url, body, s, prefixes[s], wave_t0, tally)
                for s, body in enumerate(bodies)))
            waiting = await watch
        streamed += tally.tokens
        if waiting:
            queued.append(f"run {run}: /metrics showed {waiting:g} request(s) waiting after the "
                          f"wave's first token, so the server ran fewer than {c} streams at once "
                          "(its max_num_seqs is below that, or another client was using it)")
        after = await fetch_metrics(client, url)
        restart = restart_between(snapshots[-1], after)
        if restart:
            restarts.append(f"between run {run - 1} and the end of run {run}: {restart}"
                            if run > 1 else f"during run 1: {restart}")
        wave_accept = acceptance(None if restart else spec_delta(snapshots[-1], after))
        snapshots.append(after)
        figures = wave_figures(wave_records)
        wave = {"phase": phase, "concurrency": c, "run": run, "started_at": started,
                "t0_monotonic_s": wave_t0,
                **figures, "acceptance_length": (wave_accept["acceptance_length"]
                                                 if figures["per_stream_tok_s"] is not None
                                                 else None),
                "waiting": waiting,
                "failed_streams": sum(not r.ok for r in wave_records), "restart": restart,
                "metrics_after": after.to_json(),
                "streams": [r.to_json() for r in wave_records]}
        waves.append(wave)
        records.append(wave_records)
        doc["waves"].append(wave)
        progress.wave_done(label, figures, c, wave["failed_streams"])
    before, after = snapshots[0], snapshots[-1]
    delta = spec_delta(before, after)
    status, invalid = _spec_status(before, after, delta)
    if restarts or queued:
        status, invalid = "invalid", "; ".join(restarts + queued)
    cell = build_cell(phase, c, waves, records, delta, status, invalid, len(restarts))
    cell["metrics_before"] = before.to_json()
    doc["cells"].append(cell)
    return streamed


async def waiting_in_wave(client, url: str, tally: Tally, streams: int) -> float | None:
    """vllm:num_requests_waiting once the wave's first token has come (every request of the
    wave was sent by then): a request the server still holds is one it did not run. None
    when /metrics has no such gauge."""
    while tally.tokens == 0 and tally.finished < streams:
        await asyncio.sleep(WATCH_S)
    return (await fetch_metrics(client, url)).waiting


def failure_summary(doc: dict) -> list[str]:
    """One line per failure kind and per invalid cell; empty when all is well."""
    lines = []
    kinds = Counter(f["kind"] for cell in doc["cells"] for f in cell["failures"])
    total = sum(cell["streams"] for cell in doc["cells"])
    if kinds:
        lines.append(f"{sum(kinds.values())} of {total} streams failed: " +
                     ", ".join(f"{kind} x{n}" for kind, n in sorted(kinds.items())))
        for cell in doc["cells"]:
            for f in cell["failures"]:
                lines.append(f"  {cell['phase']} c={cell['concurrency']} run {f['run']} stream "
                             f"{f['stream']}: {f['kind']}: {f['detail']}")
    for cell in doc["cells"]:
        if cell["invalid"]:
            lines.append(f"{cell['phase']} c={cell['concurrency']} invalid: "
                         f"{cell['invalid_reason']}")
    return lines + turns.failures(doc.get("turns"))


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    opts = parser.parse_args(argv)
    if opts.compare:
        try:
            a, b = (report.load_result(path) for path in opts.compare)
        except ValueError as exc:
            print(f"bench_decode: {exc}", file=sys.stderr)
            return 2
        print(report.compare(a, b))
        by_turn = turns.compare(a.get("turns"), b.get("turns"))
        if by_turn:
            print("\n" + by_turn)
        return 0
    if opts.timeout <= 0:
        parser.error(f"--timeout must be > 0 seconds, got {opts.timeout}")
    decode_phases = [phase for phase in opts.phases if phase != turns.PHASE]
    progress = BenchProgress(BenchProgress.pick_mode(opts.quiet), len(decode_phases) * len(
        opts.concurrency or DEFAULT_CONCURRENCY) * opts.runs)
    try:
        with progress:
            doc = asyncio.run(run_bench(opts, progress))
    except BenchError as exc:
        print(f"bench_decode: {exc}", file=sys.stderr)
        return 2
    if opts.json_path:
        _write_json(opts.json_path, doc)
    if doc["cells"]:
        print(report.markdown_table(doc["cells"]))
    if "turns" in doc:
        print(("\n" if doc["cells"] else "") + turns.markdown_table(doc["turns"]))
    print("\n" + "\n".join(platform_state.lines(doc["platform"])))
    problems = failure_summary(doc)
    if problems:
        print("\nbench_decode: FAILED\n" + "\n".join(problems), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
