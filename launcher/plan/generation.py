"""The value of `--override-generation-config`: MAX_NEW_TOKENS merged with GENERATION_CONFIG.

MAX_NEW_TOKENS (digits, or empty for no ceiling) becomes `max_new_tokens`, which vLLM
treats as a server-wide limit on output tokens per request; GENERATION_CONFIG (a JSON
object, or empty) adds other generation defaults such as temperature.
"""

from __future__ import annotations

import json

from launcher.plan.settings import Refused

_OBJECT = 'a JSON object such as {"temperature": 0.6}, or empty'


def merged_json(max_new_tokens: str, text: str) -> str:
    """The merged object as one line of JSON, or "" when both are empty."""
    config = {}
    if text:
        try:
            config = json.loads(text)
        except json.JSONDecodeError as error:
            raise _refused(text, f"not JSON ({error}); accepted: {_OBJECT}") from None
        if not isinstance(config, dict):
            raise _refused(text, f"accepted: {_OBJECT}")
        if "max_new_tokens" in config:
            raise _refused(text, "max_new_tokens is set from MAX_NEW_TOKENS; set that instead "
                           "and leave it out here")
    if max_new_tokens:
        config = {"max_new_tokens": int(max_new_tokens), **config}
    return json.dumps(config) if config else ""


def _refused(text: str, why: str) -> Refused:
    return Refused(f"refused: GENERATION_CONFIG={text.replace(chr(10), chr(92) + 'n')}: {why}")
