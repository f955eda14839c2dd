"""The host levers run.sh pulls on every node before the ranks start, and their undoing.

GPU_CLOCK_MHZ locks the GPU clocks (nvidia-smi in a privileged throwaway container of IMAGE,
given the GPU by DOCKER_ARGS); COMPACT_MEMORY compacts the host's free memory (a privileged
throwaway container writes 1 to /proc/sys/vm/compact_memory), with the platform probe's read
bandwidth printed before and after. Both go through Docker, which the docker group run.sh
needs already makes root-equivalent: no node is asked for sudo.

A lock outlives run.sh, so it is written down first: each node goes into RECORD under
RUNS_DIR before its lock is asked for, with the image and DOCKER_ARGS that can reset it.
./stop.sh resets every node the record lists and removes each from it once reset; so does a
start that fails (serve.py), and a record a crash left behind is still read by the next
./stop.sh.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from launcher.plan import plan
from launcher.apply.remote import Nodes
from launcher.plan.settings import Failed
from launcher.plan.words import quote

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


def write_record(runs_dir: str, nodes: dict) -> None:
    """NODES (address -> entry) through a temporary file; no nodes: no file."""
    path = record_path(runs_dir)
    if not nodes:
        path.unlink(missing_ok=True)
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps({"schema": SCHEMA, "nodes": nodes}, indent=1) + "\n")
    os.replace(partial, path)


def entry_argv(ssh: list[str], address: str, entry: dict, argv: list[str]) -> list[str]:
    """ARGV on the node ENTRY was recorded for: the head locally, a worker through SSH."""
    return list(argv) if entry.get("head") else [*ssh, address, quote(argv)]


def reset_argv(entry: dict) -> list[str]:
    return plan.reset_clocks_argv(entry["image"], list(entry["docker_args"]))


def describe_record(nodes: dict) -> str:
    if not nodes:
        return "GPU clocks: none locked by run.sh (no record)"
    return "GPU clocks locked by run.sh: " + ", ".join(
        f"{address} at {entry['mhz']} MHz" for address, entry in nodes.items())


def lock(nodes: Nodes, runs_dir: str, image: str, docker_args: list[str], mhz: str,
         argv: list[str], say) -> None:
    """Every node's clocks locked by ARGV, each recorded before it is asked; a failure is
    Failed naming the node (what was locked stays recorded for the reset)."""
    for index, address in enumerate(nodes.addresses):
        recorded = read_record(runs_dir)
        recorded[address] = {"head": index == 0, "mhz": plan.clock_range(mhz), "image": image,
                             "docker_args": list(docker_args)}
        write_record(runs_dir, recorded)
        done = subprocess.run(nodes.argv(index, argv), stdin=subprocess.DEVNULL,
                              capture_output=True, text=True, check=False)
        if done.returncode != 0:
            why = (done.stderr or done.stdout).strip().splitlines()[-1:] or [
                f"exit {done.returncode}"]
            raise Failed(f"locking the GPU clocks at {plan.clock_range(mhz)} MHz failed on "
                         f"{nodes.label(index)} ({why[0]}); set GPU_CLOCK_MHZ empty to start "
                         "without the lock")
        say(f"GPU clocks on {nodes.label(index)}: locked at {plan.clock_range(mhz)} MHz "
            f"(recorded in {record_path(runs_dir)}; ./stop.sh resets them)")


def reset(ssh: list[str], runs_dir: str, say, warn) -> int:
    """Every recorded node's clocks reset; each reset node leaves the record. Returns how many
    could not be reset (they stay recorded for the next ./stop.sh)."""
    recorded = read_record(runs_dir)
    failures = 0
    for address, entry in list(recorded.items()):
        done = subprocess.run(entry_argv(ssh, address, entry, reset_argv(entry)),
                              stdin=subprocess.DEVNULL, capture_output=True, text=True,
                              check=False)
        if done.returncode != 0:
            why = (done.stderr or done.stdout).strip().splitlines()[-1:] or [
                f"exit {done.returncode}"]
            warn(f"could not reset the GPU clocks on {address} ({why[0]}); they stay recorded "
                 f"in {record_path(runs_dir)} for the next ./stop.sh")
            failures += 1
            continue
        del recorded[address]
        write_record(runs_dir, recorded)
        say(f"GPU clocks on {address}: reset (were locked at {entry['mhz']} MHz)")
    return failures
