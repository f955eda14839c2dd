#!/usr/bin/env python3
"""The quality gate: a candidate server's next-token distributions against a reference's,
token by token, judged against the noise two boots of the reference show.

    bench/quality.py record --url REF_URL --out ref.json
    bench/quality.py aa     --reference ref.json --url REF_URL_SECOND_BOOT --out band.json
    bench/quality.py gate   --reference ref.json --band band.json --url CANDIDATE_URL \
                            --out gate.json

record: each prompt of the fixed set (prose, code, structured, a long-context needle) is
tokenized by the server's chat template (/tokenize) and decoded greedily (/v1/completions on
the token ids, ignore_eos) with the top-N logprobs of every generated token.
aa and gate: the second server must tokenize every prompt to the same ids; it decodes each
prompt greedily too (its first divergence from the reference, with both top-2 margins, is
reported; under --near-tie-nats on both sides it is a near-tie, where greedy may go either
way), and it scores the reference's own generated tokens (prompt_logprobs, top N), so both
distributions at a position condition on the same tokens. Per position: KL(reference ||
candidate) over the reference's top N plus a tail bucket (bench/divergence.py says how the
tail is handled) and whether the two top-1 tokens agree; totals per phase and overall.
aa writes the band: its own totals. gate passes when, overall and in every phase, the mean
KL is at most the band's times --band-scale and the top-1 disagreement at most the band's
times --band-scale. docs/quality.md documents the JSON contract.

Exit code: 0 recorded / band measured / gate passed, 1 gate failed, 2 could not run (bad
option, server unreachable, tokenization differs, a file that is not what it should be).
The picture: bench/plot.py gate.json.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import secrets
import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the `bench` package importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from recipekit.one_line_parser import OneLineParser

if __name__ == "__main__":  # a missing package: one line naming the install command
    from bench import requires

    requires.require("bench/quality.py", requires.CLIENT_MODULES, __doc__)

import aiohttp

from bench import server_url
from bench.bench_decode import BenchError, api_key_of, server_identity
from bench.divergence import PositionScore, Totals, score_position
from bench.greedy import GreedyOutput, ReceiptError, compare_outputs
from bench.progress import BenchProgress
from bench.stream_client import Tally, error_message
from recipekit import apikey

FORMAT_VERSION = 1
PHASES = ("prose", "code", "structured", "needle")
NEEDLE = "The passcode is 7319."
_FILLER = ("The harbour wall was rebuilt in stone after the storm, and the keepers logged "
           "the weather every evening before lighting the lamp.")
_PROMPTS = {
    "prose": "Write a detailed essay about the history of lighthouses: how they were built, "
             "who kept them, and how their lamps changed over the centuries.",
    "code": "Write a Python function that parses one CSV line with quoted fields and escaped "
            "quotes, with a docstring and three doctest examples.",
    "structured": "List the first 30 chemical elements as JSON objects, one per line, with "
                  "the keys name, symbol and atomic_number.",
}


class QualityError(Exception):
    """A reason the gate could not run, phrased for the user."""


def needle_text(words: int) -> str:
    """About `words` words of filler with the passcode in the middle, then the question."""
    sentences = max(2, words // len(_FILLER.split()))
    body = [_FILLER] * sentences
    body.insert(sentences // 2, NEEDLE)
    return " ".join(body) + "\n\nWhat is the passcode? Answer with the number only."


def prompt_set(needle_words: int) -> list[tuple[str, list[dict]]]:
    texts = dict(_PROMPTS, needle=needle_text(needle_words))
    return [(phase, [{"role": "user", "content": texts[phase]}]) for phase in PHASES]


# ----------------------------------------------------------------------------- the server


async def _post(session: aiohttp.ClientSession, url: str, path: str, body: dict) -> dict:
    try:
        async with session.post(url + path, json=body) as reply:
            status, raw = reply.status, await reply.read()
    except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
        raise QualityError(f"POST {url}{path} failed ({exc!r}): is it up?") from exc
    try:
        answer = json.loads(raw)
    except ValueError as exc:
        raise QualityError(f"{url}{path} answered HTTP {status} with no JSON: "
                           f"{raw[:200].decode('utf-8', 'replace')}") from exc
    if status != 200:
        raise QualityError(f"{url}{path} answered HTTP {status}: {error_message(answer)}")
    return answer


async def server_model(session: aiohttp.ClientSession, url: str, model: str | None,
                       key: apikey.ClientKey | None = None) -> str:
    """The model the server at URL serves, after the bench's preflight (/health, then
    /v1/models; KEY: where the session's API key came from, for a 401's line)."""
    try:
        served, _, _ = await server_identity(session, url, model, key=key)
    except BenchError as exc:
        raise QualityError(str(exc)) from exc
    return served


async def server_version(session: aiohttp.ClientSession, url: str) -> str | None:
    try:
        async with session.get(url + "/version") as reply:
            return (await reply.json()).get("version")
    except (aiohttp.ClientError, asyncio.TimeoutError, ValueError, AttributeError):
        return None


def _token_id(key: str | int) -> int:
    return int(str(key).removeprefix("token_id:"))


async def tokenize(session, url: str, model: str, messages: list[dict]) -> list[int]:
    answer = await _post(session, url, "/tokenize", {
        "model": model, "messages": messages, "add_generation_prompt": True})
    try:
        return [int(t) for t in answer["tokens"]]
    except (KeyError, TypeError, ValueError) as exc:
        raise QualityError(f"{url}/tokenize returned no token ids") from exc


async def generate(session, url: str, model: str, prompt: list[int], max_tokens: int,
                   top_n: int) -> tuple[list[int], list[dict[int, float]]]:
    """Greedy ids and each position's top-N {id: logprob}."""
    answer = await _post(session, url, "/v1/completions", {
        "model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0,
        "logprobs": top_n, "return_tokens_as_token_ids": True, "ignore_eos": True,
        "cache_salt": "quality-" + secrets.token_hex(8)})
    try:
        logprobs = answer["choices"][0]["logprobs"]
        tokens = [_token_id(t) for t in logprobs["tokens"]]
        tops = [{_token_id(k): float(v) for k, v in top.items()}
                for top in logprobs["top_logprobs"]]
    except (KeyError, IndexError, TypeError, ValueError) as exc:
        raise QualityError(f"{url}/v1/completions returned no logprobs: the server must "
                           f"support logprobs and return_tokens_as_token_ids") from exc
    if len(tokens) != len(tops) or not tokens:
        raise QualityError(f"{url} returned {len(tokens)} tokens with {len(tops)} top lists")
    return tokens, tops


async def score(session, url: str, model: str, prompt: list[int], tokens: list[int],
                top_n: int) -> list[dict[int, float]]:
    """The server's top-N {id: logprob} at each of `tokens`, given the prompt and the tokens
    before it (prompt_logprobs; vLLM adds the actual token where it is not in the top N)."""
    answer = await _post(session, url, "/v1/completions", {
        "model": model, "prompt": prompt + tokens, "max_tokens": 1, "temperature": 0.0,
        "prompt_logprobs": top_n, "cache_salt": "quality-" + secrets.token_hex(8)})
    try:
        rows = answer["choices"][0]["prompt_logprobs"][len(prompt):]
        out = [{_token_id(k): float(v["logprob"]) for k, v in row.items()} for row in rows]
    except (KeyError, IndexError, TypeError, ValueError, AttributeError) as exc:
        raise QualityError(f"{url}/v1/completions returned no prompt_logprobs: the server "
                           f"must allow prompt_logprobs of {top_n}") from exc
    if len(out) != len(tokens):
        raise QualityError(f"{url} scored {len(out)} of {len(tokens)} tokens")
    return out


def _margin(top: dict[int, float]) -> float | None:
    ranked = sorted(top.values(), reverse=True)
    return ranked[0] - ranked[1] if len(ranked) >= 2 else None


def _greedy(tokens: list[int], tops: list[dict[int, float]]) -> GreedyOutput:
    return GreedyOutput(tokens=[f"token_id:{t}" for t in tokens],
                        margins=[_margin(top) for top in tops], text="", finish_reason=None,
                        cached_tokens=None)


def _nth_largest(values, n: int) -> float:
    ranked = sorted(values, reverse=True)
    return ranked[min(n, len(ranked)) - 1]


# ----------------------------------------------------------------------------- files


def _pairs(top: dict[int, float]) -> list[list]:
    return [[t, lp] for t, lp in sorted(top.items(), key=lambda kv: -kv[1])]


def _unpairs(pairs: list[list]) -> dict[int, float]:
    return {int(t): float(lp) for t, lp in pairs}


def fingerprint(record: dict) -> str:
    """What a band and a gate must share: the reference's prompts, tokens and settings."""
    text = json.dumps([record["settings"], record["prompts"]], sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def load_json(path: str, kind: str) -> dict:
    try:
        doc = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise QualityError(f"{path}: cannot read it as JSON ({exc})") from exc
    if not isinstance(doc, dict) or doc.get("kind") != kind:
        raise QualityError(f"{path}: not a {kind} file (kind {doc.get('kind')!r}); make it "
                           f"with bench/quality.py {kind.removeprefix('quality-')}")
    if doc.get("format_version") != FORMAT_VERSION:
        raise QualityError(f"{path}: format_version {doc.get('format_version')!r}, this "
                           f"tool reads {FORMAT_VERSION}")
    return doc


def write_json(path: str, doc: dict) -> None:
    out = Path(path)
    partial = out.with_name(out.name + ".partial")
    partial.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    partial.replace(out)


# ----------------------------------------------------------------------------- subcommands


async def record(session, opts, progress: BenchProgress) -> dict:
    model = await server_model(session, opts.url, opts.model, opts.key)
    prompts = []
    for phase, messages in prompt_set(opts.needle_words):
        tally = Tally()
        async with progress.wave(f"record {phase}", opts.max_tokens, tally):
            ids = await tokenize(session, opts.url, model, messages)
            tokens, tops = await generate(session, opts.url, model, ids, opts.max_tokens,
                                          opts.top_n)
            tally.tokens = len(tokens)
        prompts.append({"phase": phase, "prompt_tokens": ids, "tokens": tokens,
                        "top": [_pairs(top) for top in tops]})
        progress.note(f"[{len(prompts)}/{len(PHASES)}] recorded {phase}: {len(ids)} prompt "
                      f"tokens, {len(tokens)} generated")
    return {"kind": "quality-record", "format_version": FORMAT_VERSION,
            "server": {"url": opts.url, "model": model,
                       "version": await server_version(session, opts.url)},
            "settings": {"top_n": opts.top_n, "max_tokens": opts.max_tokens,
                         "needle_words": opts.needle_words}, "prompts": prompts}


async def compare(session, reference: dict, opts, progress: BenchProgress) -> dict:
    """The candidate (opts.url) against the reference record: totals and per-prompt detail."""
    model = await server_model(session, opts.url, opts.model, opts.key)
    top_n = reference["settings"]["top_n"]
    overall, phases, details = Totals(), {}, []
    for index, entry in enumerate(reference["prompts"], 1):
        phase, prompt, ref_tokens = entry["phase"], entry["prompt_tokens"], entry["tokens"]
        messages = dict(prompt_set(reference["settings"]["needle_words"]))[phase]
        tally = Tally()
        async with progress.wave(f"candidate {phase}", 2 * len(ref_tokens), tally):
            ids = await tokenize(session, opts.url, model, messages)
            if ids != prompt:
                raise QualityError(f"{opts.url} tokenizes the {phase} prompt to other ids than "
                                   f"the reference ({len(ids)} vs {len(prompt)} tokens): the "
                                   f"gate needs the same tokenizer and chat template")
            tokens, tops = await generate(session, opts.url, model, prompt, len(ref_tokens),
                                          top_n)
            tally.tokens = len(tokens)
            scored = await score(session, opts.url, model, prompt, ref_tokens, top_n)
            tally.tokens += len(scored)
        ref_tops = [_unpairs(p) for p in entry["top"]]
        totals, kls, disagree = Totals(), [], []
        for position, (ref_top, cand_top) in enumerate(zip(ref_tops, scored)):
            s: PositionScore = score_position(ref_top, cand_top,
                                              _nth_largest(cand_top.values(), top_n))
            totals.add(s)
            overall.add(s)
            phases.setdefault(phase, Totals()).add(s)
            kls.append(s.kl)
            if not s.top1_agrees:
                disagree.append(position)
        first = compare_outputs(_greedy(ref_tokens, ref_tops), _greedy(tokens, tops),
                                opts.near_tie_nats)
        details.append({"phase": phase, "totals": totals.to_json(),
                        "kl": [float(f"{k:.4g}") for k in kls],
                        "top1_disagree_at": disagree,
                        "first_divergence": dict(first.to_json(),
                                                 text=first.describe(opts.near_tie_nats))})
        t = totals.to_json()
        progress.note(f"[{index}/{len(reference['prompts'])}] {phase}: mean KL "
                      f"{t['kl_mean']:.3g}, top-1 {t['top1_agreement']:.4f}; "
                      f"{first.describe(opts.near_tie_nats)}")
    return {"format_version": FORMAT_VERSION,
            "reference": dict(reference["server"], record=opts.reference,
                              fingerprint=fingerprint(reference)),
            "candidate": {"url": opts.url, "model": model,
                          "version": await server_version(session, opts.url)},
            "settings": dict(reference["settings"], near_tie_nats=opts.near_tie_nats),
            "overall": overall.to_json(),
            "phases": {p: t.to_json() for p, t in phases.items()}, "prompts": details}


def judge(result: dict, band: dict, scale: float) -> list[dict]:
    """One check per scope (overall, each phase) and metric, against the band."""
    checks = []
    scopes = [("overall", result["overall"], band["overall"])]
    scopes += [(p, t, band["phases"].get(p)) for p, t in result["phases"].items()]
    for scope, got, limit in scopes:
        if limit is None:
            raise QualityError(f"the band has no phase {scope!r}: measure it again with aa")
        kl_limit = limit["kl_mean"] * scale
        top1_limit = 1.0 - (1.0 - limit["top1_agreement"]) * scale
        checks.append({"scope": scope, "metric": "kl_mean", "value": got["kl_mean"],
                       "limit": kl_limit, "passed": got["kl_mean"] <= kl_limit})
        checks.append({"scope": scope, "metric": "top1_agreement",
                       "value": got["top1_agreement"], "limit": top1_limit,
                       "passed": got["top1_agreement"] >= top1_limit})
    return checks


# ----------------------------------------------------------------------------- the command


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="quality.py", description=__doc__.split("\n\n")[0],
                           allow_abbrev=False)
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("record", "aa", "gate"):
        p = sub.add_parser(name, allow_abbrev=False)
        server_url.add_argument(p, "the server to record or to compare", required=True)
        p.add_argument("--model", help="model id (default: the one /v1/models lists)")
        apikey.add_client_argument(p)
        p.add_argument("--out", required=True, help="the JSON file to write")
        p.add_argument("--timeout", type=float, default=900.0, help="seconds per request")
        p.add_argument("--quiet", action="store_true", help="no progress on stderr")
        if name == "record":
            p.add_argument("--top-n", type=int, default=20,
                           help="logprobs per position (vLLM's --max-logprobs allows 20)")
            p.add_argument("--max-tokens", type=int, default=128)
            p.add_argument("--needle-words", type=int, default=6000,
                           help="length of the long-context prompt in words")
        else:
            p.add_argument("--reference", required=True, help="a quality.py record file")
            p.add_argument("--near-tie-nats", type=float, default=0.25,
                           help="top-2 margin under which a divergence is a near-tie")
        if name == "gate":
            p.add_argument("--band", required=True, help="a quality.py aa file")
            p.add_argument("--band-scale", type=float, default=1.0,
                           help="the gate's limit is the band's KL and top-1 disagreement "
                                "times this (default 1: within the A/A band)")
    return parser


def _check_options(parser, opts) -> None:
    if opts.command == "record" and (opts.top_n < 2 or opts.max_tokens < 1
                                     or opts.needle_words < 20):
        parser.error("need --top-n >= 2, --max-tokens >= 1 and --needle-words >= 20")
    if opts.command != "record" and opts.near_tie_nats < 0:
        parser.error("need --near-tie-nats >= 0")
    if opts.command == "gate" and opts.band_scale <= 0:
        parser.error("need --band-scale > 0")
    if opts.timeout <= 0:
        parser.error("need --timeout > 0")


async def _run(opts, progress: BenchProgress) -> dict:
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=10.0, sock_read=opts.timeout)
    try:
        opts.key = api_key_of(opts.api_key_file)
    except BenchError as exc:
        raise QualityError(str(exc)) from exc
    async with aiohttp.ClientSession(timeout=timeout, headers=opts.key.headers()) as session:
        if opts.command == "record":
            return await record(session, opts, progress)
        reference = load_json(opts.reference, "quality-record")
        band = load_json(opts.band, "quality-aa") if opts.command == "gate" else None
        if band is not None and band["reference"]["fingerprint"] != fingerprint(reference):
            raise QualityError(f"{opts.band} was measured against another reference record "
                               f"than {opts.reference}: run aa with this record")
        result = await compare(session, reference, opts, progress)
        result["kind"] = f"quality-{opts.command}"
        if band is not None:
            result["band"] = {"file": opts.band, "scale": opts.band_scale,
                              "overall": band["overall"], "phases": band["phases"]}
            result["checks"] = judge(result, band, opts.band_scale)
            result["passed"] = all(c["passed"] for c in result["checks"])
        return result


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    opts = parser.parse_args(argv)
    _check_options(parser, opts)
    steps = len(PHASES)
    started = time.monotonic()
    try:
        with BenchProgress(BenchProgress.pick_mode(opts.quiet), steps) as progress:
            doc = asyncio.run(_run(opts, progress))
    except (QualityError, ReceiptError) as exc:
        print(f"quality {opts.command}: cannot run: {exc}", file=sys.stderr)
        return 2
    doc["wall_s"] = round(time.monotonic() - started, 3)
    try:
        write_json(opts.out, doc)
    except OSError as exc:
        print(f"quality {opts.command}: cannot write {opts.out}: {exc.strerror}",
              file=sys.stderr)
        return 2
    if opts.command == "record":
        print(f"quality record: wrote {opts.out} ({len(doc['prompts'])} prompts)")
        return 0
    o = doc["overall"]
    figures = f"mean KL {o['kl_mean']:.4g}, top-1 {o['top1_agreement']:.4f} over " \
              f"{o['positions']} positions"
    if opts.command == "aa":
        print(f"quality aa: band {figures}; wrote {opts.out}")
        return 0
    for c in doc["checks"]:
        if not c["passed"]:
            print(f"FAIL {c['scope']} {c['metric']} {c['value']:.4g} beyond the band's "
                  f"limit {c['limit']:.4g}")
    print(f"quality gate: {'PASS' if doc['passed'] else 'FAIL'} ({figures}); wrote {opts.out}")
    return 0 if doc["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
