"""How late this process wakes while a timed run goes on, and the allowance a timing
check derives from it.

A client stamps a chunk when its event loop gets to it, so its read delays are its process's
wake-up delays: well under a millisecond on an idle machine, tens of ms beside a CPU hog
(measured: up to 40 ms at nice 10 beside two busy loops on 2 cores). A figure timed between
two stamps is then off by up to two such delays, and a check that allows a fixed 1% holds
only on an idle machine. Checks allow 1% of a span plus what was measured during the very run.
"""

from __future__ import annotations

import threading
import time


class Jitter:
    """A thread asking for 2 ms sleeps and recording how much longer each took; use as a
    context manager around the timed run."""

    NAP_S = 0.002

    def __init__(self):
        self.late_s: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._stop.is_set():
            start = time.monotonic()
            time.sleep(self.NAP_S)
            self.late_s.append(time.monotonic() - start - self.NAP_S)

    def __enter__(self) -> Jitter:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    @property
    def worst_s(self) -> float:
        return max(self.late_s, default=0.0)


def span_allowance_s(true_span_s: float, jitter: Jitter, tolerance: float) -> float:
    """How far a span measured between two stamps may lie from the true span: `tolerance`
    of it, plus twice the worst wake-up delay measured (each end stamp read late by up to
    that). Judged on spans, not rates: a first chunk read late and a last one on time
    shorten a span, and the rate's error then grows without bound as the span shrinks."""
    return tolerance * true_span_s + 2 * jitter.worst_s


# How long a test lets a script or a server it started run before calling it hung. Only a
# hang is caught by it: what a run did is judged by what it printed, called and recorded,
# and its own waits are bounded by the settings a test passes (POLL_SECONDS, READY_TIMEOUT).
# Beside two busy loops a nice-10 test process gets about a tenth of a core: a run.sh that
# takes 5 s idle took over 60 s there, so a 60 s bound failed runs that were not hung.
HANG_GUARD_S = 600
