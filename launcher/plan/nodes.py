"""The nodes of a run, head first, and how a command reaches one: the head (node 0) runs its
argv as is, a worker gets one shell line through SSH (ssh hands the remote login shell one
string), every word quoted for a POSIX shell by launcher/plan/words.py, so nothing is ever
evaluated on the way. launcher/apply/remote.py runs them."""

from __future__ import annotations

from dataclasses import dataclass

from launcher.plan.words import quote


@dataclass(frozen=True)
class Nodes:
    """The nodes of a run, head first, and the command that reaches a worker."""
    addresses: tuple[str, ...]
    ssh: tuple[str, ...]

    def argv(self, index: int, argv) -> list[str]:
        """The argv that runs ARGV on node INDEX."""
        if index == 0:
            return list(argv)
        return [*self.ssh, self.addresses[index], quote(list(argv))]

    def label(self, index: int) -> str:
        role = "head" if index == 0 else f"worker {index}"
        return f"{self.addresses[index]} ({role})"
