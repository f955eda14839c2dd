"""TP against the model's attention heads, where the model's config is on the head: a local
MODEL directory, or MODEL's snapshot in HF_CACHE (at MODEL_REVISION when pinned). vLLM
splits the attention heads evenly over the TP ranks, so TP must divide them (and the KV
heads, or be a multiple of them: a KV head is then replicated); a config not on the head yet
(the first run downloads it) is not read, and vLLM checks it when the ranks start."""

from __future__ import annotations

import json
from pathlib import Path

from launcher.plan.checks import Checked
from launcher.plan.settings import refusal

# The config keys of the head counts (a multimodal config nests them under text_config).
ATTENTION, KV = "num_attention_heads", "num_key_value_heads"


def config_files(checked: Checked) -> list[Path]:
    """The model's config.json files readable on the head (none: nothing to check)."""
    model = checked["MODEL"]
    if model.startswith("/"):
        candidates = [Path(model) / "config.json"]
    else:
        snapshots = Path(checked["HF_CACHE"]) / "hub" / f"models--{model.replace('/', '--')}" / "snapshots"
        revision = checked["MODEL_REVISION"]
        candidates = ([snapshots / revision / "config.json"] if revision else
                      sorted(snapshots.glob("*/config.json")))
    return [path for path in candidates if path.is_file()]


def head_counts(config: dict) -> dict[str, int]:
    """num_attention_heads and num_key_value_heads of CONFIG (or of its text_config)."""
    counts = {}
    for table in (config, config.get("text_config") or {}):
        for key in (ATTENTION, KV):
            if isinstance(table.get(key), int) and table[key] > 0:
                counts.setdefault(key, table[key])
    return counts


def splits(tp: int, key: str, heads: int) -> bool:
    if key == KV and heads < tp:
        return tp % heads == 0  # each KV head replicated on tp / heads ranks
    return heads % tp == 0


def check(checked: Checked) -> None:
    tp, node_count = int(checked["TP"]), len(checked.nodes)
    for path in config_files(checked):
        try:
            counts = head_counts(json.loads(path.read_text()))
        except (OSError, ValueError, AttributeError):
            continue  # not a config this check can read; vLLM reads it at start
        for key, heads in counts.items():
            if splits(tp, key, heads):
                continue
            most = max(counts.values())
            fits = [str(n) for n in range(node_count, most + 1, node_count)
                    if all(splits(n, k, h) for k, h in counts.items())]
            accepted = (f"a multiple of the node count {node_count} that splits them: "
                        f"{' | '.join(fits)}" if fits else
                        f"none with {node_count} nodes; use a node count that divides {most}")
            raise refusal("TP", str(tp), f"{path} has {key} {heads}, which TP={tp} does not "
                          f"split evenly over its ranks; accepted: {accepted}")
