"""The bench's turns phase: one conversation growing over N turns, as a coding agent or a chat
over a large file sends it, each turn resending the whole history.

Turn k's prompt is sized to about ``--turn-tokens``[k] tokens: the history so far (every earlier
prompt and answer) and a new user message of numbered log lines. The server's own count of a
line is measured first (two short requests of 16 and 80 lines, whose prompt_tokens differ by
64 lines), so the sizes hold whatever the tokenizer. Per turn it records the time to first
token, the prompt tokens, the cached tokens the usage block reports
(``usage.prompt_tokens_details.cached_tokens``; vLLM sends it with
``--enable-prompt-tokens-details``), the growth of vLLM's prefix-cache counters
(``vllm:prefix_cache_queries`` / ``vllm:prefix_cache_hits``, in tokens) over the turn, the
prefill tokens (prompt minus cached) and the decode tok/s. docs/bench.md gives the protocol.
"""

from __future__ import annotations

import argparse

from bench import prompts
from bench.server_metrics import fetch_metrics, prefix_delta, restart_between
from bench.stream_client import chat_request, stream_text

PHASE = "turns"
DEFAULT_TURN_TOKENS = (8192, 32768, 65536)
LINE = ("Line {n:06d}: the keeper logged the wind, the ships that passed and the oil the lamp "
        "burned.\n")
QUESTION = "Which line of the log above mentions the most ships? Answer in one sentence."
CALIBRATION_LINES = (16, 80)
CALIBRATION_TOKENS = 2  # the calibration answers are not measured, only their usage read


class TurnsError(Exception):
    """Why the turns phase cannot run, phrased for the user."""


def turn_tokens(text: str) -> list[int]:
    """--turn-tokens: comma-separated prompt sizes that grow (each turn resends the last)."""
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        values = []
    if not values or values[0] < 256 or any(b <= a for a, b in zip(values, values[1:])):
        raise argparse.ArgumentTypeError(
            f"--turn-tokens must be growing prompt sizes of at least 256 tokens like "
            f"8192,32768,65536, got {text!r}")
    return values


def log_lines(first: int, count: int) -> str:
    return "".join(LINE.format(n=first + i) for i in range(count))


def user_message(prefix: str, first: int, count: int) -> dict:
    return {"role": "user", "content": f"{prefix}\n{log_lines(first, count)}{QUESTION}"}


async def _prompt_tokens(client, url: str, model: str, messages: list[dict]) -> int:
    body = chat_request(model, messages, CALIBRATION_TOKENS, True)
    streamed = await stream_text(client, url, body)
    prompt = (streamed.usage or {}).get("prompt_tokens")
    if not streamed.delivered or not isinstance(prompt, int):
        raise TurnsError(f"the turns phase's sizing request got no usage.prompt_tokens "
                         f"({streamed.record.failure or 'no usage'}: {streamed.record.detail}); "
                         "the server must report usage in streamed replies")
    return prompt


async def calibrate(client, url: str, model: str, bench_id: str) -> dict:
    """{"tokens_per_line", "overhead_tokens"}: the server's count of one log line, and of the
    rest of a one-message prompt (template, prefix, question)."""
    prefix = prompts.unique_prefix(bench_id, "turns-sizing", 1, 1, 0)
    few, many = CALIBRATION_LINES
    small = await _prompt_tokens(client, url, model, [user_message(prefix, 0, few)])
    large = await _prompt_tokens(client, url, model, [user_message(prefix, 0, many)])
    per_line = (large - small) / (many - few)
    if per_line <= 0:
        raise TurnsError(f"the server counts {small} prompt tokens for {few} log lines and {large} "
                         f"for {many}: the turns phase cannot size its prompts")
    return {"tokens_per_line": per_line, "overhead_tokens": small - per_line * few}


def _turn_record(turn: int, target: int, streamed, before, after) -> dict:
    """What one turn measured; prefill from the usage block's cached tokens, else from the
    /metrics hits (sound only when the turn was the server's one request meanwhile)."""
    usage = streamed.usage or {}
    prompt = usage.get("prompt_tokens")
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
    restart = restart_between(before, after)
    counted = None if restart else prefix_delta(before, after)
    record = streamed.record
    row = {"turn": turn, "target_tokens": target, "prompt_tokens": prompt,
           "completion_tokens": usage.get("completion_tokens"), "cached_tokens": cached,
           "metrics_queries": counted and counted["queries"],
           "metrics_hits": counted and counted["hits"],
           "prefill_tokens": None, "prefill_source": None,
           "ttft_s": streamed.ttft_s, "decode_tok_s": record.tok_s,
           "ok": record.ok, "failure": record.failure, "detail": record.detail, "restart": restart,
           "note": None}
    if counted is not None and isinstance(prompt, int) and counted["queries"] != prompt:
        row["note"] = (f"/metrics counted {counted['queries']:g} prompt tokens looked up during "
                       f"this turn, its prompt has {prompt}: another request ran meanwhile")
    if isinstance(prompt, int) and isinstance(cached, int):
        row["prefill_tokens"], row["prefill_source"] = prompt - cached, "usage"
    elif isinstance(prompt, int) and counted is not None and row["note"] is None:
        row["prefill_tokens"], row["prefill_source"] = prompt - int(counted["hits"]), "metrics"
    return row


async def run_turns(client, url: str, model: str, opts: argparse.Namespace, bench_id: str,
                    progress) -> dict:
    """The phase's part of the result document: {"settings", "sizing", "turns"}."""
    sizing = await calibrate(client, url, model, bench_id)
    per_line, overhead = sizing["tokens_per_line"], sizing["overhead_tokens"]
    prefix = prompts.unique_prefix(bench_id, PHASE, 1, 1, 0)  # no earlier run shares turn 1
    messages: list[dict] = []
    history_tokens, next_line, turns = 0, 0, []
    for turn, target in enumerate(opts.turn_tokens, start=1):
        lines = max(1, round((target - history_tokens - overhead) / per_line))
        messages.append(user_message(prefix if turn == 1 else f"Turn {turn}.", next_line, lines))
        next_line += lines
        before = await fetch_metrics(client, url)
        streamed = await stream_text(client, url, chat_request(model, messages, opts.max_tokens,
                                                               opts.ignore_eos))
        after = await fetch_metrics(client, url)
        row = _turn_record(turn, target, streamed, before, after)
        turns.append(row)
        cached = row["cached_tokens"] if row["cached_tokens"] is not None else row["metrics_hits"]
        ttft = None if row["ttft_s"] is None else round(row["ttft_s"], 3)
        progress.note(f"turn {turn}: {row['prompt_tokens']} prompt tokens, {cached} cached, "
                      f"TTFT {ttft} s")
        if not streamed.delivered or not isinstance(row["prompt_tokens"], int):
            break  # the next turn's history would not be what the server saw
        messages.append({"role": "assistant", "content": streamed.content})
        history_tokens = row["prompt_tokens"] + (row["completion_tokens"] or 0)
    return {"settings": {"turn_tokens": list(opts.turn_tokens), "max_tokens": opts.max_tokens},
            "sizing": sizing, "turns": turns}


def failures(doc: dict | None) -> list[str]:
    """One line per turn that failed or was not run."""
    if not doc:
        return []
    lines = [f"turns: turn {t['turn']}: {t['failure']}: {t['detail']}" for t in doc["turns"]
             if not t["ok"]]
    lines += [f"turns: turn {t['turn']}: invalid: {t['restart']}" for t in doc["turns"]
              if t["restart"]]
    missing = len(doc["settings"]["turn_tokens"]) - len(doc["turns"])
    if missing:
        lines.append(f"turns: {missing} later turn(s) not run: turn {len(doc['turns'])}'s reply "
                     "did not arrive whole")
    return lines


def _num(value, digits: int = 0) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def markdown_table(doc: dict) -> str:
    lines = ["| turn | prompt tokens | cached (usage) | cached (/metrics) | prefill tokens | "
             "TTFT s | decode tok/s |", "|---|---|---|---|---|---|---|"]
    for t in doc["turns"]:
        lines.append(f"| {t['turn']} | {_num(t['prompt_tokens'])} | {_num(t['cached_tokens'])} | "
                     f"{_num(t['metrics_hits'])} | {_num(t['prefill_tokens'])} | "
                     f"{_num(t['ttft_s'], 3)} | {_num(t['decode_tok_s'], 1)} |")
    return "\n".join(lines)


def compare(a: dict | None, b: dict | None) -> str | None:
    """Turn by turn, A against B: TTFT and cached tokens; None unless both files have turns."""
    if not a or not b:
        return None
    lines = ["| turn | prompt tokens A / B | cached A / B | prefill A / B | TTFT s A | TTFT s B | "
             "change |", "|---|---|---|---|---|---|---|"]
    for ta, tb in zip(a["turns"], b["turns"]):
        change = (f"{(tb['ttft_s'] - ta['ttft_s']) / ta['ttft_s'] * 100.0:+.1f}%"
                  if ta["ttft_s"] and tb["ttft_s"] is not None else "-")

        def cached(t):
            return t["cached_tokens"] if t["cached_tokens"] is not None else t["metrics_hits"]
        lines.append(f"| {ta['turn']} | {_num(ta['prompt_tokens'])} / "
                     f"{_num(tb['prompt_tokens'])} | "
                     f"{_num(cached(ta))} / {_num(cached(tb))} | {_num(ta['prefill_tokens'])} / "
                     f"{_num(tb['prefill_tokens'])} | {_num(ta['ttft_s'], 3)} | "
                     f"{_num(tb['ttft_s'], 3)} | {change} |")
    return "\n".join(lines)
