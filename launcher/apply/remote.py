"""Running an argv on a node: the head (node 0) locally, a worker through SSH.

A worker gets one shell line (ssh hands the remote login shell one string), every word
quoted for a POSIX shell by launcher/words.py, so nothing is ever evaluated on the way.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass

from launcher.plan.words import quote


@dataclass(frozen=True)
class Nodes:
    """The nodes of a run, head first, and the command that reaches a worker."""
    addresses: tuple[str, ...]
    ssh: tuple[str, ...]

    def argv(self, index: int, argv: list[str]) -> list[str]:
        """The argv that runs ARGV on node INDEX."""
        if index == 0:
            return list(argv)
        return [*self.ssh, self.addresses[index], quote(argv)]

    def label(self, index: int) -> str:
        role = "head" if index == 0 else f"worker {index}"
        return f"{self.addresses[index]} ({role})"

    def run(self, index: int, argv: list[str], *, capture: bool = False, quiet: bool = False,
            stdin=subprocess.DEVNULL) -> subprocess.CompletedProcess:
        """ARGV on node INDEX; CAPTURE: its stdout as text; QUIET: stderr discarded."""
        return subprocess.run(self.argv(index, argv), stdin=stdin, text=True, check=False,
                              stdout=subprocess.PIPE if capture else None,
                              stderr=subprocess.DEVNULL if quiet else None)

    def output(self, index: int, argv: list[str]) -> str | None:
        """ARGV's stdout on node INDEX without its last newline, or None when it failed."""
        result = self.run(index, argv, capture=True, quiet=True)
        return result.stdout.removesuffix("\n") if result.returncode == 0 else None
