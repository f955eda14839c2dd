"""Which drafter a run serves: its repo and pin from the catalog, or a local directory.

The start-up phrase for DRY_RUN is built here from the catalog's licence and the published
layer shapes (the drafters' model cards), because DRY_RUN has no weights for
prepare-drafter to read; a real run prints prepare-drafter's own phrase instead.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from launcher.plan.settings import Refused, refusal
from recipekit.drafters import catalog

# Published shapes (the model cards): layers, attention, native window, causality as our
# v9 image resolves it (incoai's top-level is_causal: false is honoured), and where the mask
# token's embedding row comes from. Without weights DRY_RUN cannot tell whether incoai's
# snapshot ships its own table or shares the target's; a real run says.
_PUBLISHED_SHAPES = {
    "incoai/GLM-5.3-Flash-DFlash2": (5, "sliding", 2048, "non-causal", "an embedding table"),
    "canada-quant/GLM-5.3-Flash-DFlash2-G": (8, "full", None, "non-causal", "mask_embedding.pt"),
}
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


@dataclass(frozen=True)
class Drafter:
    """DRAFTER resolved: a catalog key (repo id, catalog pin) or a local directory."""
    setting: str
    repo_id: str
    catalog_revision: str
    phrase: str

    @property
    def local(self) -> bool:
        return self.setting.startswith("/")


def startup_phrase(drafter: catalog.PublishedDrafter, window: int) -> str:
    """prepare-drafter's phrase for this drafter, from the catalog and its published shape."""
    terms = drafter.licence_name + (", non-commercial" if drafter.non_commercial else "")
    layers, attention, native_window, causality, mask_row = _PUBLISHED_SHAPES[drafter.repo_id]
    if attention == "full":
        shape = f"{layers} full-attention layers served at a {window}-token window"
    else:
        shape = f"{layers} sliding layers, window {native_window}"
    return f"{drafter.repo_id} ({terms}), {shape}, {causality}, mask row from {mask_row}"


def sliding(drafter: Drafter | None) -> bool:
    """Whether DRAFTER is a published drafter with sliding-window layers (it keeps its own
    window); False for a full-attention one and a local directory (unknown until read)."""
    shape = _PUBLISHED_SHAPES.get(drafter.repo_id) if drafter else None
    return bool(shape) and shape[1] == "sliding"


def describe(setting: str, window: str) -> Drafter:
    """DRAFTER as the launcher serves it; an unknown key or a bad path is refused."""
    if setting.startswith("/"):
        if "," in setting or _CONTROL.search(setting):
            keys = ", ".join(catalog.DRAFTERS)
            raise refusal("DRAFTER", setting, f"accepted: a catalog key ({keys}) or an absolute "
                          "path without commas")
        return Drafter(setting, setting, "", f"{setting} (local; prepare-drafter reads its "
                       "licence from the model card)")
    published = catalog.DRAFTERS.get(setting)
    if published is None:
        known = " | ".join(sorted(catalog.DRAFTERS))
        raise Refused(f"refused: DRAFTER={setting}: accepted: {known} | an absolute path")
    return Drafter(setting, published.repo_id, published.revision or "",
                   startup_phrase(published, int(window)))


def cksum(data: bytes) -> int:
    """POSIX cksum's CRC of DATA (what `printf %s DATA | cksum` prints first)."""
    crc = 0
    for byte in data + _length_bytes(len(data)):
        crc ^= byte << 24
        for _ in range(8):
            crc = ((crc << 1) ^ 0x04C11DB7) if crc & 0x80000000 else (crc << 1)
            crc &= 0xFFFFFFFF
    return ~crc & 0xFFFFFFFF


def _length_bytes(length: int) -> bytes:
    out = bytearray()
    while length:
        out.append(length & 0xFF)
        length >>= 8
    return bytes(out)
