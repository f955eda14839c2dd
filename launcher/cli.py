"""run, stop and doctor: read the settings, check them, then print or carry out the plan.

Exit codes: 0 done, 1 failed (`glm53: ...`), 2 refused (`refused: ...`, or the one line of
scripts/build.sh's refusal of the base), 130 interrupted; the doctor's own codes are in
launcher/doctor.py.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from launcher import usage
from launcher.plan import checks, model_heads, user_settings
from launcher.plan.drafter import sliding
from launcher.plan.settings import Failed, Refused, RefusedAbove, resolve
from recipekit import recipe

ROOT = Path(__file__).resolve().parent.parent
# What stop.sh needs of the settings (RUNS_DIR: the record of the GPU clocks run.sh locked).
STOP_KNOBS = ("DRY_RUN", "NODES", "TP", "SSH", "RUNS_DIR")


def load(environ=None, only=None, the_recipe=None) -> checks.Checked:
    """The checked settings of this checkout: environment, cluster.env, profile, recipe
    (THE_RECIPE: another recipe than recipe.toml, for tests)."""
    environ = os.environ if environ is None else environ
    the_recipe = the_recipe or recipe.load()
    cluster_file = Path(environ.get("CLUSTER_ENV") or ROOT / "cluster.env")
    named = user_settings.set_by_name(the_recipe, environ, cluster_file)
    if only is None:
        user_settings.check_environment(the_recipe, environ)
    values = resolve(the_recipe, environ, cluster_file)
    if only is None:
        user_settings.check_applicable(the_recipe, values, named)
    checked = checks.check(the_recipe, values, ROOT, environ.get("HOME", ""), only)
    if only is None:
        user_settings.check_window(checked.values, named, sliding(checked.drafter))
        model_heads.check(checked)
    return checked


def main(argv: list[str]) -> int:
    command = argv[0] if argv else ""
    try:
        if command in usage.SCRIPTS and usage.handled(command, argv[1:]):
            return 0
        if command == "run":
            from launcher.apply import serve

            return serve.run(load(), ROOT)
        if command == "stop":
            from launcher.apply import serve

            return serve.stop(load(only=STOP_KNOBS))
        if command == "doctor":
            from launcher import doctor

            return doctor.main(load(), argv[1:])
        if command == "compare":
            from launcher.compare import command as compare

            return compare.main(argv[1:])
        if command == "self-check":
            from launcher.apply import selfcheck

            return selfcheck.main(argv[1:])
        print("usage: launcher/entry.py run|stop|doctor|compare|self-check", file=sys.stderr)
        return 64
    except Refused as refused:
        print(refused.line, file=sys.stderr)
        return 2
    except RefusedAbove:
        return 2
    except Failed as failed:
        print(f"glm53: {failed}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except OSError as error:
        print(f"glm53: {error}", file=sys.stderr)
        return 1
