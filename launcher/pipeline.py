"""A run is a pipeline: the checked settings (launcher/plan/load.py) become the plan, built
once as data (launcher/plan/plan.py), and the plan is carried out (launcher/apply/serve.py)
or, with DRY_RUN=1, printed one command a line (launcher/apply/steps.py). stop.sh's the
same way. run.sh and stop.sh come here through launcher/cli.py; scripts/compare directly."""

from __future__ import annotations

from pathlib import Path

from launcher.plan.checks import Checked
from launcher.apply import serve


def run(checked: Checked, root: Path, served: dict | None = None) -> int:
    """Serve CHECKED's settings; SERVED (a dict), when given, receives what was served once
    the ranks are ready: the image ID and the model's and drafter's revisions."""
    return serve.run(checked, root, served)


def stop(checked: Checked) -> int:
    """Every rank run.sh started removed, and the GPU clocks it locked reset."""
    return serve.stop(checked)
