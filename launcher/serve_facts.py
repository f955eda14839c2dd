"""Facts scripts/doctor reads from JSON: python3 serve_facts.py argv|models < JSON

argv    stdin: a rank container's `docker inspect` Args (the words after the image).
        Prints `method=<speculative method or none> k=<num_speculative_tokens or 0>`.
models  stdin: the body of GET /v1/models. Prints `id=<first model id> max_model_len=<n>`
        (n is "unknown" when the server does not say).
Exit 1 with one line on stderr when the JSON is not what was expected.
"""

import json
import sys


def speculative(args):
    text = None
    for at, word in enumerate(args):
        if word == "--speculative-config" and at + 1 < len(args):
            text = args[at + 1]
        elif word.startswith("--speculative-config="):
            text = word.partition("=")[2]
    if text is None:
        return "none", 0
    config = json.loads(text)
    return config.get("method") or "none", int(config.get("num_speculative_tokens") or 0)


def main(argv):
    mode, text = argv[1], sys.stdin.read()
    try:
        data = json.loads(text)
        if mode == "argv":
            method, k = speculative([str(word) for word in data])
            print(f"method={method} k={k}")
        else:
            first = data["data"][0]
            print(f"id={first['id']} max_model_len={first.get('max_model_len', 'unknown')}")
    except (ValueError, KeyError, IndexError, TypeError) as error:
        print(f"serve_facts.py {mode}: unexpected JSON ({error!r}): {text[:200]}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
