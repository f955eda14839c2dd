"""The value of `--override-generation-config`: python3 generation_config.py MAX_NEW_TOKENS OBJECT

MAX_NEW_TOKENS (digits, or empty for no ceiling) becomes `max_new_tokens`, which vLLM
treats as a server-wide limit on output tokens per request; OBJECT (GENERATION_CONFIG, a
JSON object, or empty) adds other generation defaults such as temperature. Prints the
merged object as one line of JSON, or nothing when both are empty. A bad OBJECT is
refused in one line with exit 2.
"""

import json
import sys

_REFUSED = "refused: GENERATION_CONFIG={}: {}"


def merged(max_new_tokens, text):
    config = {}
    if text:
        try:
            config = json.loads(text)
        except json.JSONDecodeError as error:
            raise ValueError(f"not JSON ({error}); accepted: a JSON object such as "
                             '{"temperature": 0.6}, or empty') from None
        if not isinstance(config, dict):
            raise ValueError('accepted: a JSON object such as {"temperature": 0.6}, or empty')
        if "max_new_tokens" in config:
            raise ValueError("max_new_tokens is set from MAX_NEW_TOKENS; set that instead "
                             "and leave it out here")
    if max_new_tokens:
        config = {"max_new_tokens": int(max_new_tokens), **config}
    return config


def main(argv):
    max_new_tokens, text = argv[1], argv[2]
    try:
        config = merged(max_new_tokens, text)
    except ValueError as error:
        print(_REFUSED.format(text.replace("\n", "\\n"), error), file=sys.stderr)
        return 2
    if config:
        print(json.dumps(config))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
