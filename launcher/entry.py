"""The launcher's one entry: `python3 launcher/entry.py run|stop|doctor|self-check`
(run.sh, stop.sh and scripts/doctor call it; run.sh's run calls self-check once ready;
scripts/compare has its own, compare/entry.py). Checks the interpreter before anything
imports tomllib."""

import sys
from pathlib import Path

if sys.version_info < (3, 11):
    sys.exit(f"glm53: the launcher needs python3 3.11 or newer (it reads recipe.toml with "
             f"tomllib); this python3 is {sys.version.split()[0]}")

sys.path[0] = str(Path(__file__).resolve().parent.parent)

from launcher.cli import main  # noqa: E402  (after the version check, by design)

sys.exit(main(sys.argv[1:]))
