"""The API key of a run (API_AUTH, API_KEY_FILE): found or created on the head, handed to
rank 0 as VLLM_API_KEY through a `docker run --env-file` written 0600 and removed once the
rank started, and sent by the launcher's own requests through curl's config on stdin. The
key is on no command line, in no DRY_RUN line, log or run record: they name its file.

Stock vLLM (vllm/entrypoints/serve/middleware/authenticate.py in 0.30.0) asks for it only on
paths starting /v1, /v2, /inference and /cohere; the chain's v8 image (v8_api_key,
patches/v8/api_key_guard.py) asks for it on every path but OPEN_PATHS (docs/security.md).
"""

from __future__ import annotations

import errno
import os
import tempfile
from contextlib import contextmanager
from pathlib import Path

from launcher.plan.checks import chain_layer_number
from launcher.plan.settings import refusal
from recipekit.apikey import KeyFileError, create_key, read_key

# The paths the chain's vLLM answers without the key: OPEN_PATHS of patches/v8/api_key_guard.py
# (tests/vllm/test_api_key_routes.py holds the two equal).
OPEN_PATHS = ("/health",)
# What rank 0's `docker run --env-file` names until a real run writes the file.
ENV_FILE_PLACEHOLDER = "<api-key-env-file>"
SERVER_VARIABLE = "VLLM_API_KEY"


def keyed(checked) -> bool:
    return checked["API_AUTH"] == "key"


def existing_key(checked) -> str | None:
    """The run's key when its file exists (a loose or broken one refused), before any other
    check; None when there is none yet or API_AUTH=none."""
    path = Path(checked["API_KEY_FILE"])
    if not keyed(checked) or (not path.exists() and not path.is_symlink()):
        return None
    return key_of_run(checked, lambda line: None)


def key_of_run(checked, say) -> str | None:
    """The run's key (None with API_AUTH=none): API_KEY_FILE read, or written with a new
    random key on the first run (SAY tells so); a loose or broken file is refused."""
    if not keyed(checked):
        return None
    path = Path(checked["API_KEY_FILE"])
    if not path.exists() and not path.is_symlink():
        try:
            create_key(path)
        except OSError as error:
            raise unwritable(path, error.strerror) from None
        say(f"wrote a new random API key to {path} (mode 0600, git-ignored; later runs reuse it)")
    try:
        return read_key(path)
    except KeyFileError as error:
        raise refusal("API_KEY_FILE", str(path), error.why) from None


def unwritable(path: Path, why: str):
    return refusal("API_KEY_FILE", str(path), f"cannot write a new key there ({why}); "
                   "accepted: a path this user can create")


def why_uncreatable(path: Path) -> str | None:
    """Why create_key could not write PATH, judged without writing, in the words its
    Path.mkdir(parents=True, exist_ok=True) and open would fail with; None when it could."""
    folder = path.parent
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    if not folder.is_dir():  # mkdir of the file itself, or of a folder under it
        return os.strerror(errno.EEXIST if folder == path.parent else errno.ENOTDIR)
    if not os.access(folder, os.W_OK | os.X_OK):
        return os.strerror(errno.EACCES)
    return None


def judge_key_file(checked) -> None:
    """What a run refuses of API_KEY_FILE, judged without writing a key (DRY_RUN): a loose or
    broken file, or, when there is none yet, a path where none can be written."""
    if existing_key(checked) is not None or not keyed(checked):
        return
    path = Path(checked["API_KEY_FILE"])
    if why := why_uncreatable(path):
        raise unwritable(path, why)


def key_of_client(checked) -> str | None:
    """What the doctor and the readiness wait send: the key in API_KEY_FILE (None with
    API_AUTH=none); a missing, loose or broken file is refused, naming it."""
    if not keyed(checked):
        return None
    try:
        return read_key(Path(checked["API_KEY_FILE"]))
    except KeyFileError as error:
        raise refusal("API_KEY_FILE", checked["API_KEY_FILE"], error.why) from None


@contextmanager
def server_env_file(key: str):
    """A file holding VLLM_API_KEY=KEY for `docker run --env-file`, mode 0600 from its
    creation, removed when the block ends (docker has read it by then)."""
    descriptor, name = tempfile.mkstemp(prefix="glm53-api-key-", suffix=".env")
    try:
        with os.fdopen(descriptor, "w", encoding="ascii") as file:
            file.write(f"{SERVER_VARIABLE}={key}\n")
        yield name
    finally:
        Path(name).unlink(missing_ok=True)


def with_env_file(argv: list[str], env_file: str) -> list[str]:
    """ARGV with the placeholder of rank 0's --env-file replaced by ENV_FILE."""
    return [env_file if word == ENV_FILE_PLACEHOLDER else word for word in argv]


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
            f"{SERVER_VARIABLE} from {ENV_FILE_PLACEHOLDER}, a 0600 file removed once the rank "
            "started")
