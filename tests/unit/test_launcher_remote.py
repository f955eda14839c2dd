"""Values reach a worker intact whatever characters they hold, and the entry scripts are
shellcheck-clean."""

import shlex
import shutil
import subprocess

import pytest

from launcher.plan.nodes import Nodes
from launcher.plan.words import quote
from tests.timing import HANG_GUARD_S
from tests.unit.test_launcher_support import FAKE_SSH, REPO

AWKWARD_VALUES = [
    "it's", '{"method": "dflash", "model": "/a b/c"}', "$HOME `id` $(id) ${X:-{\"a\":1}}",
    "new\nline", "back\\slash", "", "*", "tab\there", "semi;colon && echo pwned", "-dash",
    "'''", '"', "trailing space ", "ünïcode",
]


def on_worker(*words):
    """What arrives on the worker when the launcher runs `printf '%s\\0' WORDS...` there."""
    nodes = Nodes(("192.0.2.1", "192.0.2.2"), (str(FAKE_SSH), "-o", "BatchMode=yes"))
    result = subprocess.run(nodes.argv(1, ["printf", "%s\\0", *words]), capture_output=True,
                            timeout=HANG_GUARD_S, check=True)
    return result.stdout.decode().split("\0")[:-1]


def test_awkward_values_arrive_byte_for_byte_through_a_posix_shell():
    # fake-ssh hands the line to `sh` (dash on Debian), as ssh hands it to a login shell.
    assert on_worker(*AWKWARD_VALUES) == AWKWARD_VALUES


@pytest.mark.parametrize("value", AWKWARD_VALUES)
def test_quote_round_trips_through_python_shlex(value):
    assert shlex.split(quote([value, "x y"])) == [value, "x y"]


def test_the_head_runs_its_argv_as_is():
    nodes = Nodes(("192.0.2.1",), ("ssh",))
    assert nodes.argv(0, ["printf", "%s", "it's"]) == ["printf", "%s", "it's"]


def test_scripts_are_shellcheck_clean():
    shellcheck = shutil.which("shellcheck") or "/tmp/venv/bin/shellcheck"
    scripts = [REPO / "run.sh", REPO / "stop.sh", REPO / "scripts" / "doctor",
               REPO / "tests" / "fakes" / "fake-ssh"]
    result = subprocess.run([shellcheck, "--external-sources", *map(str, scripts)],
                            cwd=REPO, capture_output=True, text=True, timeout=HANG_GUARD_S, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
