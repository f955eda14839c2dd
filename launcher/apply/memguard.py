"""The unified-memory guard. While run.sh waits for readiness, every node's MemAvailable is
sampled MEM_SAMPLES_PER_SECOND times a second over SSH and the boot phase is read from the
rank logs; a node under its phase's floor stops every rank at once (containers and logs
kept). Each node has one sampler (the plan's: one ssh running the POSIX-shell loop of
launcher/plan/memory_phases.py) and one reader thread on the head, so the readiness loop is
never held up by them.
"""

from __future__ import annotations

import os
import select
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from launcher.plan.memory_phases import FLOOR_KNOBS, MARKER_PHASE, PHASES

CSV_HEADER = "time_unix,elapsed_s,node,phase,mem_available_bytes,floor_bytes"
GIB = 1073741824
# A sampler silent this long is lost: a remote child can keep the pipe open after the
# sampling loop has ended, so end-of-file alone cannot be relied on to say so.
SILENCE_SECONDS = 10
# How long stopping waits for a sampler to end on its TERM before it is killed.
STOP_GRACE_SECONDS = 2


def gib(count: int) -> str:
    hundredths = count * 100 // GIB
    return f"{hundredths // 100}.{hundredths % 100:02d}"


def _stamp(microseconds: int) -> str:
    return f"{microseconds // 1000000}.{microseconds % 1000000:06d}"


@dataclass
class _Node:
    index: int
    address: str
    process: subprocess.Popen
    phase: int = 0


class MemoryGuard:
    """Samplers and readers of every node; `fired` is set with the first reason to stop."""

    def __init__(self, nodes, settings, csv_path: Path):
        self.nodes, self.settings, self.csv_path = nodes, settings, csv_path
        self.floors = [int(settings[name]) * GIB for name in FLOOR_KNOBS]
        self.fired = threading.Event()
        self.reason = ""
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._watched: list[_Node] = []
        self._threads: list[threading.Thread] = []
        self._start_us = 0

    def start(self, samplers) -> None:
        """SAMPLERS: each node's sampler command, head first (the plan's)."""
        with self.csv_path.open("w") as handle:
            handle.write(CSV_HEADER + "\n")
        self._start_us = time.time_ns() // 1000
        for index, sampler in enumerate(samplers):
            argv = self.nodes.argv(index, sampler)
            process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                       stderr=subprocess.DEVNULL)
            node = _Node(index, self.nodes.addresses[index], process)
            self._watched.append(node)
            thread = threading.Thread(target=self._read, args=(node,), daemon=True)
            self._threads.append(thread)
            thread.start()

    def _fire(self, message: str) -> None:
        with self._lock:
            if self._stopping.is_set() or self.fired.is_set():
                return
            self.reason = message
            self.fired.set()

    def _cluster_phase(self) -> int:
        """The furthest any node's log has reached (tensor-parallel ranks move together, and
        the head alone logs some markers)."""
        return max(node.phase for node in self._watched)

    def _lines(self, node: _Node):
        """The sampler's lines; ends when it is silent for SILENCE_SECONDS or closes."""
        stream, buffer = node.process.stdout, b""
        while not self._stopping.is_set():
            ready, _, _ = select.select([stream], [], [], SILENCE_SECONDS)
            if not ready:
                return
            chunk = os.read(stream.fileno(), 65536)
            if not chunk:
                return
            buffer += chunk
            while b"\n" in buffer:
                line, buffer = buffer.split(b"\n", 1)
                yield line.decode(errors="replace")

    def _read(self, node: _Node) -> None:
        for line in self._lines(node):
            if line.startswith("mem ") and line[4:].isdigit():
                if self._sample(node, int(line[4:]) * 1024):
                    return
            elif MARKER_PHASE.get(line, 0) > node.phase:
                node.phase = MARKER_PHASE[line]
        self._fire(f"lost the MemAvailable samples of {node.address} (its sampler over SSH "
                   f"ended or was silent for {SILENCE_SECONDS} s; see MEM_GUARD in "
                   "docs/launcher.md)")

    def _sample(self, node: _Node, available: int) -> bool:
        """Writes the sample's row; True once it is under the floor of the cluster's phase."""
        now = time.time_ns() // 1000
        phase = self._cluster_phase()
        floor = self.floors[phase]
        elapsed = now - self._start_us
        row = (f"{_stamp(now)},{elapsed // 1000000}.{elapsed // 1000 % 1000:03d},"
               f"{node.address},{PHASES[phase]},{available},{floor}\n")
        with self._lock:
            if self._stopping.is_set():
                return True
            with self.csv_path.open("a") as handle:
                handle.write(row)
        if floor > 0 and available < floor:
            self._fire(f"{node.address} has MemAvailable {gib(available)} GiB ({available} "
                       f"bytes), under the {PHASES[phase]} floor of {floor // GIB} GiB")
            return True
        return False

    def stop(self) -> None:
        """Ends the samplers (a remote loop ends on its next write) and the readers; safe
        to call twice."""
        self._stopping.set()
        for node in self._watched:
            if node.process.poll() is None:
                node.process.terminate()
        for node in self._watched:
            try:
                node.process.wait(timeout=STOP_GRACE_SECONDS)
            except subprocess.TimeoutExpired:
                node.process.kill()
                node.process.wait()
        # A reader may wait on a pipe a remote child still holds; it writes nothing more
        # (stopping is set) and, a daemon thread, ends with the launcher.
        for thread in self._threads:
            thread.join(timeout=STOP_GRACE_SECONDS)
        self._watched, self._threads = [], []
