"""Who may use the API of a run (API_AUTH, API_KEY_FILE), as the plan and the start-up line
say it: whether the run is keyed, the paths that need the key, and the words for it. The key
itself lives in its file (launcher/apply/api_key_file.py finds, writes and hands it over): it
is on no command line, in no DRY_RUN line, log or run record; they name its file.

Stock vLLM (vllm/entrypoints/serve/middleware/authenticate.py in 0.30.0) asks for it only on
paths starting /v1, /v2, /inference and /cohere; the chain's v8 image (v8_api_key,
patches/v8/api_key_guard.py) asks for it on every path but OPEN_PATHS (docs/security.md).
"""

from __future__ import annotations

from launcher.plan.checks import chain_layer_number
from launcher.plan.data import API_KEY_ENV_FILE

# The paths the chain's vLLM answers without the key: OPEN_PATHS of patches/v8/api_key_guard.py
# (tests/vllm/test_api_key_routes.py holds the two equal).
OPEN_PATHS = ("/health",)
SERVER_VARIABLE = "VLLM_API_KEY"


def keyed(checked) -> bool:
    return checked["API_AUTH"] == "key"


def curl_config(key: str | None) -> str | None:
    """curl's `--config -` text that sends KEY as a bearer token (None: no key)."""
    return None if key is None else f'header = "Authorization: Bearer {key}"\n'


def needs_key(path: str) -> bool:
    """Whether the chain's vLLM asks PATH for the key (a stock one asks fewer; sending it to
    those is harmless)."""
    return path not in OPEN_PATHS


def routes_phrase(checked) -> str:
    """Which routes the key guards: every one but OPEN_PATHS on a chain image (its v8 layer);
    an image from elsewhere may guard /v1 alone."""
    if chain_layer_number(checked.recipe, checked["IMAGE"]) is not None:
        return f"every route but {', '.join(OPEN_PATHS)} needs it (docs/security.md)"
    return (f"IMAGE={checked['IMAGE']} is not of the image chain, whose v8 layer guards every "
            "route: its vLLM may answer routes outside /v1 without the key (docs/security.md)")


def startup_phrase(checked) -> str:
    """The start-up line's part on who may use the API and how."""
    port = checked["PORT"]
    if not keyed(checked):
        return (f"API open (API_AUTH=none): anyone who can reach port {port} on any address of "
                "the head can use it")
    path = checked["API_KEY_FILE"]
    return (f"API key in {path}: send 'Authorization: Bearer $(cat {path})'; "
            f"{routes_phrase(checked)}")


def dry_run_comment(checked) -> str:
    """DRY_RUN's step before the ranks start: where the key comes from, never the key."""
    path = checked["API_KEY_FILE"]
    return (f"API key: {path} (API_KEY_FILE), written with a random key, mode 0600, when "
            "missing and refused when others can read it; rank 0 gets it as "
            f"{SERVER_VARIABLE} from {API_KEY_ENV_FILE}, a 0600 file removed once the rank "
            "started")
