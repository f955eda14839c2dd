"""EXTRA_ARGS parsed by the serving image's own vLLM parser before any rank starts: a flag
that vLLM does not take is refused in one line, not found by every rank's boot. One
`docker run --rm` of the image on the head, without network or GPU
(launcher/extra_args_probe.py); when that parser cannot be set up in the image, the run
says so and goes on (the ranks' own parser still reads the flags)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from launcher.plan.settings import refusal

PROBE = Path(__file__).resolve().parent.parent / "extra_args_probe.py"
TIMEOUT_S = 300


def argv(image: str, words: list[str]) -> list[str]:
    return ["docker", "run", "--rm", "--network", "none", "--entrypoint", "python3", image,
            "-c", PROBE.read_text(), json.dumps(words)]


def shown_argv(image: str, words: list[str]) -> list[str]:
    """What DRY_RUN prints: the probe's source named by its file, not inlined."""
    return [*argv(image, words)[:-3], "-c", "<launcher/extra_args_probe.py>", json.dumps(words)]


def check(image: str, value: str, words: list[str], say) -> None:
    """Refuses EXTRA_ARGS (VALUE) when IMAGE's vLLM parser rejects WORDS; SAY a note when the
    parse could not run."""
    if not words:
        return
    try:
        result = subprocess.run(argv(image, words), capture_output=True, text=True,
                                timeout=TIMEOUT_S, check=False)
        answer = json.loads(result.stdout.strip().splitlines()[-1])
    except (subprocess.TimeoutExpired, ValueError, IndexError, OSError) as error:
        say(f"EXTRA_ARGS not parsed before the ranks ({type(error).__name__}); the ranks' own "
            "vLLM parser reads it")
        return
    if "error" in answer:
        raise refusal("EXTRA_ARGS", value, f"{image}'s vLLM parser says: {answer['error']}; "
                      "accepted: flags its `vllm serve --help` lists")
    if "skipped" in answer:
        say(f"EXTRA_ARGS not parsed before the ranks ({answer['skipped']}); the ranks' own vLLM "
            "parser reads it")
