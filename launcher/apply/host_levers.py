"""The host levers run.sh pulls on every node before the ranks start, and their undoing.

GPU_CLOCK_MHZ locks the GPU clocks (nvidia-smi in a privileged throwaway container of IMAGE,
given the GPU by DOCKER_ARGS); COMPACT_MEMORY compacts the host's free memory (serve.py runs
it between two platform probes). Both go through Docker, which the docker group run.sh needs
already makes root-equivalent: no node is asked for sudo. The commands are the plan's.

A lock outlives run.sh, so it is written down first (launcher/plan/clock_record.py): each
node goes into the record under RUNS_DIR before its lock is asked for. ./stop.sh resets
every node the record lists and removes each from it once reset; so does a start that fails
(serve.py), and a record a crash left behind is still read by the next ./stop.sh. Each reset
is the plan's, made before anything ran.
"""

from __future__ import annotations

import json
import os
import subprocess

from launcher.apply.remote import Remote
from launcher.plan.clock_record import SCHEMA, entry, read_record, record_path
from launcher.plan.data import ClockReset
from launcher.plan.settings import Failed


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


def _why(done: subprocess.CompletedProcess) -> str:
    return ((done.stderr or done.stdout).strip().splitlines()[-1:] or
            [f"exit {done.returncode}"])[0]


def lock(nodes: Remote, runs_dir: str, image: str, docker_args: list[str], mhz: str,
         commands, say) -> None:
    """Every node's clocks locked by its command of COMMANDS (head first) at MHZ, each node
    recorded before it is asked; a failure is Failed naming the node (what was locked stays
    recorded for the reset)."""
    for index, (address, argv) in enumerate(zip(nodes.addresses, commands)):
        recorded = read_record(runs_dir)
        recorded[address] = entry(index == 0, mhz, image, docker_args)
        write_record(runs_dir, recorded)
        done = subprocess.run(nodes.argv(index, argv), stdin=subprocess.DEVNULL,
                              capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise Failed(f"locking the GPU clocks at {mhz} MHz failed on {nodes.label(index)} "
                         f"({_why(done)}); set GPU_CLOCK_MHZ empty to start without the lock")
        say(f"GPU clocks on {nodes.label(index)}: locked at {mhz} MHz "
            f"(recorded in {record_path(runs_dir)}; ./stop.sh resets them)")


def reset(resets: tuple[ClockReset, ...], runs_dir: str, say, warn) -> int:
    """Each of RESETS run whose node the record still lists; each node reset leaves the
    record. Returns how many could not be reset (they stay recorded for the next
    ./stop.sh)."""
    failures = 0
    for clock in resets:
        if clock.address not in read_record(runs_dir):
            continue
        done = subprocess.run(list(clock.argv), stdin=subprocess.DEVNULL, capture_output=True,
                              text=True, check=False)
        if done.returncode != 0:
            warn(f"could not reset the GPU clocks on {clock.address} ({_why(done)}); they stay "
                 f"recorded in {record_path(runs_dir)} for the next ./stop.sh")
            failures += 1
            continue
        recorded = read_record(runs_dir)
        recorded.pop(clock.address, None)
        write_record(runs_dir, recorded)
        say(f"GPU clocks on {clock.address}: reset (were locked at {clock.mhz} MHz)")
    return failures
