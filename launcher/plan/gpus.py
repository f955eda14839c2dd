"""TP against the GPUs a node has: TP a multiple of the node count runs TP / nodes ranks on
every node, each on a GPU of its own, and a DGX Spark has one (GB10). When a run asks more
than one rank a node, every node's GPUs are counted (nvidia-smi --list-gpus) before any rank
starts, and too few are refused; DRY_RUN prints the count as a step."""

from __future__ import annotations

from launcher.apply.remote import Nodes
from launcher.plan.settings import Failed, refusal

GPU_LIST = ["nvidia-smi", "--list-gpus"]


def ranks_per_node(tp: str, node_count: int) -> int:
    return int(tp) // node_count


def count(listing: str) -> int:
    """The GPUs nvidia-smi --list-gpus lists: one `GPU N: NAME (UUID: ...)` line each."""
    return sum(1 for line in listing.splitlines() if line.startswith("GPU "))


def check(nodes: Nodes, tp: str) -> None:
    """Every node has TP / nodes GPUs; nothing to count at one rank a node."""
    node_count = len(nodes.addresses)
    wanted = ranks_per_node(tp, node_count)
    if wanted <= 1:
        return
    for index in range(node_count):
        listing = nodes.output(index, GPU_LIST)
        if listing is None:
            raise Failed(f"cannot count the GPUs on {nodes.label(index)} ({' '.join(GPU_LIST)} "
                         f"failed there); TP={tp} on {node_count} nodes needs {wanted} a node")
        found = count(listing)
        if found < wanted:
            raise refusal("TP", tp, f"{nodes.label(index)} has {found} GPU(s), but TP={tp} on "
                          f"{node_count} nodes runs {wanted} ranks a node, one a GPU; accepted: "
                          f"the node count {node_count} (a DGX Spark has one GPU), or empty")
