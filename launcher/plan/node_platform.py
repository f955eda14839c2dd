"""What the platform probe (launcher/platform_probe.py) read on a node: its document's parts,
one line a node, and what a lever changed between two readings. launcher/apply/probe_nodes.py
runs the probe on every node: in a rank's container when one runs there (`docker exec -i`),
through the image's own python3 and torch, else in a throwaway container of IMAGE with the
site's DOCKER_ARGS (what gives a container the GPU). The script travels on stdin, so an image
built before the probe existed runs it too. scripts/doctor --platform prints it, run.sh
prints it around memory compaction, and scripts/compare records it at the start and end of
every boot (compare/platform.py); the bench records it through scripts/doctor --platform
--json.
"""

from __future__ import annotations

from pathlib import Path

PROBE = Path(__file__).parent.parent / "platform_probe.py"
SCHEMA = "glm53-platform-nodes/1"
PARTS = ("bandwidth", "clocks", "memory", "fragmentation", "uptime")


def bandwidth(doc: dict) -> float | None:
    """A node document's read bandwidth in GB/s, or None when it was not measured."""
    value = (doc.get("bandwidth") or {}).get("gb_s")
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) \
        else None


def why_not(doc: dict, part: str) -> str:
    """Why a part of a node's document holds no reading."""
    return doc.get("why") or (doc.get(part) or {}).get("why") or "not measured"


def _gib(kib) -> str:
    return f"{kib / (1 << 20):.1f} GiB"


def _uptime(seconds: float) -> str:
    days, rest = divmod(int(seconds), 86400)
    return f"{days} d {rest // 3600} h" if days else f"{rest // 3600} h {rest % 3600 // 60} min"


def describe(doc: dict) -> str:
    """One node's reading in one line (what doctor, run.sh and compare print)."""
    if "why" in doc:
        return f"platform not measured: {doc['why']}"
    parts = []
    gb_s = bandwidth(doc)
    if gb_s is None:
        parts.append(f"bandwidth not measured ({why_not(doc, 'bandwidth')})")
    else:
        reading = doc["bandwidth"]
        parts.append(f"read {gb_s:.1f} GB/s ({reading.get('device', 'device unnamed')}, "
                     f"{reading.get('buffer_bytes', 0) >> 20} MiB buffer)")
    clock = doc["clocks"]
    if "sm_mhz" in clock:
        mem = f"{clock['mem_mhz']} MHz" if clock.get("mem_mhz") is not None else "n/a"
        locked = {True: "held at user-set values", False: "not locked"}.get(clock.get("locked"),
                                                                              "lock unknown")
        reasons = ", ".join(clock.get("reasons") or []) or "none"
        parts.append(f"SM {clock['sm_mhz']} of {clock.get('max_sm_mhz')} MHz, memory {mem}, "
                     f"clocks {locked}, clock-event reasons: {reasons}")
    else:
        parts.append(f"clocks not read ({clock.get('why')})")
    memory = doc["memory"]
    parts.append(f"MemAvailable {_gib(memory['available_kib'])}" if "available_kib" in memory
                 else f"memory not read ({memory.get('why')})")
    frag = doc["fragmentation"]
    if frag.get("high_order_share") is not None:
        parts.append(f"{frag['high_order_share'] * 100:.0f}% of {_gib(frag['free_kib'])} free in "
                     f"blocks of {frag['high_order_min_kib'] // 1024} MiB or more")
    else:
        parts.append(f"fragmentation not read ({frag.get('why', 'no free memory')})")
    uptime = doc["uptime"]
    parts.append(f"up {_uptime(uptime['seconds'])}" if "seconds" in uptime
                 else f"uptime not read ({uptime.get('why')})")
    return "; ".join(parts)


def label(doc: dict) -> str:
    return f"{doc['node']} ({doc['role']})"


def share(doc: dict) -> float | None:
    """The share of free memory in large blocks, or None."""
    value = (doc.get("fragmentation") or {}).get("high_order_share")
    return float(value) if isinstance(value, (int, float)) else None


def change(before: dict, after: dict) -> str:
    """What a lever did to a node, from its probe BEFORE and AFTER (one phrase)."""
    parts = []
    old, new = bandwidth(before), bandwidth(after)
    if old is None or new is None:
        missing = before if old is None else after
        parts.append(f"read bandwidth not compared ({why_not(missing, 'bandwidth')})")
    else:
        parts.append(f"read bandwidth {old:.1f} -> {new:.1f} GB/s "
                     f"({100.0 * (new / old - 1.0):+.1f}%)")
    old, new = share(before), share(after)
    if old is not None and new is not None:
        parts.append(f"free memory in 2 MiB blocks {old * 100:.0f}% -> {new * 100:.0f}%")
    return "; ".join(parts)
