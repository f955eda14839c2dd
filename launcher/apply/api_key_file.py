"""The API key of a run, in its file (API_KEY_FILE): found or created on the head, handed to
rank 0 as VLLM_API_KEY through a `docker run --env-file` written 0600 and removed once the
rank started, and read by the launcher's own requests (sent through curl's config on stdin).
Who needs it and how the run says so: launcher/plan/apikey.py.
"""

from __future__ import annotations

import errno
import os
import tempfile
from contextlib import contextmanager
from pathlib import Path

from launcher.plan.apikey import SERVER_VARIABLE, keyed
from launcher.plan.settings import refusal
from recipekit.apikey import KeyFileError, create_key, read_key


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
