"""The platform probe (launcher/platform_probe.py) run on every node, and what it read.

Where a rank's container runs, the probe runs inside it (`docker exec -i`), through the
image's own python3 and torch; where none runs, in a throwaway container of IMAGE with the
site's DOCKER_ARGS (what gives a container the GPU). The script travels on stdin, so an
image built before the probe existed runs it too. scripts/doctor --platform prints it,
run.sh prints it around memory compaction (launcher/host_levers.py), and scripts/compare
records it at the start and end of every boot (compare/platform.py); the bench
records it through scripts/doctor --platform --json.
"""

from __future__ import annotations

import datetime
import json
import subprocess
from pathlib import Path

from launcher.plan import plan
from launcher.apply.remote import Nodes

PROBE = Path(__file__).parent.parent / "platform_probe.py"
SCHEMA = "glm53-platform-nodes/1"
# torch's import and CUDA context take seconds on a GB10; the read kernel under one
PROBE_TIMEOUT_S = 180
PARTS = ("bandwidth", "clocks", "memory", "fragmentation", "uptime")


def _last_line(text: str) -> str:
    lines = [line.strip() for line in (text or "").splitlines() if line.strip()]
    return lines[-1] if lines else ""


def run_probe(nodes: Nodes, index: int, argv: list[str], via: str) -> dict:
    """The probe's document for node INDEX, labelled with where it ran; a probe that could
    not run is {"node", "via", "why"}, its own last line of error as the reason."""
    where = {"node": nodes.addresses[index], "role": "head" if index == 0 else f"worker {index}",
             "via": via}
    try:
        with PROBE.open("rb") as script:
            done = subprocess.run(nodes.argv(index, argv), stdin=script, capture_output=True,
                                  timeout=PROBE_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        return {**where, "why": f"the probe did not finish within {PROBE_TIMEOUT_S} s"}
    except OSError as error:
        return {**where, "why": f"cannot run {argv[0]}: {error.strerror}"}
    stdout = done.stdout.decode(errors="replace")
    if done.returncode != 0:
        why = _last_line(done.stderr.decode(errors="replace")) or f"exit {done.returncode}"
        return {**where, "why": f"the probe failed ({why})"}
    try:
        doc = json.loads(_last_line(stdout))
    except ValueError:
        doc = None
    if not isinstance(doc, dict) or not all(isinstance(doc.get(part), dict) for part in PARTS):
        return {**where, "why": f"the probe printed no report: {_last_line(stdout)[:160]!r}"}
    return {**where, **doc}


def rank_running(nodes: Nodes, index: int) -> bool:
    return nodes.output(index, plan.container_status_argv(index)) == "running"


def read_node(nodes: Nodes, index: int, image: str, docker_args: list[str]) -> dict:
    """Node INDEX's probe: in its rank's container when that runs, else in IMAGE."""
    if rank_running(nodes, index):
        return run_probe(nodes, index, plan.probe_in_rank_argv(index),
                         plan.rank_container(index))
    return run_probe(nodes, index, plan.probe_in_image_argv(image, docker_args),
                     f"a container of {image}")


def now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def read_cluster(nodes: Nodes, image: str, docker_args: list[str]) -> dict:
    """Every node's probe, head first, each with its one-line description ("line")."""
    read = [read_node(nodes, index, image, docker_args) for index in range(len(nodes.addresses))]
    return {"schema": SCHEMA, "at": now(),
            "nodes": [{**doc, "line": describe(doc)} for doc in read]}


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
