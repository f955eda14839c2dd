"""Who a snapshot directory is: repo id and revision, from a Hugging Face cache path or options."""

import re
from dataclasses import dataclass

from .errors import UsageError

_COMMIT = re.compile(r"^[0-9a-f]{40}$")


@dataclass(frozen=True)
class Identity:
    name: str
    revision: str  # a commit hash, the --revision given, or "unknown"
    revision_source: str  # "hf-cache-path", "option" or "unknown"


def _from_cache_path(snapshot_dir):
    """(repo id, commit) for .../models--org--name/snapshots/<commit>, else (None, None)."""
    commit, snapshots, repo_folder = (
        snapshot_dir.name,
        snapshot_dir.parent,
        snapshot_dir.parent.parent,
    )
    if (
        snapshots.name != "snapshots"
        or not _COMMIT.match(commit)
        or not repo_folder.name.startswith("models--")
    ):
        return None, None
    return repo_folder.name[len("models--") :].replace("--", "/"), commit


def identify(snapshot_dir, name=None, revision=None):
    cached_name, cached_commit = _from_cache_path(snapshot_dir)
    if cached_commit and revision and not cached_commit.startswith(revision):
        raise UsageError(
            f"--revision {revision} contradicts the snapshot path {snapshot_dir} "
            f"(commit {cached_commit}); drop --revision or point at that revision's snapshot"
        )
    if cached_name and name and name != cached_name:
        raise UsageError(
            f"--name {name} contradicts the snapshot path {snapshot_dir} ({cached_name}); drop --name"
        )
    if cached_commit:
        return Identity(cached_name, cached_commit, "hf-cache-path")
    if revision:
        return Identity(name or snapshot_dir.name, revision, "option")
    return Identity(name or snapshot_dir.name, "unknown", "unknown")
