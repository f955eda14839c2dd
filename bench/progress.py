"""What the user sees while the bench runs: a live bar on a terminal, one line per wave
otherwise (logs, CI), nothing with --quiet."""

from __future__ import annotations

import asyncio
import contextlib
import sys
from typing import Self

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from bench.stream_client import Tally

REFRESH_S = 0.25


class BenchProgress:
    def __init__(self, mode: str, total_waves: int):
        """mode: 'live' (rich bar), 'lines' (plain lines) or 'quiet'."""
        self.mode, self.total_waves, self.done_waves = mode, total_waves, 0
        self._progress: Progress | None = None
        self._overall = None

    def set_total(self, total_waves: int) -> None:
        """The number of waves, once the concurrencies are known (the server's max_num_seqs)."""
        self.total_waves = total_waves
        if self._progress is not None:
            self._progress.update(self._overall, total=total_waves)

    @staticmethod
    def pick_mode(quiet: bool) -> str:
        if quiet:
            return "quiet"
        return "live" if sys.stderr.isatty() else "lines"

    def __enter__(self) -> Self:
        if self.mode == "live":
            self._progress = Progress(TextColumn("{task.description}"), BarColumn(),
                                      MofNCompleteColumn(), TimeElapsedColumn(),
                                      console=Console(stderr=True), refresh_per_second=4)
            self._progress.__enter__()
            self._overall = self._progress.add_task("waves", total=self.total_waves)
        return self

    def __exit__(self, *exc) -> None:
        if self._progress is not None:
            self._progress.__exit__(*exc)

    def note(self, text: str) -> None:
        if self.mode == "live" and self._progress is not None:
            self._progress.console.print(text)
        elif self.mode == "lines":
            print(text, file=sys.stderr, flush=True)

    @contextlib.asynccontextmanager
    async def wave(self, label: str, expected_tokens: int, tally: Tally):
        """Show tokens arriving for one wave while the body of the `async with` runs."""
        task, ticker = None, None
        if self._progress is not None:
            task = self._progress.add_task(f"{label} tokens", total=expected_tokens)

            async def tick() -> None:
                while True:
                    self._progress.update(task, completed=tally.tokens)
                    await asyncio.sleep(REFRESH_S)

            ticker = asyncio.create_task(tick())
        try:
            yield
        finally:
            if ticker is not None:
                ticker.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await ticker
                self._progress.update(task, completed=tally.tokens)
                self._progress.remove_task(task)
                self._progress.advance(self._overall)
            self.done_waves += 1

    def wave_done(self, label: str, figures: dict, streams: int, failed: int) -> None:
        rate = figures.get("aggregate_tok_s")
        rate_text = "-" if rate is None else f"{rate:.1f}"
        self.note(f"[{self.done_waves}/{self.total_waves}] {label}: {streams - failed}/{streams} "
                  f"streams measured, aggregate {rate_text} tok/s"
                  + (f", {failed} FAILED" if failed else ""))
