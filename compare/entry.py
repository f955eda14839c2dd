"""scripts/compare's entry: `python3 compare/entry.py ARGS` (compare/command.py). Checks the
interpreter before anything imports tomllib, and puts the checkout first on sys.path before
any other import: run as a file, this folder would be first, and its platform.py would stand
in for the standard library's."""

import os
import sys

if sys.version_info < (3, 11):
    sys.exit(f"glm53: scripts/compare needs python3 3.11 or newer (it reads recipe.toml with "
             f"tomllib); this python3 is {sys.version.split()[0]}")

sys.path[0] = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

from compare.command import main  # noqa: E402  (after the version check and the path, by design)
from launcher.plan.settings import ended  # noqa: E402

sys.exit(ended(lambda: main(sys.argv[1:])))
