"""The drafter's licence, from the `license:` field of its model card's YAML front matter."""

import re
from dataclasses import dataclass

import yaml
from huggingface_hub.repocard import metadata_load

from .errors import Refused, UsageError

# Hub licence ids that are not Creative Commons, mapped to their SPDX identifier.
_SPDX_BY_HUB_ID = {
    "apache-2.0": "Apache-2.0",
    "mit": "MIT",
    "bsd-2-clause": "BSD-2-Clause",
    "bsd-3-clause": "BSD-3-Clause",
    "gpl-3.0": "GPL-3.0",
    "lgpl-3.0": "LGPL-3.0",
    "mpl-2.0": "MPL-2.0",
    "cc0-1.0": "CC0-1.0",
    "openrail": "OpenRAIL",
}

# cc-by[-nc][-sa|-nd]-<version>: the Creative Commons family as the Hub spells it.
_CREATIVE_COMMONS = re.compile(r"^cc-by((?:-(?:nc|sa|nd))*)-(\d+\.\d+)$")


@dataclass(frozen=True)
class Licence:
    spdx: str  # e.g. CC-BY-NC-ND-4.0, Apache-2.0; an unknown id is kept as written
    name: str  # e.g. "CC BY-NC-ND 4.0"
    non_commercial: bool
    recognised: bool  # False: the id is not one this tool knows; read its terms


def licence_from_id(hub_id):
    """Map a model card licence id (Hub spelling, case-insensitive) to a Licence."""
    text = str(hub_id).strip()
    lowered = text.lower()
    cc = _CREATIVE_COMMONS.match(lowered)
    if cc:
        elements = [part for part in cc.group(1).split("-") if part]
        suffix = "".join(f"-{part.upper()}" for part in elements)
        return Licence(
            spdx=f"CC-BY{suffix}-{cc.group(2)}",
            name=f"CC BY{suffix} {cc.group(2)}",
            non_commercial="nc" in elements,
            recognised=True,
        )
    if lowered in _SPDX_BY_HUB_ID:
        spdx = _SPDX_BY_HUB_ID[lowered]
        return Licence(spdx=spdx, name=spdx, non_commercial=False, recognised=True)
    # An unknown id: kept verbatim; "nc" as a word in it still marks it non-commercial.
    non_commercial = bool(re.search(r"(^|[-_ ])(nc|non-?commercial)([-_ ]|$)", lowered))
    return Licence(spdx=text, name=text, non_commercial=non_commercial, recognised=False)


def read_licence(snapshot_dir, fallback=None):
    """The licence named in README.md's front matter; `fallback` (an id) only if the card names none."""
    card = snapshot_dir / "README.md"
    value = None
    if card.is_file():
        try:
            metadata = metadata_load(card) or {}
        except (yaml.YAMLError, ValueError, UnicodeDecodeError) as error:
            first_line = str(error).splitlines()[0] if str(error) else type(error).__name__
            raise Refused(
                card,
                "front matter",
                first_line,
                "must be a YAML mapping",
                "fix the card or pass --licence ID",
            ) from None
        value = metadata.get("license")
        if value == "other":
            # The Hub's spelling for a custom licence: its name is in license_name.
            value = metadata.get("license_name") or value
    if value is None and fallback is not None:
        return licence_from_id(fallback)
    if not isinstance(value, str) or not value.strip():
        raise Refused(
            card,
            "license",
            value,
            "the model card's front matter must name the licence",
            "pass --licence ID if the licence is known from elsewhere",
        )
    licence = licence_from_id(value)
    if fallback is not None and licence_from_id(fallback).spdx != licence.spdx:
        raise UsageError(
            f"--licence {fallback} contradicts {card} (license: {value}); drop --licence"
        )
    return licence
