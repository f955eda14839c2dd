"""Turn a drafter snapshot into the directory vLLM serves, and say what it is in one summary."""

import json
import os
from pathlib import Path

from . import catalog
from .config import FULL, SLIDING, load_config, read_shape, served_config
from .engine import causality_rule, find_vllm_root
from .errors import Refused, UsageError
from .licence import read_licence
from .mask_reader import read_mask_embedding
from .mask_writer import write_mask_embedding
from .output_dir import write_out
from .snapshot import identify
from .weights import drafter_embedding_holds_mask_row, weight_files

DEFAULT_WINDOW = 2048  # the window incoai's sliding drafter is published with (its model card)
MASK_FILE = "mask_embedding.pt"
DERIVED_FILES = ("config.json", MASK_FILE)
# Where vLLM takes the mask token's embedding row from (summary "mask_source").
MASK_SOURCES = {
    MASK_FILE: MASK_FILE,
    "drafter-embedding": "the drafter's embedding table",
    "target-embedding": "the target's embedding table",
}


def _plural(count, word):
    return f"{count} {word}" if count == 1 else f"{count} {word}s"


def startup_phrase(name, licence, shape, window, mask_source):
    terms = licence.name
    if licence.non_commercial:
        terms += ", non-commercial"
    if not licence.recognised:
        terms += ", licence not recognised: read its terms"
    if shape.layer_kind == SLIDING:
        layers = f"{_plural(shape.layers, 'sliding layer')}, window {window}"
    else:
        layers = (
            f"{_plural(shape.layers, 'full-attention layer')} served at a {window}-token window"
        )
    causal = "causal" if shape.causal else "non-causal"
    return f"{name} ({terms}), {layers}, {causal}, mask row from {MASK_SOURCES[mask_source]}"


def target_vocabulary(target_config, shape):
    """(vocabulary size, where it was read): the target's config.json, else the drafter's own
    vocab_size (a drafter that shares the target's embedding is built for its vocabulary)."""
    if target_config is None:
        return shape.vocab_size, "the drafter's config.json vocab_size"
    path = Path(target_config)
    if path.is_dir():
        path = path / "config.json"
    try:
        raw = load_config(path)
    except Refused as refusal:
        raise UsageError(f"--target-config {target_config}: {refusal}") from None
    vocab = raw.get("vocab_size") or (raw.get("text_config") or {}).get("vocab_size")
    if not isinstance(vocab, int) or isinstance(vocab, bool) or vocab < 1:
        raise UsageError(f"--target-config {path}: no positive vocab_size (nor text_config.vocab_size)")
    return vocab, str(path)


def prepare(
    snapshot_dir, out, window=None, name=None, revision=None, licence_id=None,
    vllm_root=None, target_config=None,
):
    """Validate everything first, then write `out`; return the summary (the --json object)."""
    snapshot_dir, out = Path(os.path.abspath(snapshot_dir)), Path(os.path.abspath(out))
    if not snapshot_dir.is_dir():
        raise UsageError(f"{snapshot_dir} is not a directory; pass the drafter snapshot directory")
    if window is not None and window < 1:
        raise UsageError(f"--window {window} must be a positive number of tokens")
    identity = identify(snapshot_dir, name, revision)

    engine_root = find_vllm_root(vllm_root)
    rule = causality_rule(engine_root)
    config_path = snapshot_dir / "config.json"
    raw = load_config(config_path)
    shape = read_shape(config_path, raw, rule.reads_is_causal)

    licence = read_licence(snapshot_dir, licence_id)
    published = catalog.by_repo_id(identity.name)
    if published and licence.spdx != published.licence:
        raise Refused(
            snapshot_dir / "README.md",
            "license",
            licence.spdx,
            f"{published.repo_id} is published under {published.licence_name}",
            "check that this snapshot is the published drafter",
        )

    weights = weight_files(snapshot_dir)
    mask = None
    if (snapshot_dir / MASK_FILE).exists():
        mask = read_mask_embedding(snapshot_dir / MASK_FILE, shape.hidden_size)
        if mask.mask_token_id is not None and mask.mask_token_id != shape.mask_token_id:
            raise Refused(
                snapshot_dir / MASK_FILE,
                "mask_token_id",
                mask.mask_token_id,
                f"must equal config.json's mask token {shape.mask_token_id}",
                "the mask file belongs to another drafter",
            )
        mask_source = MASK_FILE
    elif drafter_embedding_holds_mask_row(weights, shape.mask_token_id, shape.hidden_size):
        mask_source = "drafter-embedding"
    else:
        # No table and no mask file: vLLM's DFlash loader shares the target's embedding.
        vocab, vocab_from = target_vocabulary(target_config, shape)
        if not shape.mask_token_id < vocab:
            raise Refused(
                config_path,
                "mask_token_id",
                shape.mask_token_id,
                f"must lie inside the target's vocabulary, 0 to {vocab - 1} ({vocab_from}): the "
                "drafter ships no embedding table and no mask_embedding.pt, so its mask row is the target's",
                "use a drafter that ships one of the two, or the target it was trained for",
            )
        mask_source = "target-embedding"

    notes = []
    if engine_root is None:
        notes.append(
            "no vLLM here to read the causality rule from; resolved as vLLM with DFlash2 does "
            "(top-level is_causal first); pass --vllm-root to read the serving engine's own rule"
        )
    if shape.window is not None:
        if window is not None and window != shape.window:
            # --window is the window for full-attention layers; this drafter has none.
            notes.append(
                f"--window {window} applies to full-attention layers only; "
                f"{identity.name} keeps the window its config gives, {shape.window}"
            )
        served_window = shape.window
    else:
        served_window = window if window is not None else DEFAULT_WINDOW

    derived = served_config(
        raw,
        shape,
        served_window,
        {
            "tool": "scripts/prepare-drafter",
            "source": str(snapshot_dir),
            "source_name": identity.name,
            "source_revision": identity.revision,
            "window": served_window,
        },
    )
    summary = {
        "drafter": identity.name,
        "licence": licence.spdx,
        "licence_name": licence.name,
        "licence_recognised": licence.recognised,
        "non_commercial": licence.non_commercial,
        "layers": shape.layers,
        "full_attention_layers": shape.layers if shape.layer_kind == FULL else 0,
        "sliding_layers": shape.layers if shape.layer_kind == SLIDING else 0,
        "taps": list(shape.taps),
        "window": served_window,
        "window_added": shape.window is None,
        "causal": shape.causal,
        "causal_rule": rule.describe(),
        "mask_token_id": shape.mask_token_id,
        "mask_source": mask_source,
        "revision": identity.revision,
        "revision_source": identity.revision_source,
        "source": str(snapshot_dir),
        "out": str(out),
        "startup": startup_phrase(identity.name, licence, shape, served_window, mask_source),
        "notes": notes,
    }

    def build(tmp):
        entries = []
        for entry in sorted(snapshot_dir.iterdir()):
            if entry.name.startswith(".") or entry.name in DERIVED_FILES:
                continue  # dot entries are download caches, not the model
            os.symlink(entry, tmp / entry.name)
            entries.append(entry.name)
        (tmp / "config.json").write_text(json.dumps(derived, indent=2) + "\n", encoding="utf-8")
        entries.append("config.json")
        if mask:
            write_mask_embedding(tmp / MASK_FILE, mask, shape.mask_token_id, identity.revision)
            entries.append(MASK_FILE)
        return entries

    write_out(out, snapshot_dir, build, summary)
    return summary
