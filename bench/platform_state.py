"""The platform's state at the start and the end of a bench result: `scripts/doctor --platform
--json` of this checkout (the platform probe in every rank's container: read bandwidth,
clocks and their lock, memory, fragmentation, uptime; docs/launcher.md), run as a command
with the launcher's settings (environment, cluster.env, recipe.toml).

Where the launcher cannot reach the ranks (no cluster settings here, another machine's
server, a python the launcher refuses), the result says so: {"measured": false, "why": ...},
never a made-up value. `--platform off` records that it was not asked.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ENTRY = Path(__file__).resolve().parent.parent / "launcher" / "entry.py"
# the probe's own limit is 180 s a node; a two-node doctor run stays well under this
TIMEOUT_S = 900
MODES = ("auto", "off")


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else ""


def measure(mode: str) -> dict:
    """Every node's probe now, or why there is none."""
    if mode == "off":
        return {"measured": False, "why": "not asked (--platform off)"}
    argv = [sys.executable, str(ENTRY), "doctor", "--platform", "--json"]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=TIMEOUT_S,
                              stdin=subprocess.DEVNULL, check=False)
    except subprocess.TimeoutExpired:
        return {"measured": False, "why": f"scripts/doctor --platform did not finish within "
                                          f"{TIMEOUT_S} s"}
    try:
        doc = json.loads(_last_line(done.stdout))
    except ValueError:
        doc = None
    if not isinstance(doc, dict) or not isinstance(doc.get("nodes"), list):
        why = _last_line(done.stderr) or f"exit {done.returncode}"
        return {"measured": False, "why": f"the launcher cannot probe the ranks from here: {why}"}
    unreached = [f"{node.get('node')}: {node['why']}" for node in doc["nodes"] if "why" in node]
    if unreached:
        return {"measured": False, "why": "; ".join(unreached), **doc}
    return {"measured": True, **doc}


def lines(block: dict) -> list[str]:
    """What the bench prints of its platform block (start and end), a line a node."""
    shown = []
    for when in ("start", "end"):
        reading = block.get(when) or {}
        if not reading.get("nodes"):
            shown.append(f"platform at the {when}: not measured: {reading.get('why', 'unknown')}")
            continue
        for node in reading["nodes"]:
            shown.append(f"platform at the {when}, {node.get('node')} ({node.get('role')}): "
                         f"{node.get('line') or node.get('why', 'unknown')}")
    return shown
