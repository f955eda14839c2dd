"""DRY_RUN is byte for byte what the bash launcher printed before the move to Python.

The fixtures (tests/unit/fixtures/dry_run/) were written by `python3 -m
tests.unit.launcher_fixtures` on the bash launcher; each scenario is a setting the
launcher tests of the unit, vllm and engine tiers cover.
"""

import pytest

from tests.unit.launcher_fixtures import SCENARIOS, dry_run_output, fixture


@pytest.mark.parametrize("name", SCENARIOS)
def test_dry_run_equals_the_saved_fixture(name):
    assert dry_run_output(name) == fixture(name)
