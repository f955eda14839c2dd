"""Running a command of the plan on a node (launcher/plan/nodes.py says how it reaches it).
A command that still holds a hole of the plan (launcher/plan/data.py: a fact the run had not
filled in yet) is never run: that is the launcher's own fault, said in one line."""

from __future__ import annotations

import subprocess

from launcher.plan.data import unfilled
from launcher.plan.nodes import Nodes
from launcher.plan.settings import Failed


class Remote(Nodes):
    """The nodes, reached: ARGV run on node INDEX."""

    @classmethod
    def of(cls, nodes: Nodes) -> "Remote":
        return cls(nodes.addresses, nodes.ssh)

    def run(self, index: int, argv, *, capture: bool = False, quiet: bool = False,
            stdin=subprocess.DEVNULL) -> subprocess.CompletedProcess:
        """ARGV on node INDEX; CAPTURE: its stdout as text; QUIET: stderr discarded."""
        return subprocess.run(self.argv(index, argv), stdin=stdin, text=True, check=False,
                              stdout=subprocess.PIPE if capture else None,
                              stderr=subprocess.DEVNULL if quiet else None)

    def output(self, index: int, argv) -> str | None:
        """ARGV's stdout on node INDEX without its last newline, or None when it failed."""
        result = self.run(index, argv, capture=True, quiet=True)
        return result.stdout.removesuffix("\n") if result.returncode == 0 else None

    def argv(self, index: int, argv) -> list[str]:
        if holes := unfilled(argv):
            raise Failed(f"the launcher was about to run {argv[0]} with {', '.join(holes)} not "
                         "found yet; this is a bug of the launcher, please report it")
        return super().argv(index, argv)
