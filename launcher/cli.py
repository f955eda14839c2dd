"""run, stop, doctor and self-check: read the settings, check them, then print or carry out
the plan (launcher/pipeline.py).

Exit codes: 0 done, 1 failed (`glm53: ...`), 2 refused (`refused: ...`, or the one line of
scripts/build.sh's refusal of the base), 130 interrupted (launcher/plan/settings.py, ended);
the doctor's own codes are in launcher/doctor.py.
"""

from __future__ import annotations

import sys

from launcher import usage
from launcher.plan.load import ROOT, load
from launcher.plan.settings import ended

# What stop.sh needs of the settings (RUNS_DIR: the record of the GPU clocks run.sh locked).
STOP_KNOBS = ("DRY_RUN", "NODES", "TP", "SSH", "RUNS_DIR")


def command(argv: list[str]) -> int:
    name = argv[0] if argv else ""
    if name in usage.SCRIPTS and usage.handled(name, argv[1:]):
        return 0
    if name == "run":
        from launcher import pipeline

        return pipeline.run(load(), ROOT)
    if name == "stop":
        from launcher import pipeline

        return pipeline.stop(load(only=STOP_KNOBS))
    if name == "doctor":
        from launcher import doctor

        return doctor.main(load(), argv[1:])
    if name == "self-check":
        from launcher.apply import selfcheck

        return selfcheck.main(argv[1:])
    print("usage: launcher/entry.py run|stop|doctor|self-check", file=sys.stderr)
    return 64


def main(argv: list[str]) -> int:
    return ended(lambda: command(argv))
