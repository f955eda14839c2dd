"""Unified-memory facts of a node before a boot: vm.swappiness, MemAvailable, other GPU containers.

On GB10 the GPU's memory is the host's: a boot that starts short of it swaps or wedges the
host, and another container holding the GPU takes from the same pool. run.sh reads these
facts on every node before the ranks start and refuses under MEM_BOOT_FLOOR_GIB (unless
FORCE_UNSAFE_BOOT_MEMORY=1); scripts/doctor reports them.
"""

from __future__ import annotations

from dataclasses import dataclass

from launcher.plan.data import rank_container

# POSIX sh, run as: sh -c SCRIPT memory-preflight (the plan's memory_facts). Prints
# "swappiness N", "mem <kB>" and one "gpu NAME" per running container that asked Docker for
# GPUs. Test seams: GLM53_MEMINFO (as the memory guard's) and GLM53_SWAPPINESS name files
# read instead of the kernel's.
_STATEMENTS = (
    'meminfo=${GLM53_MEMINFO:-/proc/meminfo}',
    'swappiness=${GLM53_SWAPPINESS:-/proc/sys/vm/swappiness}',
    'printf "swappiness %s\\n" "$(cat "$swappiness" 2>/dev/null || echo unknown)"',
    "awk '/^MemAvailable:/ { print \"mem\", $2 }' \"$meminfo\"",
    'for id in $(docker ps --quiet); do docker inspect --format '
    "'{{.Name}} {{json .HostConfig.DeviceRequests}}' \"$id\"; done "
    "| awk '/\"gpu\"/ { sub(/^\\//, \"\", $1); print \"gpu\", $1 }'",
)
SCRIPT = "; ".join(_STATEMENTS)
KIB_PER_GIB = 1 << 20


@dataclass
class NodeMemory:
    swappiness: str = "unknown"
    available_kib: int | None = None
    gpu_containers: tuple[str, ...] = ()

    @property
    def available_gib(self) -> float | None:
        return None if self.available_kib is None else self.available_kib / KIB_PER_GIB


def parse(text: str | None) -> NodeMemory | None:
    """The facts SCRIPT printed on a node (None: it could not run there, nor facts)."""
    if text is None:
        return None
    facts, gpus = NodeMemory(), []
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if key == "swappiness":
            facts.swappiness = value.strip() or "unknown"
        elif key == "mem" and value.strip().isdigit():
            facts.available_kib = int(value)
        elif key == "gpu" and value.strip():
            gpus.append(value.strip())
    facts.gpu_containers = tuple(gpus)
    return facts


def others(facts: NodeMemory) -> tuple[str, ...]:
    """GPU containers that are not this launcher's ranks."""
    ours = {rank_container(i) for i in range(16)}
    return tuple(name for name in facts.gpu_containers if name not in ours)


def describe(facts: NodeMemory) -> str:
    available = "unknown" if facts.available_gib is None else f"{facts.available_gib:.1f} GiB"
    swappiness = facts.swappiness + ("" if facts.swappiness in ("0", "unknown") else
                                     " (GB10 recipes run 0: swapping unified memory stalls the GPU)")
    gpu = ", ".join(others(facts)) or "none"
    return f"vm.swappiness {swappiness}, MemAvailable {available}, other GPU containers: {gpu}"
