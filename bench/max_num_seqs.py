"""The server's max_num_seqs: how many streams it decodes at once. A bench cell at more
concurrent streams than that measures the server's queue, not its decode.

vLLM 0.30.0 serves the value in one place only: GET /server_info?config_format=json
(`vllm_config.scheduler_config.max_num_seqs`), a development endpoint it attaches only with
VLLM_SERVER_DEV_MODE=1 (vllm/entrypoints/serve/__init__.py). Its /metrics has no such gauge
(`vllm:cache_config_info` carries the CacheConfig's fields, not the scheduler's) and its
/v1/models lists max_model_len only. So the bench learns it, first that answers:
  1. --max-num-seqs N, as the user (or scripts/compare, from the side it booted) states it;
  2. the server's /server_info;
  3. the launcher's settings on this checkout (environment, cluster.env, profile, recipe.toml,
     resolved as ./run.sh resolves them), when the server is the one they describe: on this
     host (a loopback URL) at their PORT, with their MAX_MODEL_LEN in /v1/models;
else it is unknown (and a wave the server queued is caught by /metrics, bench_decode.py).
"""

from __future__ import annotations

import asyncio
import os
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass

import aiohttp

from recipekit import recipe

LOOPBACK = ("127.0.0.1", "localhost", "::1")
SERVER_INFO = "/server_info?config_format=json"


@dataclass(frozen=True)
class Learned:
    value: int | None   # None: unknown
    source: str         # where it came from, or why it is unknown

    def to_json(self) -> dict:
        return {"value": self.value, "source": self.source}


def _count(value) -> int | None:
    """A positive integer, else None (bool is not one)."""
    if isinstance(value, bool):
        return None
    try:
        number = int(value)
    except (TypeError, ValueError):
        return None
    return number if number >= 1 and str(number) == str(value).strip() else None


def from_server_info(doc) -> int | None:
    """vllm_config.scheduler_config.max_num_seqs of /server_info's JSON form, else None."""
    try:
        return _count(doc["vllm_config"]["scheduler_config"]["max_num_seqs"])
    except (KeyError, TypeError):
        return None


def from_launcher(url: str, max_model_len, environ: Mapping[str, str]) -> tuple[int | None, str]:
    """(MAX_NUM_SEQS of the launcher's settings, or None; why it is or is not used) for the
    server at URL, whose /v1/models says MAX_MODEL_LEN."""
    parts = urllib.parse.urlsplit(url)
    if parts.hostname not in LOOPBACK:
        return None, f"{url} is not on this host"
    from launcher.plan.load import cluster_file  # the bench runs from the launcher's checkout
    from launcher.plan.settings import Refused, resolve
    try:
        values = resolve(recipe.load(), environ, cluster_file(environ))
    except (Refused, recipe.RecipeError) as exc:
        return None, f"the launcher's settings do not resolve ({exc})"
    port = parts.port or (443 if parts.scheme == "https" else 80)
    if str(port) != values["PORT"]:
        return None, f"{url} is not at the launcher's PORT {values['PORT']}"
    if str(max_model_len) != values["MAX_MODEL_LEN"]:
        return None, (f"{url} serves max_model_len {max_model_len}, not the launcher's "
                      f"MAX_MODEL_LEN {values['MAX_MODEL_LEN']}")
    seqs = _count(values["MAX_NUM_SEQS"])
    return seqs, (f"the launcher's MAX_NUM_SEQS on this checkout (its PORT and MAX_MODEL_LEN "
                  f"are the server's)" if seqs else
                  f"the launcher's MAX_NUM_SEQS {values['MAX_NUM_SEQS']!r} is not a count")


def served_max_model_len(models) -> int | None:
    """The max_model_len /v1/models lists (vLLM's model card field), else None."""
    try:
        lengths = {m.get("max_model_len") for m in models["data"]}
    except (KeyError, TypeError, AttributeError):
        return None
    return lengths.pop() if len(lengths) == 1 else None


async def learn(session: aiohttp.ClientSession, url: str, given: int | None, models,
                environ: Mapping[str, str] | None = None) -> Learned:
    """The server's max_num_seqs and its source (module docstring), or why it is unknown."""
    if given is not None:
        return Learned(given, "--max-num-seqs")
    try:
        async with session.get(url + SERVER_INFO) as reply:
            doc = await reply.json(content_type=None) if reply.status == 200 else None
    except (aiohttp.ClientError, asyncio.TimeoutError, ValueError):
        doc = None
    if (seqs := from_server_info(doc)) is not None:
        return Learned(seqs, f"{url}/server_info (vLLM's VLLM_SERVER_DEV_MODE=1)")
    seqs, why = from_launcher(url, served_max_model_len(models),
                              os.environ if environ is None else environ)
    if seqs is not None:
        return Learned(seqs, why)
    return Learned(None, f"unknown: {url} serves no /server_info (vLLM serves it only with "
                         f"VLLM_SERVER_DEV_MODE=1) and {why}; pass --max-num-seqs")
