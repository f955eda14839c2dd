"""What the launcher needs to know about a published drafter before fetching it.

python3 drafter_info.py KEY WINDOW prints `repo_id=`, `revision=` and `startup=` lines.
The repo id, licence and pin come from recipekit/drafters/catalog.py; the start-up
phrase for DRY_RUN is built here from the catalog's licence and the published layer
shapes (REFERENCE.md), because DRY_RUN has no weights for prepare-drafter to read.
A real run prints prepare-drafter's own phrase instead.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from recipekit.drafters import catalog

# Published shapes (REFERENCE.md drafter table): layers, attention, native window,
# causality as our v9 image resolves it (incoai's top-level is_causal: false is honoured),
# and where the mask token's embedding row comes from. Without weights DRY_RUN cannot tell
# whether incoai's snapshot ships its own table or shares the target's; a real run says.
_PUBLISHED_SHAPES = {
    "incoai/GLM-5.3-Flash-DFlash2": (5, "sliding", 2048, "non-causal", "an embedding table"),
    "canada-quant/GLM-5.3-Flash-DFlash2-G": (8, "full", None, "non-causal", "mask_embedding.pt"),
}


def startup_phrase(drafter, window):
    """prepare-drafter's phrase for this drafter, from the catalog and its published shape."""
    terms = drafter.licence_name
    if drafter.non_commercial:
        terms += ", non-commercial"
    layers, attention, native_window, causality, mask_row = _PUBLISHED_SHAPES[drafter.repo_id]
    if attention == "full":
        shape = f"{layers} full-attention layers served at a {window}-token window"
    else:
        shape = f"{layers} sliding layers, window {native_window}"
    return f"{drafter.repo_id} ({terms}), {shape}, {causality}, mask row from {mask_row}"


def main(argv):
    key, window = argv[1], int(argv[2])
    drafter = catalog.DRAFTERS.get(key)
    if drafter is None:
        known = " | ".join(sorted(catalog.DRAFTERS))
        print(f"refused: DRAFTER={key}: accepted: {known} | an absolute path", file=sys.stderr)
        return 2
    print(f"repo_id={drafter.repo_id}")
    print(f"revision={drafter.revision or ''}")
    print(f"startup={startup_phrase(drafter, window)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
