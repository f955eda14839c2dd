"""argparse for the repository's tools with a usage error in one line (argparse's own prints
the whole usage first): `TOOL: error: MESSAGE (see TOOL --help)`, exit 2. Subcommands'
parsers are of the same class (argparse makes them so). Standard library only."""

from __future__ import annotations

import argparse


class OneLineParser(argparse.ArgumentParser):
    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")
