"""recipe.lock: the base images a host trusted, by image ID, in a file beside recipe.toml.

Trust on first use, as SSH's known_hosts or Cargo.lock: the first build on a host records
the vendor image's ID (the sha256 of its config: the same pulled or `docker load`ed) and its
registry digest when it has one; from then on scripts/build.sh and ./run.sh refuse the tag
once it names another image, until `scripts/build.sh --accept-base` rewrites the entry.
BASE_LOCK=strict records nothing on first use. Only tools write this file, and recipe.toml is
never edited by one. The repository ships no lock (it is git-ignored; a site that wants to
share its lock commits it with `git add -f recipe.lock`).

Standard library only: the launcher reads the lock with the host's python3, the build with
its tool environment.
"""

from __future__ import annotations

import fcntl
import os
import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import tomllib

REPO = Path(__file__).resolve().parent.parent
FIRST_USE, STRICT = "first-use", "strict"  # BASE_LOCK's choices (recipe.toml)
# scripts/build.sh's exit status when it refused the base before building anything; its one
# line is then the refusal (run.sh relays it as its own).
BASE_REFUSED_EXIT = 4
IMAGE_ID = re.compile(r"sha256:[0-9a-f]{64}")
DIGEST = re.compile(r"(sha256:[0-9a-f]{64})?")
FIELDS = ("image_id", "digest", "recorded", "how")
# Trusted.how: recorded by a build on first use, or accepted by --accept-base
HOW_FIRST_USE, HOW_ACCEPTED = "first use", "accepted"
HEADER = """\
# The base images this host trusted, by image ID (docs/images.md: the vendor image).
# Written by scripts/build.sh: the first build records the vendor image (trust on first use),
# --accept-base rewrites an entry. A build or ./run.sh refuses a tag that names another image
# than its entry. Commit this file (git add -f recipe.lock) to share it with other hosts.
"""


class LockError(Exception):
    """recipe.lock cannot be read or written: one line naming the file and what to do."""


@dataclass(frozen=True)
class Trusted:
    """One base image a host trusted: its ID, its registry digest ("" when it had none, as a
    loaded image), when, and how (on first use, or accepted by --accept-base)."""
    image_id: str
    digest: str
    recorded: str
    how: str


def lock_path(recipe_path: Path) -> Path:
    """The lock of the recipe at RECIPE_PATH: beside it, recipe.toml -> recipe.lock."""
    return recipe_path.with_suffix(".lock")


def shown(path: Path) -> str:
    """PATH as a message names it: relative to the repository when inside it."""
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path)


def accept_command(ref: str, vendor: str) -> str:
    """The command that records REF's current image ID (the vendor image is the default base)."""
    return "scripts/build.sh --accept-base" + ("" if ref == vendor else f" --base {ref}")


def utc_now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


@dataclass
class BaseLock:
    path: Path
    images: dict[str, Trusted]

    @classmethod
    def read(cls, path: Path) -> "BaseLock":
        """The lock at PATH; none there is an empty lock (nothing trusted yet)."""
        try:
            with path.open("rb") as handle:
                data = tomllib.load(handle)
        except FileNotFoundError:
            return cls(path, {})
        except (OSError, tomllib.TOMLDecodeError) as error:
            raise LockError(f"{shown(path)}: {error}; fix it, or delete it to trust the base images "
                            "there again on the next build") from None
        images = {}
        if not isinstance(data.get("images", {}), dict):
            raise LockError(f"{shown(path)}: images = {data['images']!r} is not a table; accepted: "
                            '[images."REF"] tables as scripts/build.sh writes them; fix it, or '
                            "delete the file to trust the base images there again on the next build")
        for ref, entry in data.get("images", {}).items():
            if not isinstance(entry, dict):
                raise LockError(f'{shown(path)}: [images."{ref}"] is not a table')
            trusted = Trusted(*(str(entry.get(name, "")) for name in FIELDS))
            if not IMAGE_ID.fullmatch(trusted.image_id) or not DIGEST.fullmatch(trusted.digest):
                raise LockError(f'{shown(path)}: [images."{ref}"] image_id = "{trusted.image_id}", '
                                f'digest = "{trusted.digest}": accepted: sha256:<64 hex> (the digest '
                                "may be empty); fix the entry, or delete it and accept the image again "
                                "with scripts/build.sh --accept-base")
            images[ref] = trusted
        return cls(path, images)

    def moved(self, ref: str, image_id: str, vendor: str) -> str:
        """Why REF, whose tag names IMAGE_ID on this host ("" when it is not here), is refused
        because the lock trusted another image for it; "" when it is not."""
        trusted = self.images.get(ref)
        if trusted is None or not image_id or trusted.image_id == image_id:
            return ""
        return (f"{shown(self.path)} records {trusted.image_id}, but the tag now names {image_id} "
                f"(it moved); check what changed, then accept it with {accept_command(ref, vendor)}")

    def unrecorded(self, ref: str, image_id: str, mode: str, vendor: str) -> str:
        """Why a build may not record REF on first use (BASE_LOCK=strict); "" when it may, or
        when the lock already holds it."""
        if mode != STRICT or ref in self.images:
            return ""
        names = f", whose tag names {image_id} here," if image_id else ""
        return (f"{shown(self.path)} records no image ID for {ref}{names} and BASE_LOCK=strict "
                "records none on first use; check the image, then record it with "
                f"{accept_command(ref, vendor)} (or commit the site's {self.path.name})")

    def record(self, ref: str, image_id: str, digest: str, how: str) -> Trusted:
        """REF trusted as IMAGE_ID from now on: its entry added or rewritten, the others kept;
        the file is replaced whole, never left half-written. Taken under a file lock, on the
        lock as it is then (not as this object read it), so two builds recording at once both
        keep their entries. A first use that another build recorded meanwhile keeps that entry
        when it names the same image, and is refused when it names another."""
        if not IMAGE_ID.fullmatch(image_id) or not DIGEST.fullmatch(digest):
            raise LockError(f"{shown(self.path)}: {ref}: {image_id!r} / {digest!r} is not an image ID "
                            "(sha256:<64 hex>) and a digest")
        with _held(self.path):
            images = BaseLock.read(self.path).images
            earlier = images.get(ref)
            if how == HOW_FIRST_USE and earlier is not None:
                if earlier.image_id != image_id:
                    raise LockError(f"{shown(self.path)}: another build recorded {ref} as "
                                    f"{earlier.image_id} while this one found {image_id}; run the "
                                    "build again (it checks the tag against that entry)")
                self.images = images
                return earlier
            trusted = Trusted(image_id, digest, utc_now(), how)
            images = {**images, ref: trusted}
            _write(self.path, images)
        self.images = images
        return trusted


@contextmanager
def _held(path: Path) -> Iterator[None]:
    """An exclusive flock on the lock's folder (the lock file itself is replaced by each write,
    so a lock on it would not hold across writers) for as long as the block runs."""
    try:
        folder = os.open(path.parent, os.O_RDONLY)
    except OSError as error:
        raise LockError(f"cannot open {shown(path.parent)} to lock {path.name} ({error.strerror}); "
                        "nothing was recorded") from None
    try:
        fcntl.flock(folder, fcntl.LOCK_EX)
        yield
    finally:
        os.close(folder)  # closing releases the flock


def _write(path: Path, images: dict[str, Trusted]) -> None:
    lines = [HEADER]
    for name, entry in sorted(images.items()):
        lines.append(f"\n[images.{_quoted(name)}]\n")
        lines += [f"{field} = {_quoted(getattr(entry, field))}\n" for field in FIELDS]
    staged = path.with_name(f".{path.name}.{os.getpid()}")
    try:
        staged.write_text("".join(lines), encoding="utf-8")
        staged.replace(path)
    except OSError as error:
        staged.unlink(missing_ok=True)
        raise LockError(f"cannot write {shown(path)} ({error.strerror}); nothing was "
                        "recorded") from None


def _quoted(text: str) -> str:
    """TEXT as a TOML basic string (image references and IDs: no control characters)."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'
