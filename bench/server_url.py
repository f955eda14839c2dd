"""The server URL every client here takes, by one name: --url (--base-url, the OpenAI SDKs'
word, is its alias). A trailing / or /v1 is accepted: the tools add the paths themselves."""

from __future__ import annotations

import argparse

DEFAULT = "http://127.0.0.1:8000"
FLAGS = ("--url", "--base-url")


def base_url(text: str) -> str:
    """http(s)://HOST:PORT with any trailing / or /v1 taken off (an argparse type)."""
    url = text.strip().rstrip("/").removesuffix("/v1").rstrip("/")
    if not url.startswith(("http://", "https://")):
        raise argparse.ArgumentTypeError(
            f"must be the server's http:// or https:// URL, like {DEFAULT}, got {text!r}")
    return url


def add_argument(parser: argparse.ArgumentParser, help_text: str = "the server's base URL",
                 **kwargs) -> None:
    """--url (alias --base-url) on PARSER, as opts.url; a default of DEFAULT unless KWARGS say
    otherwise (required=True, default=None)."""
    if not kwargs.get("required"):
        kwargs.setdefault("default", DEFAULT)
    shown = f" (default {kwargs['default']})" if kwargs.get("default") else ""
    parser.add_argument(*FLAGS, dest="url", type=base_url, metavar="URL",
                        help=f"{help_text}; a trailing /v1 is fine{shown}", **kwargs)
