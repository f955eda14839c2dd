"""Shared test setup: the repository root is importable, tiers are marked by folder."""

import os
import shutil
import sys
import time
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

_TIERS = ("unit", "vllm", "image", "engine")

# vLLM 0.27.1 and later import humming (its linear kernels), whose import starts two
# background interpreters, each importing torch, to build CUDA launchers that a CPU machine
# cannot build: about 10 s of CPU for every process of the tests that imports vLLM's model
# code, and nothing a test reads. Every process the tests start inherits this.
os.environ.setdefault("HUMMING_DISABLE_PARALLEL_BUILD", "1")


def pytest_runtest_setup(item):
    """`pytest.mark.needs_tool(NAME, WHY)`: a test that needs a program on PATH. Without it the
    test skips, saying which, except in CI (CI=true), where .ci/run installs every such tool
    (tests/unit/test_ci_tools.py holds it to that): there a missing tool fails the test, so a
    CI machine cannot pass by running less."""
    for mark in item.iter_markers("needs_tool"):
        name, why = mark.args
        if shutil.which(name) is None:
            missing = f"{name} is not installed ({why})"
            if os.environ.get("CI") == "true":
                pytest.fail(f"{missing}; .ci/run installs it, so in CI (CI=true) a missing "
                            f"{name} fails the test instead of skipping it", pytrace=False)
            pytest.skip(missing)


def _tier_of(nodeid: str) -> str:
    """The tier of a test by its folder under tests/ ("other" outside the tiers)."""
    parts = nodeid.split("/")
    return parts[1] if len(parts) > 2 and parts[0] == "tests" and parts[1] in _TIERS else "other"


def pytest_collection_modifyitems(items):
    for item in items:
        tier = _tier_of(item.nodeid)
        if tier in _TIERS:
            item.add_marker(getattr(pytest.mark, tier))


# Wall time per tier (setup, call and teardown of its tests, so a session fixture's first
# build counts in the tier that asked for it), printed at the end of every run: README's
# per-tier costs are read from here.
_TIER_SECONDS: dict[str, float] = {}
_TIER_TESTS: dict[str, set[str]] = {}
# Under xdist, when each worker finished its last test (epoch seconds): a worker that ends
# long before the other is wall time one core sat idle, which the test order decides.
_WORKER_DONE: dict[str, float] = {}
_SESSION_START: list[float] = []


def pytest_sessionstart(session):
    _SESSION_START.append(time.time())


def pytest_runtest_logreport(report):
    tier = _tier_of(report.nodeid)
    _TIER_SECONDS[tier] = _TIER_SECONDS.get(tier, 0.0) + report.duration
    _TIER_TESTS.setdefault(tier, set()).add(report.nodeid)
    worker = getattr(getattr(report, "node", None), "gateway", None)
    if worker is not None and getattr(report, "stop", None):
        _WORKER_DONE[worker.id] = max(_WORKER_DONE.get(worker.id, 0.0), report.stop)


def pytest_terminal_summary(terminalreporter):
    if not _TIER_SECONDS:
        return
    terminalreporter.section("time per tier")
    for tier in sorted(_TIER_SECONDS, key=lambda name: (_TIERS + ("other",)).index(name)):
        minutes, seconds = divmod(round(_TIER_SECONDS[tier]), 60)
        terminalreporter.write_line(
            f"{tier:7} {len(_TIER_TESTS[tier]):4} tests  {minutes:3d} min {seconds:02d} s")
    if len(_WORKER_DONE) > 1 and _SESSION_START:
        last = max(_WORKER_DONE.values())
        for worker, done in sorted(_WORKER_DONE.items()):
            terminalreporter.write_line(
                f"worker {worker}: last test done {done - _SESSION_START[0]:5.0f} s after the "
                f"start, {last - done:4.0f} s before the last worker")
