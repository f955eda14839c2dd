"""EXTRA_ARGS parsed by the serving image's own vLLM parser before any rank starts: a flag
that vLLM does not take is refused in one line, not found by every rank's boot. One
`docker run --rm` of the image on the head, without network or GPU, runs
launcher/extra_args_probe.py (the plan's extra_args_parse); when that parser cannot be set
up in the image, the run says so and goes on (the ranks' own parser still reads the flags).
"""

from __future__ import annotations

import json
from pathlib import Path

from launcher.plan.settings import refusal

PROBE = Path(__file__).resolve().parent.parent / "extra_args_probe.py"
# How DRY_RUN names the probe's source, which the run passes inline
SHOWN = "<launcher/extra_args_probe.py>"
TIMEOUT_S = 300


def not_parsed(why: str) -> str:
    return f"EXTRA_ARGS not parsed before the ranks ({why}); the ranks' own vLLM parser reads it"


def judge(stdout: str, image: str, value: str, say) -> None:
    """IMAGE's parser's answer (the probe's last line of STDOUT) on EXTRA_ARGS (VALUE): refused
    when it rejects a flag; SAY a note when it could not parse them."""
    try:
        answer = json.loads(stdout.strip().splitlines()[-1])
    except (ValueError, IndexError) as error:
        say(not_parsed(type(error).__name__))
        return
    if "error" in answer:
        raise refusal("EXTRA_ARGS", value, f"{image}'s vLLM parser says: {answer['error']}; "
                      "accepted: flags its `vllm serve --help` lists")
    if "skipped" in answer:
        say(not_parsed(answer["skipped"]))
