"""A test that needs a tool `.ci/run` installs fails without it in CI (`CI=true`) instead of
skipping, so a CI machine that lost the tool cannot pass by running less (issue 35, finding
8). Tests name their tools with `pytest.mark.needs_tool(NAME, WHY)` (tests/conftest.py);
outside CI a missing tool still skips, saying which."""

from __future__ import annotations

import os
import re
import subprocess
import sys

from tests.conftest import REPO_ROOT

TOOL_MARK = "needs_tool"

# one test of a module that reads a real server with curl; the run stops at its setup
CURL_TEST = ("tests/unit/test_field_health.py::"
             "test_a_healthy_server_is_ready_after_two_healthy_polls")


def run_without_tools(tmp_path, ci: str | None) -> subprocess.CompletedProcess:
    """CURL_TEST in a pytest of its own whose PATH holds no tool at all."""
    empty = tmp_path / "bin"
    empty.mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    env.update({"PATH": str(empty), **({"CI": ci} if ci is not None else {})})
    return subprocess.run([sys.executable, "-m", "pytest", CURL_TEST, "-q", "-p",
                           "no:cacheprovider", "-p", "no:xdist", "-rfEs"], cwd=REPO_ROOT,
                          env=env, capture_output=True, text=True, timeout=300, check=False)


def test_a_missing_tool_fails_in_ci_and_skips_elsewhere(tmp_path):
    in_ci = run_without_tools(tmp_path, "true")
    assert in_ci.returncode == 1, in_ci.stdout + in_ci.stderr
    assert "1 error" in in_ci.stdout or "1 failed" in in_ci.stdout, in_ci.stdout
    assert "curl is not installed" in in_ci.stdout and ".ci/run installs it" in in_ci.stdout
    outside = run_without_tools(tmp_path, None)
    assert outside.returncode == 0, outside.stdout + outside.stderr
    assert "1 skipped" in outside.stdout and "curl is not installed" in outside.stdout


def test_every_tool_a_test_needs_is_one_ci_run_installs():
    """The tools named by needs_tool marks in tests/ are the ones .ci/run installs when
    missing (its `command -v NAME` lines), so failing in CI is never asking for the
    impossible."""
    installed = set(re.findall(r"command -v (\S+) >/dev/null \|\| missing\+=",
                               (REPO_ROOT / ".ci" / "run").read_text()))
    named = set()
    for path in (REPO_ROOT / "tests").rglob("*.py"):
        named |= set(re.findall(TOOL_MARK + r'\("([^"]+)"', path.read_text()))
    assert "curl" in named, "the health tests name curl"
    assert named <= installed, f"needed by tests, not installed by .ci/run: {named - installed}"
