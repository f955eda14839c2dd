"""The launcher's entry refuses an interpreter without tomllib in one line, before anything
else runs, and names its commands when given another."""

import subprocess
import sys

from tests.timing import HANG_GUARD_S
from tests.unit.test_launcher_support import REPO

ENTRY = REPO / "launcher" / "entry.py"


def test_an_older_python_is_refused_in_one_line():
    as_if_310 = ("import runpy, sys; sys.version_info = (3, 10, 13); "
                 "sys.version = '3.10.13 (as if)'; sys.argv = ['entry.py', 'run']; "
                 f"runpy.run_path({str(ENTRY)!r}, run_name='__main__')")
    result = subprocess.run([sys.executable, "-c", as_if_310], capture_output=True, text=True,
                            timeout=HANG_GUARD_S, check=False)
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr == ("glm53: the launcher needs python3 3.11 or newer (it reads "
                             "recipe.toml with tomllib); this python3 is 3.10.13\n")


def test_an_unknown_command_is_a_usage_error():
    result = subprocess.run([sys.executable, str(ENTRY), "serve"], capture_output=True,
                            text=True, timeout=HANG_GUARD_S, check=False)
    assert result.returncode == 64
    assert result.stderr == "usage: launcher/entry.py run|stop|doctor|self-check\n"
