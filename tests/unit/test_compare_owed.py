"""One boot's measurements (compare/boot.py), each a bench/ command: a tool that
crashes, or ends without leaving its result, ends the boot naming the tool; an exit 1 from
an escaped exception is never taken for a failed result (issue 35, finding 4). The launcher is
not run here: the boot measures with stand-in tools against no server."""

from __future__ import annotations

import sys
from types import SimpleNamespace

import pytest

from compare import boot as boots
from compare.rundir import Options, RunDir


@pytest.fixture
def boot(tmp_path, monkeypatch):
    run_dir = RunDir.create(tmp_path / "run", {"options": Options().to_json()})
    monkeypatch.setattr(boots, "why_dead", lambda side: None)  # the server is fine
    return boots.Boot("candidate", SimpleNamespace(role="candidate", text=""), Options(),
                      run_dir, say=lambda message: None)


def tool(tmp_path, body: str) -> str:
    path = tmp_path / "tool.py"
    path.write_text("import json, sys\n" + body)
    return str(path)


def receipt(tmp_path, body: str) -> boots.Measurement:
    return boots.Measurement("solo-vs-concurrent", "receipt solo-vs-concurrent",
                             (sys.executable, tool(tmp_path, body)), "solo-vs-concurrent.json",
                             (0, 1))


def test_a_tool_that_crashes_ends_the_boot_naming_it(boot, tmp_path):
    """An uncaught exception exits 1 in Python, the code a receipt gives for a failed result."""
    with pytest.raises(boots.BootEnded) as ended:
        boot.measure(receipt(tmp_path, "raise RuntimeError('the tool broke')\n"))
    assert str(ended.value) == ("the receipt solo-vs-concurrent crashed (exit 70: an exception "
                                "escaped it; its traceback is in solo-vs-concurrent.log with the "
                                "boot's files)")
    log = (boot.folder / "solo-vs-concurrent.log").read_text()
    assert "RuntimeError: the tool broke" in log
    assert boot.record["measurements"]["solo-vs-concurrent"]["exit"] == 70
    assert boot.record["failed_during"] == "receipt solo-vs-concurrent"


def test_a_tool_that_leaves_no_result_ends_the_boot_naming_it(boot, tmp_path):
    with pytest.raises(boots.BootEnded) as ended:
        boot.measure(receipt(tmp_path, "sys.exit(0)\n"))
    assert str(ended.value) == ("the receipt solo-vs-concurrent left no result "
                                "(solo-vs-concurrent.json is missing or not JSON)")


def test_a_failed_result_is_a_result(boot, tmp_path):
    """The same tool writing its verdict (failed) and exiting 1 goes on to the next tool."""
    out = boot.folder / "solo-vs-concurrent.json"
    boot.measure(receipt(tmp_path, f"json.dump({{'passed': False}}, open({str(out)!r}, 'w'))\n"
                                   "sys.exit(1)\n"))
    assert boot.record["measurements"]["solo-vs-concurrent"]["exit"] == 1
    assert "failed_during" not in boot.record


def test_the_guard_runs_the_tool_as_python_would(tmp_path):
    """Arguments, __name__, sys.path[0] and exit codes as `python3 TOOL ARGS` gives them."""
    import subprocess

    (tmp_path / "beside.py").write_text("VALUE = 7\n")
    script = tool(tmp_path, "import beside\nprint(__name__, sys.argv[1:], beside.VALUE)\n"
                            "sys.exit(int(sys.argv[1]))\n")
    guard = boots.ROOT / "compare" / "crash_guard.py"
    for code in (0, 1, 2):
        done = subprocess.run([sys.executable, str(guard), script, str(code), "x"],
                              capture_output=True, text=True, check=False)
        assert done.returncode == code, done.stderr
        assert done.stdout == f"__main__ ['{code}', 'x'] 7\n"
