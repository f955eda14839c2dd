"""run.sh's self-check, once the API is ready: one Korean answer to the field's prompt, its
counts in one line; a fault warns, naming the likely cause. The ranks keep running whatever
it finds (SELF_CHECK=0 in recipe.toml turns it off).

    python3 launcher/entry.py self-check http://127.0.0.1:8000

A small client of the standard library (urllib): the launcher imports nothing of bench/.
The counts and the verdict are recipekit/text_integrity.py's, as bench/probes.py's
multibyte probe counts them (docs/probes.md). The API key (--api-key-file FILE, else
OPENAI_API_KEY, else the recipe's default key file: recipekit/apikey.py) is sent as
`Authorization: Bearer KEY`, and shown nowhere.

Exit code: 0 clean, 1 fault, 2 could not run (the line says why), 3 inconclusive.
"""

from __future__ import annotations

import json
import sys
import urllib.error
import urllib.request

from recipekit import text_integrity as integrity
from recipekit.apikey import ClientKey, KeyFileError, client_key

# 700 tokens on a Spark: about 25 s at the seed's 28 tok/s; a generous wait for slower ones
TIMEOUT_S = 600
CLEAN, FAULT, COULD_NOT_RUN, INCONCLUSIVE = 0, 1, 2, 3
PREFIX = "glm53: "
CAUSE = ("likely corrupted token ids: with a ModelOpt NVFP4 checkpoint (LibertAIDAI's, the "
         "default, among them) vLLM's fused MoE keeps the gate's global scale for the up "
         "projection too (docs/probes.md, 'The integrity probes'); bench/probes.py --only "
         "multibyte,tool_cycles judges more, a compressed-tensors or equal-scale checkpoint "
         "is the way out")


NO_KEY = ClientKey(None, "no key given")


class CheckFailed(Exception):
    """No answer to judge; the message says what came back instead."""


def _request(url: str, key: ClientKey, body: dict | None = None) -> dict:
    headers = {"Content-Type": "application/json", **key.headers()}
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT_S) as reply:
            raw = reply.read()
    except urllib.error.HTTPError as error:
        if error.code == 401:
            raise CheckFailed(key.unauthorized(url)) from None
        detail = error.read()[:300].decode("utf-8", "replace")
        raise CheckFailed(f"HTTP {error.code} from {url}: {detail}") from None
    except (urllib.error.URLError, OSError) as error:
        raise CheckFailed(f"no answer from {url} ({error})") from None
    try:
        return json.loads(raw)
    except ValueError:
        raise CheckFailed(f"{url} answered something that is not JSON: "
                          f"{raw[:120].decode('utf-8', 'replace')!r}") from None


def _model(base: str, key: ClientKey) -> str:
    models = _request(base + "/v1/models", key)
    try:
        return models["data"][0]["id"]
    except (KeyError, IndexError, TypeError):
        raise CheckFailed(f"{base}/v1/models lists no model: {json.dumps(models)[:120]}") from None


def _answer(base: str, model: str, key: ClientKey) -> tuple[dict, bool]:
    """The field's prompt answered, with token bytes when the server gives logprobs;
    (the choice, whether logprobs were asked)."""
    body = {"model": model, "messages": [{"role": "user", "content": integrity.FIELD_PROMPT}],
            "max_tokens": integrity.FIELD_MAX_TOKENS, "temperature": 0.0,
            "chat_template_kwargs": {"enable_thinking": False}, "logprobs": True}
    url = base + "/v1/chat/completions"
    try:
        answer, asked = _request(url, key, body), True
    except CheckFailed as refused:
        if not str(refused).startswith("HTTP 400"):
            raise
        del body["logprobs"]   # a server that does not give logprobs (a drafter's, say)
        answer, asked = _request(url, key, body), False
    try:
        return answer["choices"][0], asked
    except (KeyError, IndexError, TypeError):
        raise CheckFailed(f"{url} answered without choices[0]: {json.dumps(answer)[:120]}") \
            from None


def _token_bytes(choice: dict) -> list | None:
    entries = ((choice.get("logprobs") or {}).get("content")
               if isinstance(choice.get("logprobs"), dict) else None)
    if not isinstance(entries, list) or not entries:
        return None
    found = [entry.get("bytes") if isinstance(entry, dict) else None for entry in entries]
    return found if all(isinstance(b, list) for b in found) else None


def check(base: str, key: ClientKey = NO_KEY) -> tuple[int, str, str | None]:
    """(exit code, the one line, the warning or None) of one self-check against BASE."""
    base = base.rstrip("/").removesuffix("/v1")
    try:
        choice, _ = _answer(base, _model(base, key), key)
    except CheckFailed as failed:
        return (COULD_NOT_RUN, f"{PREFIX}self-check could not run: {failed}; the ranks keep "
                               "running", None)
    message = choice.get("message") if isinstance(choice.get("message"), dict) else {}
    content = message.get("content") if isinstance(message.get("content"), str) else ""
    reasoning = message.get("reasoning") or message.get("reasoning_content") or ""
    judged = integrity.judge(integrity.KOREAN, content, str(reasoning), _token_bytes(choice),
                             choice.get("finish_reason"))
    what = (f"one Korean answer to the field's prompt ({integrity.FIELD_MAX_TOKENS} tokens): "
            f"{judged.counts()}; {judged.shape()}")
    if judged.verdict == "fault":
        return (FAULT, f"{PREFIX}self-check: FAULT: {what}",
                f"{PREFIX}WARNING: the served text is corrupted ({judged.counts()}): {CAUSE}. "
                "The ranks keep running.")
    if judged.verdict == "inconclusive":
        return (INCONCLUSIVE, f"{PREFIX}self-check inconclusive ({judged.why}): {what}; it "
                              "shows neither corruption nor its absence", None)
    return CLEAN, f"{PREFIX}self-check: clean: {what}", None


def main(argv: list[str]) -> int:
    key_file = None
    if len(argv) == 3 and argv[1] == "--api-key-file":
        argv, key_file = argv[:1], argv[2]
    if len(argv) != 1 or not argv[0].startswith(("http://", "https://")):
        print("usage: launcher/entry.py self-check http://HOST:PORT [--api-key-file FILE]",
              file=sys.stderr)
        return 64
    try:
        key = client_key(key_file)
    except KeyFileError as error:
        print(f"{PREFIX}self-check could not run: {error}", flush=True)
        return COULD_NOT_RUN
    code, line, warning = check(argv[0], key)
    print(line, flush=True)
    if warning:
        print(warning, file=sys.stderr, flush=True)
    return code
