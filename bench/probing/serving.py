"""The serving probes: does the server serve the model's basics?

  counting      count from 1 to 200: a consecutive run of at least 80 numbers
  needle        recall a passcode planted at 95% of a --prompt-tokens long prompt; the
                prefill rate from its time to first token
  thinking_off  no <think> tags in the content and nothing in the reasoning fields
"""

from __future__ import annotations

import re
import secrets
from dataclasses import dataclass

from bench.probing.client import Target, complete, probe_request
from bench.probing.verdict import ProbeError, ProbeResult, ProbesCannotRun, excerpt
from bench.stream_client import chat_request, stream_text

COUNT_TO = 200
COUNT_PASS_RUN = 80           # the seed's threshold: a consecutive run of at least 80 numbers
COUNT_MAX_TOKENS = 1200       # 200 numbers and newlines, with room for digit-wise tokenizers
NEEDLE_DEPTH = 0.95
NEEDLE_MAX_TOKENS = 48
NEEDLE_MIN_NOTES = 20
CALIBRATION_NOTES = 100
THINKING_MAX_TOKENS = 128

THINK_TAG = re.compile(r"</?think>", re.IGNORECASE)
THINKING_QUESTION = "What is twelve times twelve? Answer in one short sentence."
COUNT_QUESTION = f"Count from 1 to {COUNT_TO}, one number per line, with nothing else."


# ----------------------------------------------------------------------------- counting


def longest_run(numbers: list[int]) -> tuple[int, int | None, int | None]:
    """(length, first, last) of the longest stretch where each number is the previous + 1."""
    best, start, length = (0, None, None), 0, 0
    for index, number in enumerate(numbers):
        if index and number == numbers[index - 1] + 1:
            length += 1
        else:
            start, length = index, 1
        if length > best[0]:
            best = (length, numbers[start], number)
    return best


async def probe_counting(target: Target) -> ProbeResult:
    answer = await complete(target.session, target.url, probe_request(
        target.model, [{"role": "user", "content": COUNT_QUESTION}], COUNT_MAX_TOKENS))
    numbers = [int(n) for n in re.findall(r"\d+", answer.content)]
    run, first, last = longest_run(numbers)
    details = {"longest_run": run, "run_first": first, "run_last": last,
               "numbers_seen": len(numbers), "expected": COUNT_TO, "pass_at": COUNT_PASS_RUN,
               "complete": numbers == list(range(1, COUNT_TO + 1)),
               "finish_reason": answer.finish_reason,
               "completion_tokens": answer.usage.get("completion_tokens"),
               "content": excerpt(answer.content)}
    found = (f"longest consecutive run {run}" + (f" ({first}..{last})" if run else "")
             + f" of {len(numbers)} numbers")
    if run >= COUNT_PASS_RUN:
        return ProbeResult("counting", "pass", found + (", 1..200 complete" if details["complete"]
                                                         else ""), details=details)
    where = "" if answer.content else (
        f"; content is empty, {answer.reasoning_field} holds {len(answer.reasoning)} chars"
        if answer.reasoning else "; content is empty")
    return ProbeResult("counting", "fail", f"{found}, needs {COUNT_PASS_RUN}{where}; came back: "
                                           f"{excerpt(answer.content)!r}", details=details)


# ----------------------------------------------------------------------------- needle


_SUBJECTS = ("The harbour master", "A lighthouse keeper", "The ferry captain",
             "An old fisherman", "The weather station", "A young cartographer",
             "The night watchman")
_ACTIONS = ("logged", "noticed", "repaired", "counted", "painted", "measured", "recorded")
_OBJECTS = ("the tide tables", "a cracked lantern", "seventeen gulls", "the northern buoy",
            "the fog signal", "a drifting crate", "the signal flags")
_TIMES = ("before dawn", "at noon", "in the evening", "after the storm", "during the fog",
          "at low tide")


def filler_note(number: int) -> str:
    return (f"Note {number}: {_SUBJECTS[number % 7]} {_ACTIONS[number // 7 % 7]} "
            f"{_OBJECTS[number // 49 % 7]} {_TIMES[number % 6]}.")


@dataclass
class NeedlePrompt:
    text: str
    notes: int                    # filler notes (the needle's note not counted)
    needle_note: int              # the needle's note number
    depth: float                  # characters before the needle / all characters


def needle_prompt(salt: str, needle: str, notes: int, depth: float = NEEDLE_DEPTH) -> NeedlePrompt:
    """A unique header (salt: no prefix-cache hit), numbered notes, the needle among them so
    that depth of the message's characters come before it, and the question as the last line."""
    head = (f"[probe {salt}] Read the numbered notes below. One of them gives a secret "
            f"passcode. Answer the question at the end.\n\n")
    question = ("\nQuestion: what is the secret passcode written in the notes? "
                "Reply with the passcode only.")

    def build(at: int) -> tuple[str, int]:
        before = "".join(filler_note(n) + "\n" for n in range(1, at + 1))
        needle_line = f"Note {at + 1}: The secret passcode is {needle}. Remember it.\n"
        after = "".join(filler_note(n) + "\n" for n in range(at + 2, notes + 2))
        return head + before + needle_line + after + question, len(head + before)

    text, _ = build(round(notes * depth))
    # the filler notes before the needle whose characters come closest to depth of the text
    prefix, at = len(head), 0
    goal = depth * len(text)
    while at < notes and abs(prefix + len(filler_note(at + 1)) + 1 - goal) < abs(prefix - goal):
        at += 1
        prefix += len(filler_note(at)) + 1
    text, before = build(at)
    return NeedlePrompt(text, notes, at + 1, before / len(text))


async def _prompt_tokens_of(target: Target, text: str) -> int | None:
    answer = await complete(target.session, target.url, probe_request(
        target.model, [{"role": "user", "content": text}], 1))
    tokens = answer.usage.get("prompt_tokens")
    return int(tokens) if isinstance(tokens, int) else None


async def size_needle_prompt(target: Target) -> tuple[int, dict]:
    """Filler notes that bring the prompt to --prompt-tokens, measured with the server's own
    tokenizer: two one-token requests (no notes, and some notes) read usage.prompt_tokens.
    Their salt differs from the probe's, so neither warms the probe's prefix cache."""
    salt = "calibration-" + secrets.token_hex(4)
    # about 20 tokens a note: stay well inside a small max_model_len
    sample_notes = max(10, min(CALIBRATION_NOTES, target.prompt_tokens // 40))
    frame, sample = (needle_prompt(salt, "XXXX-XXXX", n).text for n in (0, sample_notes))
    base = await _prompt_tokens_of(target, frame)
    full = await _prompt_tokens_of(target, sample)
    if base is None or full is None or full <= base:
        # no usage from this server: about four characters per token
        base, full, method = len(frame) // 4, len(sample) // 4, "estimated_4_chars"
    else:
        method = "usage"
    # per character, not per note: later notes carry longer numbers than the sample's
    per_char = (full - base) / (len(sample) - len(frame))
    budget, notes = (target.prompt_tokens - base) / per_char, 0
    while budget >= len(filler_note(notes + 1)) + 1:
        budget -= len(filler_note(notes + 1)) + 1
        notes += 1
    if notes < NEEDLE_MIN_NOTES:
        least = base + per_char * sum(len(filler_note(n)) + 1
                                      for n in range(1, NEEDLE_MIN_NOTES + 1))
        raise ProbesCannotRun(f"--prompt-tokens {target.prompt_tokens} leaves room for "
                              f"{notes} notes around the needle; pass "
                              f"--prompt-tokens {int(least) + 1} or more")
    return notes, {"tokens_per_char": round(per_char, 4), "frame_tokens": base,
                   "calibration": method}


async def probe_needle(target: Target) -> ProbeResult:
    notes, sizing = await size_needle_prompt(target)
    salt = secrets.token_hex(8)
    needle = f"{secrets.token_hex(2).upper()}-{secrets.token_hex(2).upper()}"
    prompt = needle_prompt(salt, needle, notes)
    body = chat_request(target.model, [{"role": "user", "content": prompt.text}],
                        NEEDLE_MAX_TOKENS, ignore_eos=False)
    reply = await stream_text(target.session, target.url, body)
    record = reply.record
    if not reply.delivered:
        raise ProbeError(f"{record.failure}: {record.detail}")
    usage = reply.usage or {}
    prompt_tokens = usage.get("prompt_tokens")
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
    prefill = (prompt_tokens / reply.ttft_s if isinstance(prompt_tokens, int) and reply.ttft_s
               else None)
    found = needle.lower() in reply.content.lower()
    details = {"salt": salt, "needle": needle, "needle_note": prompt.needle_note,
               "notes": notes, "needle_depth": round(prompt.depth, 4),
               "target_prompt_tokens": target.prompt_tokens, "prompt_tokens": prompt_tokens,
               "cached_tokens": cached, "ttft_s": reply.ttft_s, "prefill_tok_s": prefill,
               "found": found, "in_reasoning_only": not found and needle.lower()
               in reply.reasoning.lower(), "finish_reason": record.finish_reason,
               "stream_note": None if record.ok else f"{record.failure}: {record.detail}",
               "content": excerpt(reply.content), **sizing}
    where = (f"at {prompt.depth:.0%} of {prompt_tokens if prompt_tokens is not None else '?'}"
             f" prompt tokens")
    rate = (f"; prefill {prefill:,.0f} tok/s (TTFT {reply.ttft_s:.2f} s)" if prefill
            else "; prefill rate unknown (no usage.prompt_tokens or no token-bearing chunk)")
    if found:
        return ProbeResult("needle", "pass", f"found {needle} {where}{rate}", details=details)
    also = " (it is in the reasoning field only)" if details["in_reasoning_only"] else ""
    return ProbeResult("needle", "fail", f"the answer lacks the passcode {needle} planted "
                                         f"{where}{also}; came back: "
                                         f"{excerpt(reply.content)!r}", details=details)


# ----------------------------------------------------------------------------- thinking


async def probe_thinking_off(target: Target) -> ProbeResult:
    answer = await complete(target.session, target.url, probe_request(
        target.model, [{"role": "user", "content": THINKING_QUESTION}], THINKING_MAX_TOKENS))
    tags = THINK_TAG.findall(answer.content)
    reasoning_tokens = (answer.usage.get("completion_tokens_details") or {}).get(
        "reasoning_tokens")
    details = {"content": excerpt(answer.content), "think_tags_in_content": len(tags),
               "reasoning_field": answer.reasoning_field, "reasoning": excerpt(answer.reasoning),
               "reasoning_tokens": reasoning_tokens, "finish_reason": answer.finish_reason}
    problems = []
    if tags:
        problems.append(f"content holds {len(tags)} think tag(s): {excerpt(answer.content)!r}")
    if answer.reasoning.strip():
        problems.append(f"{answer.reasoning_field} holds {len(answer.reasoning)} chars: "
                        f"{excerpt(answer.reasoning)!r}")
    if isinstance(reasoning_tokens, int) and reasoning_tokens > 0:
        problems.append(f"usage counts {reasoning_tokens} reasoning tokens")
    if not answer.content.strip():
        problems.append(f"content is empty (finish_reason {answer.finish_reason})")
    if problems:
        return ProbeResult("thinking_off", "fail", "; ".join(problems), details=details)
    return ProbeResult("thinking_off", "pass", f"no think tags, no reasoning: "
                                               f"{excerpt(answer.content, 80)!r}", details=details)
