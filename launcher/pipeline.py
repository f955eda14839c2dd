"""A run is a pipeline: the checked settings (launcher/plan/load.py) become the plan, built
once as data before anything runs (launcher/plan/plan.py), and the plan is carried out
(launcher/apply/serve.py) or, with DRY_RUN=1, printed one command a line
(launcher/apply/steps.py). stop.sh's the same way. run.sh and stop.sh come here through
launcher/cli.py; scripts/compare (compare/boot.py) directly."""

from __future__ import annotations

from pathlib import Path

from launcher.apply import serve
from launcher.plan import plan
from launcher.plan.checks import Checked


def run(checked: Checked, root: Path, served: dict | None = None) -> int:
    """Serve CHECKED's settings; SERVED (a dict), when given, receives what was served once
    the ranks are ready: the image ID and the model's and drafter's revisions."""
    return serve.run(plan.build(checked, plan.nodes_of(checked), root), served)


def stop(checked: Checked) -> int:
    """Every rank run.sh started removed, and the GPU clocks it locked reset."""
    return serve.stop(plan.stop_plan(checked), checked["DRY_RUN"] == "1")
