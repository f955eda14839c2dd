"""Shared test setup: the repository root is importable, tiers are marked by folder."""

import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

_TIERS = ("unit", "vllm", "image", "engine")


def pytest_collection_modifyitems(items):
    for item in items:
        tier = Path(str(item.fspath)).relative_to(REPO_ROOT / "tests").parts[0]
        if tier in _TIERS:
            item.add_marker(getattr(pytest.mark, tier))
