"""The API key file, for the launcher that writes it and every client here that reads it.

The key lives in one file readable by its owner alone (mode 0600), at API_KEY_FILE
(recipe.toml; its default, relative to the repository, is what clients read when told
nothing else). A file others may read is refused, as ssh refuses a loose private key. The
key itself is never printed: every message names the file, never its content.

Clients (bench/, scripts/doctor, scripts/compare) find their key by `client_key`: an
explicit --api-key-file first, then OPENAI_API_KEY (as OpenAI's own clients), then the
default file when it exists, else none (a server run with API_AUTH=none wants none).

Standard library only: the bench and the launcher both import it, and it imports neither.
"""

from __future__ import annotations

import os
import secrets
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from recipekit import recipe

# 32 random bytes, URL-safe base64: 43 characters, nothing a shell or a header would mangle.
KEY_BYTES = 32
ENV_NAME = "OPENAI_API_KEY"


class KeyFileError(Exception):
    """A key file that cannot be used: PATH and WHY (what is wrong, then what to do), which
    read as one line."""

    def __init__(self, path: Path, why: str):
        super().__init__(f"{path} {why}")
        self.path, self.why = path, why


def default_key_file(the_recipe=None) -> Path:
    """API_KEY_FILE's default, taken from the repository as the launcher takes it."""
    the_recipe = the_recipe or recipe.load()
    path = Path(the_recipe.knobs["API_KEY_FILE"].default)
    return path if path.is_absolute() else recipe.REPO / path


def loose_mode(path: Path) -> int | None:
    """The mode bits of PATH when group or others may do anything with it, else None."""
    mode = stat.S_IMODE(path.stat().st_mode)
    return mode if mode & 0o077 else None


def read_key(path: Path) -> str:
    """The key in PATH: a regular file of this user's, mode 0600 or tighter, one line."""
    try:
        info = path.stat()
    except FileNotFoundError:
        raise KeyFileError(path, "does not exist; ./run.sh writes it on its first run "
                           "(API_AUTH=key), or pass the file the server's key is in") from None
    except OSError as error:
        raise KeyFileError(path, f"cannot be read ({error.strerror})") from None
    if not stat.S_ISREG(info.st_mode):
        raise KeyFileError(path, "is not a regular file")
    if mode := loose_mode(path):
        raise KeyFileError(path, f"has mode {mode:04o}: others can read the API key; run "
                           f"chmod 600 {path} (or delete it, and ./run.sh writes a new key)")
    if info.st_uid != os.geteuid():
        raise KeyFileError(path, f"belongs to uid {info.st_uid}, not to this user "
                           f"({os.geteuid()}); the key file must be its owner's alone")
    try:
        key = path.read_text(encoding="ascii").strip()
    except (OSError, UnicodeDecodeError):
        raise KeyFileError(path, "cannot be read as one line of text") from None
    if not key or any(char.isspace() or not char.isprintable() for char in key):
        raise KeyFileError(path, "does not hold one key on one line; delete it, and "
                           "./run.sh writes a new one")
    return key


def create_key(path: Path) -> str:
    """A new random key written to PATH, created 0600 (never over an existing file)."""
    key = secrets.token_urlsafe(KEY_BYTES)
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "w", encoding="ascii") as file:
        file.write(key + "\n")
    return key


@dataclass(frozen=True)
class ClientKey:
    """The key a client sends (None: none) and where it came from, for its messages."""
    value: str | None
    source: str

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.value}"} if self.value else {}

    def unauthorized(self, url: str) -> str:
        """The one line a 401 from URL is reported in."""
        if self.value is None:
            return (f"{url} answered 401 Unauthorized: the server wants an API key and none was "
                    f"sent ({self.source}); pass --api-key-file with the server's key file "
                    f"(./run.sh writes {default_key_file()}) or set {ENV_NAME}")
        return (f"{url} answered 401 Unauthorized: the key from {self.source} is not the "
                "server's; pass --api-key-file with the file the server was started with "
                "(API_KEY_FILE)")


def client_key(api_key_file: str | None, environ: Mapping[str, str] | None = None) -> ClientKey:
    """The key a client sends: API_KEY_FILE given (--api-key-file), else OPENAI_API_KEY,
    else the default file when it exists, else none. KeyFileError for a file given or
    found that cannot be used."""
    environ = os.environ if environ is None else environ
    if api_key_file:
        path = Path(api_key_file)
        return ClientKey(read_key(path), str(path))
    if environ.get(ENV_NAME):
        return ClientKey(environ[ENV_NAME], ENV_NAME)
    default = default_key_file()
    if default.exists():
        return ClientKey(read_key(default), str(default))
    return ClientKey(None, f"no --api-key-file, no {ENV_NAME}, no {default}")


def add_client_argument(parser) -> None:
    """--api-key-file on a client's argparse parser."""
    parser.add_argument("--api-key-file", metavar="FILE",
                        help=f"the API key's file (default: ${ENV_NAME} when set, else "
                             f"{default_key_file()} when it exists, else no key)")
