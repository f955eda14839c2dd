#!/usr/bin/env python3
"""Quality probes: does the model an OpenAI-compatible server serves really work?

    bench/probes.py [--base-url http://127.0.0.1:8000] [--model ID] [--only NAME,...]
                    [--prompt-tokens 8192] [--json [FILE]] [--timeout 600] [--quiet]

Every request is greedy (temperature 0) with thinking off (`chat_template_kwargs:
{"enable_thinking": false}`). The probes, run one after another in this order:

  counting           count from 1 to 200; passes on a consecutive run of at least 80 numbers
  needle             recall a passcode planted at 95% of a --prompt-tokens long prompt (fresh
                     salt and passcode every run); reports prefill tok/s = prompt tokens / TTFT
  tool_call          a weather question with a get_weather tool must come back as a parsed
                     tool_calls entry (name get_weather, JSON arguments naming Paris)
  thinking_off       no <think> tags in the content and nothing in the reasoning fields
  tool_conversation  the tool result sent back in a second turn is used in the answer
  multibyte          eleven Korean, Japanese and emoji answers of 400+ characters (the
                     field's Korean prompt three times, eight others once), sent together: no
                     U+FFFD, lone surrogate, control character or mojibake in the answer or
                     the reasoning, no repeating tail, no invalid UTF-8 in the token bytes; a
                     short, empty, off-language or failed answer, or one without token bytes
                     (the byte check not run), is inconclusive, never a pass
  tool_cycles        streamed multi-turn tool calls with Korean, Japanese and emoji
                     arguments: the call's JSON parses, its arguments round-trip, every text
                     of the cycle is whole (as multibyte judges it), no tool markup, no
                     repeating tail, and the answer quotes the number the tool returned

Exit code: 0 when every probe passed; 1 when one failed or was inconclusive (each line
names the probe and what came back); 2 when the probes could not run (bad option, server unreachable, model
ambiguous, --prompt-tokens beyond the server's max_model_len). docs/probes.md
documents the JSON result (`--json`).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the `bench` package importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from recipekit.one_line_parser import OneLineParser

if __name__ == "__main__":  # a missing package: one line naming the install command
    from bench import requires

    requires.require("bench/probes.py", requires.CLIENT_MODULES, __doc__)

from bench.bench_decode import BenchError
from bench.probing.runner import (DEFAULT_PROMPT_TOKENS, DEFAULT_URL, PROBE_NAMES, PROBES,
                                  run_probes, run_probes_async)
from bench.probing.verdict import result_line, verdict_line
from recipekit import apikey

# the contract other tools import (docs/probes.md, "The result"): run the probes, name them
__all__ = ["PROBE_NAMES", "build_parser", "main", "run_probes", "run_probes_async"]

MIN_PROMPT_TOKENS = 256



def _probe_list(text: str) -> list[str]:
    names = [part.strip() for part in text.split(",") if part.strip()]
    unknown = [name for name in names if name not in PROBES]
    if not names or unknown:
        raise argparse.ArgumentTypeError(f"unknown probe(s) {', '.join(unknown) or repr(text)}: "
                                         f"choose from {', '.join(PROBE_NAMES)}")
    return list(dict.fromkeys(names))


def _prompt_tokens(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < MIN_PROMPT_TOKENS:
        raise argparse.ArgumentTypeError(f"must be an integer >= {MIN_PROMPT_TOKENS}, got {text!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="probes.py", description=__doc__.split("\n\n")[0],
                      allow_abbrev=False)
    p.add_argument("--base-url", "--url", dest="base_url", default=DEFAULT_URL,
                   help=f"server base URL, a trailing /v1 is fine (default {DEFAULT_URL})")
    p.add_argument("--model", help="model id (default: the one /v1/models lists)")
    apikey.add_client_argument(p)
    p.add_argument("--only", type=_probe_list, default=list(PROBE_NAMES),
                   help=f"comma-separated probes to run (default all: {', '.join(PROBE_NAMES)})")
    p.add_argument("--prompt-tokens", type=_prompt_tokens, default=DEFAULT_PROMPT_TOKENS,
                   help=f"the needle prompt's length in tokens (default {DEFAULT_PROMPT_TOKENS})")
    p.add_argument("--json", dest="json_path", nargs="?", const="-", metavar="FILE",
                   help="write the result as JSON: to FILE, or alone on stdout when no FILE "
                        "is given (the PASS/FAIL lines then go to stderr)")
    p.add_argument("--timeout", type=float, default=600.0,
                   help="seconds a request may wait for its next bytes (default 600)")
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    opts = parser.parse_args(argv)
    if not opts.base_url.startswith(("http://", "https://")):
        parser.error(f"--base-url must start with http:// or https://, got {opts.base_url!r}")
    if opts.timeout <= 0:
        parser.error(f"--timeout must be > 0 seconds, got {opts.timeout}")
    to_stdout = opts.json_path == "-"
    lines = sys.stderr if to_stdout else sys.stdout

    def progress(text: str) -> None:
        if not opts.quiet:
            print(text, file=sys.stderr, flush=True)

    try:
        doc = run_probes(opts.base_url, model=opts.model, only=opts.only,
                         prompt_tokens=opts.prompt_tokens, timeout=opts.timeout, note=progress,
                         api_key_file=opts.api_key_file)
    except BenchError as exc:
        print(f"probes: {exc}", file=sys.stderr)
        return 2
    for name, result in doc["probes"].items():
        print(result_line(name, result), file=lines)
    print(verdict_line(doc), file=lines)
    text = json.dumps(doc, indent=1) + "\n"
    if to_stdout:
        sys.stdout.write(text)
    elif opts.json_path:
        Path(opts.json_path).write_text(text, encoding="utf-8")
    return 0 if doc["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
