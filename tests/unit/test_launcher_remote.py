"""Values reach a worker intact whatever characters they hold, and every script is shellcheck-clean."""

import shutil
import subprocess

import pytest

from tests.unit.test_launcher_support import FAKE_SSH, REPO

AWKWARD_VALUES = [
    "it's", '{"method": "dflash", "model": "/a b/c"}', "$HOME `id` $(id) ${X:-{\"a\":1}}",
    "new\nline", "back\\slash", "", "*", "tab\there", "semi;colon && echo pwned", "-dash",
    "'''", '"', "trailing space ", "ünïcode",
]


def on_worker(*words):
    """What arrives on the worker when run.sh's on_node runs `printf '%s\\0' WORDS...` there."""
    script = (
        'set -euo pipefail; LAUNCHER_DIR="$1"; shift; '
        'source "$LAUNCHER_DIR/lib/settings.sh"; source "$LAUNCHER_DIR/lib/remote.sh"; '
        'NODE_LIST=(192.0.2.1 192.0.2.2); SSH_WORDS=("$1" -o BatchMode=yes); shift; '
        "on_node 1 printf '%s\\0' \"$@\""
    )
    result = subprocess.run(
        ["bash", "-c", script, "test", str(REPO / "launcher"), str(FAKE_SSH), *words],
        capture_output=True, timeout=30, check=True)
    return result.stdout.decode().split("\0")[:-1]


def test_awkward_values_arrive_byte_for_byte_through_a_posix_shell():
    # fake-ssh hands the line to `sh` (dash on Debian), as ssh hands it to a login shell.
    assert on_worker(*AWKWARD_VALUES) == AWKWARD_VALUES


@pytest.mark.parametrize("value", AWKWARD_VALUES)
def test_quote_words_round_trips_through_python_shlex(value):
    import shlex

    script = ('source "$1/lib/remote.sh"; quote_words "$2" "x y"; printf %s "$REPLY"')
    line = subprocess.run(["bash", "-c", script, "test", str(REPO / "launcher"), value],
                          capture_output=True, text=True, timeout=30, check=True).stdout
    assert shlex.split(line) == [value, "x y"]


def test_scripts_are_shellcheck_clean():
    shellcheck = shutil.which("shellcheck") or "/tmp/venv/bin/shellcheck"
    scripts = [REPO / "run.sh", REPO / "stop.sh", REPO / "scripts" / "doctor",
               REPO / "tests" / "fakes" / "fake-ssh",
               *sorted((REPO / "launcher" / "lib").glob("*.sh"))]
    result = subprocess.run([shellcheck, "--external-sources", *map(str, scripts)],
                            cwd=REPO, capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
