#!/usr/bin/env python3
"""Receipts that drafting and batching change nothing: greedy token ids compared position by
position, each receipt one command whose exit code is the verdict.

    bench/receipts.py lossless --drafted URL --undrafted URL
    bench/receipts.py solo-vs-concurrent --url URL
    bench/receipts.py resumed-vs-fresh --url URL

lossless: the drafted server's greedy ids equal the undrafted one's (serve it with SPEC=off).
solo-vs-concurrent: each prompt sent alone equals the same prompt sent with all the others
at once. resumed-vs-fresh: a second turn whose first turn is in the prefix cache equals the
same full conversation sent cold (a unique cache_salt). At the first differing position the
top-2 logprob margin is reported; when both sides put it under --near-tie-nats the
difference is a near-tie (greedy may go either way there), not a failure.

Exit code: 0 every prompt identical or a near-tie, 1 a difference (or the drafted server did
not draft), 2 the receipt could not be taken.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import secrets
import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the `bench` package importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from recipekit.one_line_parser import OneLineParser

if __name__ == "__main__":  # a missing package: one line naming the install command
    from bench import requires

    requires.require("bench/receipts.py", requires.CLIENT_MODULES, __doc__)

import aiohttp

from bench import server_url
from bench.bench_decode import BenchError, api_key_of, server_identity
from bench.greedy import (
    VERDICT_IDENTICAL,
    VERDICT_NEAR_TIE,
    Comparison,
    ReceiptError,
    compare_outputs,
    record_greedy,
)
from bench.server_metrics import fetch_metrics, spec_delta
from recipekit import apikey

DEFAULT_PROMPTS = (
    "Write a short paragraph about why lighthouses were painted in bold stripes.",
    "Count from 1 to 60, one number per line, with nothing else.",
    "Write a Python function that returns the n-th Fibonacci number, with a docstring.",
    "List the planets of the solar system with one fact about each.",
)
FOLLOW_UP = "Now continue: say more about the same subject, in the same style."


def _salt() -> str:
    return "receipt-" + secrets.token_hex(8)


def load_prompts(path: str | None) -> list[str]:
    """One prompt per line; blank lines and lines starting with # are skipped."""
    if path is None:
        return list(DEFAULT_PROMPTS)
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise ReceiptError(f"--prompts {path}: cannot read it ({exc.strerror})") from exc
    found = [line.strip() for line in lines if line.strip() and not line.startswith("#")]
    if not found:
        raise ReceiptError(f"--prompts {path}: no prompts in it (one per line, # comments)")
    return found


async def _model_of(session: aiohttp.ClientSession, url: str, model: str | None,
                    key: apikey.ClientKey | None = None) -> str:
    """The model the server at URL serves, after the bench's preflight (/health, then
    /v1/models: vLLM's model list answers for seconds after its engine died; KEY: where the
    session's API key came from, for a 401's line)."""
    try:
        served, _, _ = await server_identity(session, url, model, key=key)
    except BenchError as exc:
        raise ReceiptError(str(exc)) from exc
    return served


def _user(prompt: str) -> list[dict]:
    return [{"role": "user", "content": prompt}]


async def lossless(client, opts, prompts) -> tuple[list[Comparison], list[str]]:
    drafted, undrafted = opts.drafted, opts.undrafted
    model_d = await _model_of(client, drafted, opts.model, opts.key)
    model_u = await _model_of(client, undrafted, opts.model, opts.key)
    before = [await fetch_metrics(client, drafted), await fetch_metrics(client, undrafted)]
    comparisons = []
    for prompt in prompts:
        a = await record_greedy(client, undrafted, model_u, _user(prompt), opts.max_tokens,
                                _salt())
        b = await record_greedy(client, drafted, model_d, _user(prompt), opts.max_tokens,
                                _salt())
        comparisons.append(compare_outputs(a, b, opts.near_tie_nats))
    problems = []
    if not opts.skip_draft_check:
        after = [await fetch_metrics(client, drafted), await fetch_metrics(client, undrafted)]
        d_delta, u_delta = spec_delta(before[0], after[0]), spec_delta(before[1], after[1])
        if d_delta is None or d_delta.drafts <= 0:
            problems.append(f"the drafted server {drafted} made no drafts (no spec-decode "
                            f"counters grew on /metrics): the comparison proves nothing; "
                            f"pass --skip-draft-check if it exposes no metrics")
        if u_delta is not None and u_delta.drafts > 0:
            problems.append(f"the undrafted server {undrafted} drafted {u_delta.drafts:g} "
                            f"times: serve it with SPEC=off")
    return comparisons, problems


async def solo_vs_concurrent(client, opts, prompts) -> tuple[list[Comparison], list[str]]:
    url = opts.url
    model = await _model_of(client, url, opts.model, opts.key)
    # every request is salted so that neither side is served from the other's prefix cache
    solo = [await record_greedy(client, url, model, _user(p), opts.max_tokens, _salt())
            for p in prompts]
    together = await asyncio.gather(*(record_greedy(client, url, model, _user(p),
                                                    opts.max_tokens, _salt()) for p in prompts))
    return [compare_outputs(a, b, opts.near_tie_nats) for a, b in zip(solo, together)], []


async def resumed_vs_fresh(client, opts, prompts) -> tuple[list[Comparison], list[str]]:
    url = opts.url
    model = await _model_of(client, url, opts.model, opts.key)
    comparisons = []
    for prompt in prompts:
        first = await record_greedy(client, url, model, _user(prompt), opts.max_tokens)
        conversation = _user(prompt) + [{"role": "assistant", "content": first.text},
                                        {"role": "user", "content": FOLLOW_UP}]
        resumed = await record_greedy(client, url, model, conversation, opts.max_tokens)
        fresh = await record_greedy(client, url, model, conversation, opts.max_tokens, _salt())
        comparisons.append(compare_outputs(fresh, resumed, opts.near_tie_nats))
    return comparisons, []


RECEIPTS = {"lossless": lossless, "solo-vs-concurrent": solo_vs_concurrent,
            "resumed-vs-fresh": resumed_vs_fresh}
SIDES = {"lossless": ("undrafted", "drafted"), "solo-vs-concurrent": ("solo", "concurrent"),
         "resumed-vs-fresh": ("fresh", "resumed")}


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="receipts.py", description=__doc__.split("\n\n")[0],
                           allow_abbrev=False)
    sub = parser.add_subparsers(dest="receipt", required=True)
    for name in RECEIPTS:
        p = sub.add_parser(name, allow_abbrev=False)
        if name == "lossless":
            p.add_argument("--drafted", required=True, type=server_url.base_url,
                           help="URL of the server that drafts (a trailing /v1 is fine)")
            p.add_argument("--undrafted", required=True, type=server_url.base_url,
                           help="URL of the server with SPEC=off (a trailing /v1 is fine)")
            p.add_argument("--skip-draft-check", action="store_true",
                           help="do not require the drafted server's counters to grow")
        else:
            server_url.add_argument(p)
        p.add_argument("--model", help="model id (default: the one /v1/models lists)")
        apikey.add_client_argument(p)
        p.add_argument("--max-tokens", type=int, default=128)
        p.add_argument("--near-tie-nats", type=float, default=0.25,
                       help="top-2 margin under which a difference is a near-tie (default 0.25)")
        p.add_argument("--prompts", help="file with one prompt per line (default: built-in)")
        p.add_argument("--json", dest="json_path", metavar="FILE", help="write the verdicts")
        p.add_argument("--timeout", type=float, default=600.0)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    opts = parser.parse_args(argv)
    if opts.max_tokens < 1 or opts.near_tie_nats < 0 or opts.timeout <= 0:
        parser.error("need --max-tokens >= 1, --near-tie-nats >= 0 and --timeout > 0")

    async def take() -> tuple[list[Comparison], list[str]]:
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=10.0, sock_read=opts.timeout)
        try:
            opts.key = api_key_of(opts.api_key_file)
        except BenchError as exc:
            raise ReceiptError(str(exc)) from exc
        async with aiohttp.ClientSession(timeout=timeout, headers=opts.key.headers()) as client:
            return await RECEIPTS[opts.receipt](client, opts, prompts)

    try:
        prompts = load_prompts(opts.prompts)
        comparisons, problems = asyncio.run(take())
    except ReceiptError as exc:
        print(f"receipts {opts.receipt}: cannot take the receipt: {exc}", file=sys.stderr)
        return 2
    side_a, side_b = SIDES[opts.receipt]
    for index, (prompt, c) in enumerate(zip(prompts, comparisons), 1):
        print(f"{'PASS' if c.passed else 'FAIL'} prompt {index} ({side_a} vs {side_b}): "
              f"{c.describe(opts.near_tie_nats)}  [{prompt[:50]}]")
    for problem in problems:
        print(f"FAIL {problem}")
    identical = sum(c.verdict == VERDICT_IDENTICAL for c in comparisons)
    near = sum(c.verdict == VERDICT_NEAR_TIE for c in comparisons)
    passed = all(c.passed for c in comparisons) and not problems
    print(f"{opts.receipt}: {'PASS' if passed else 'FAIL'} ({identical} identical, {near} "
          f"near-tie, {len(comparisons) - identical - near} different, of {len(comparisons)})")
    if opts.json_path:
        settings = {k: v for k, v in vars(opts).items() if k not in ("json_path", "key")}
        Path(opts.json_path).write_text(json.dumps({
            "receipt": opts.receipt, "passed": passed, "settings": settings,
            "sides": [side_a, side_b], "problems": problems,
            "results": [dict(c.to_json(), prompt=p) for p, c in zip(prompts, comparisons)],
        }, indent=1) + "\n", encoding="utf-8")
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
