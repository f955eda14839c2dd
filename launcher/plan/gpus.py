"""TP against the GPUs a node has: TP a multiple of the node count runs TP / nodes ranks on
every node, each on a GPU of its own, and a DGX Spark has one (GB10). When a run asks more
than one rank a node, every node's GPUs are counted (nvidia-smi --list-gpus, the plan's
count_gpus) before any rank starts, and too few are refused (judge); DRY_RUN prints the count
as a step."""

from __future__ import annotations

from launcher.plan.settings import Failed, refusal


def ranks_per_node(tp: str, node_count: int) -> int:
    return int(tp) // node_count


def count(listing: str) -> int:
    """The GPUs nvidia-smi --list-gpus lists: one `GPU N: NAME (UUID: ...)` line each."""
    return sum(1 for line in listing.splitlines() if line.startswith("GPU "))


def judge(listing: str | None, where: str, tp: str, node_count: int) -> None:
    """A node's listing (None: the count failed there) against the TP / nodes GPUs it needs."""
    wanted = ranks_per_node(tp, node_count)
    if listing is None:
        raise Failed(f"cannot count the GPUs on {where} (nvidia-smi --list-gpus failed there); "
                     f"TP={tp} on {node_count} nodes needs {wanted} a node")
    found = count(listing)
    if found < wanted:
        raise refusal("TP", tp, f"{where} has {found} GPU(s), but TP={tp} on {node_count} "
                      f"nodes runs {wanted} ranks a node, one a GPU; accepted: the node count "
                      f"{node_count} (a DGX Spark has one GPU), or empty")
