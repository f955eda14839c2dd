"""The published drafters the launcher knows by key (DRAFTER=incoai | dflash2-g).

A revision is the commit a verified run used (the seed's PR #1 deployment);
None where no run pinned one, and the launcher then resolves it on first fetch and records
it. prepare-drafter reads the revision from the snapshot path.
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
        revision="7d74cdd881ed7e32c31175984a67823127b66cfe",
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
