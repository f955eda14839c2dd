"""The bench phases' prompts, each stream given its own unique prefix."""

from __future__ import annotations

PHASES = ("prose", "structured", "code")

_PHASE_PROMPTS = {
    # free text: the low-acceptance regime
    "prose": ("Write a long, detailed essay about the history of lighthouses: how they were "
              "built, who kept them, and how their lamps changed over the centuries."),
    # counting: the high-acceptance regime
    "structured": "Count from 1 to 200, one number per line, with nothing else.",
    # a fixed programming task answered as code: the regime the field's code figures measure
    "code": ("Write a complete Python module that implements an LRU cache class with get, put "
             "and delete methods, type hints and docstrings, followed by unittest tests of its "
             "eviction order. Reply with the code only."),
}


def unique_prefix(bench_id: str, phase: str, concurrency: int, run: int, stream: int) -> str:
    """A prefix no other stream of any bench invocation shares, so no prefix-cache hit."""
    return f"[bench {bench_id} {phase} c{concurrency} r{run} s{stream}]"


def phase_messages(phase: str, prefix: str) -> list[dict]:
    if phase not in _PHASE_PROMPTS:
        raise ValueError(f"unknown phase {phase!r}: use one of {', '.join(PHASES)}")
    return [{"role": "user", "content": f"{prefix} {_PHASE_PROMPTS[phase]}"}]
