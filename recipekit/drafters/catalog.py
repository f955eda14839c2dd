"""The published drafters the launcher knows by key (DRAFTER=incoai | dflash2-g).

Revisions are None on purpose: the Hugging Face Hub is not reachable where this was
written, so no commit hash is known here. The launcher resolves the revision on first
fetch and pins it; prepare-drafter then reads it from the snapshot path.
"""

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class PublishedDrafter:
    key: str
    repo_id: str
    licence: str  # SPDX identifier
    licence_name: str  # as a person reads it
    non_commercial: bool
    revision: str | None


DRAFTERS = {
    "incoai": PublishedDrafter(
        key="incoai",
        repo_id="incoai/GLM-5.3-Flash-DFlash2",
        licence="CC-BY-NC-ND-4.0",
        licence_name="CC BY-NC-ND 4.0",
        non_commercial=True,
        revision=None,
    ),
    "dflash2-g": PublishedDrafter(
        key="dflash2-g",
        repo_id="canada-quant/GLM-5.3-Flash-DFlash2-G",
        licence="Apache-2.0",
        licence_name="Apache-2.0",
        non_commercial=False,
        revision=None,
    ),
}

DEFAULT_KEY = "incoai"


def by_repo_id(repo_id):
    """The published drafter with this repo id, or None."""
    for drafter in DRAFTERS.values():
        if drafter.repo_id == repo_id:
            return drafter
    return None


def as_json_list():
    return [asdict(drafter) for drafter in DRAFTERS.values()]
