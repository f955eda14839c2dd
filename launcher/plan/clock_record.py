"""The record of the GPU clocks run.sh locked (GPU_CLOCK_MHZ; launcher/apply/host_levers.py
locks and resets them): RECORD under RUNS_DIR lists each node whose lock was asked for, with
the image and DOCKER_ARGS that reset it, so that a lock outliving run.sh is never forgotten:
./stop.sh plans a reset of every node it lists, and scripts/doctor --platform reports it.
"""

from __future__ import annotations

import json
from pathlib import Path

from launcher.plan.settings import Failed

RECORD = "gpu-clocks.json"
SCHEMA = "glm53-gpu-clocks/1"


def record_path(runs_dir: str) -> Path:
    return Path(runs_dir) / RECORD


def read_record(runs_dir: str) -> dict:
    """The nodes whose clocks a run locked (address -> entry); {} when none is recorded. A
    record that cannot be read is a failure: a lock it may hold must not be forgotten."""
    path = record_path(runs_dir)
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as error:
        raise Failed(f"cannot read {path} (the GPU clocks run.sh locked): {error}; reset them "
                     "by hand (nvidia-smi --reset-gpu-clocks on each node) and remove it")
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA or not isinstance(
            doc.get("nodes"), dict):
        raise Failed(f"{path} is not a record of locked GPU clocks ({SCHEMA}); reset them by "
                     "hand (nvidia-smi --reset-gpu-clocks on each node) and remove it")
    return doc["nodes"]


def entry(head: bool, mhz: str, image: str, docker_args) -> dict:
    """A node's entry: where it runs, the range it is locked at, what resets it."""
    return {"head": head, "mhz": mhz, "image": image, "docker_args": list(docker_args)}


def describe_record(nodes: dict) -> str:
    if not nodes:
        return "GPU clocks: none locked by run.sh (no record)"
    return "GPU clocks locked by run.sh: " + ", ".join(
        f"{address} at {entry['mhz']} MHz" for address, entry in nodes.items())
