"""A layer build's heartbeat: while the builder runs (minutes, silent unless --verbose), one
line every 30 s with the time so far and the last line of the layer's log, whose path the
first line names."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

EVERY_SECONDS = 30
SHOWN_CHARS = 160  # of the log's last line


def last_line(log: Path) -> str:
    """The last non-blank line of LOG, cut to SHOWN_CHARS ("" before the builder wrote one)."""
    try:
        with log.open("rb") as handle:
            handle.seek(0, 2)
            handle.seek(max(0, handle.tell() - 8192))
            tail = handle.read().decode(errors="replace")
    except OSError:
        return ""
    lines = [line.strip() for line in tail.splitlines() if line.strip()]
    return lines[-1][:SHOWN_CHARS] if lines else ""


def beat_line(layer: str, elapsed_s: float, log: Path) -> str:
    minutes, seconds = divmod(int(elapsed_s), 60)
    return f"{layer}: still building, {minutes} min {seconds:02d} s; last log line: {last_line(log) or '(none yet)'}"


class Heartbeat:
    """`with Heartbeat(layer, log, say):` names LOG, then says a beat_line every EVERY_SECONDS
    until the block ends. WAIT (tests): called with the interval, True once stopped."""

    def __init__(self, layer: str, log: Path, say: Callable[[str], None], shown_log: str,
                 every_s: float = EVERY_SECONDS, wait: Callable[[float], bool] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.layer, self.log, self.say, self.shown_log = layer, log, say, shown_log
        self.every_s, self.clock = every_s, clock
        self.stopped = threading.Event()
        self.wait = wait or self.stopped.wait
        self.thread = threading.Thread(target=self._run, name=f"heartbeat-{layer}", daemon=True)

    def _run(self) -> None:
        while not self.wait(self.every_s):
            self.say(beat_line(self.layer, self.clock() - self.started, self.log))

    def __enter__(self) -> "Heartbeat":
        self.started = self.clock()
        self.say(f"{self.layer}: its log is {self.shown_log} (a line every {self.every_s:.0f} s "
                 "while it builds)")
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stopped.set()
        self.thread.join()
