"""scripts/test's end: each tier's wall time against its budget, the budgets written once
(in scripts/test) and quoted by docs/tests.md."""

import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "test"


def sourced(command: str) -> str:
    """Run COMMAND in bash with scripts/test sourced (which runs no tier)."""
    result = subprocess.run(["bash", "-c", f'source "{SCRIPT}"; {command}'],
                            capture_output=True, text=True, check=True, timeout=60)
    return result.stdout


def budgets() -> dict[str, int]:
    out = sourced('for t in "${TIERS[@]}"; do echo "$t ${TIER_BUDGET_MIN[$t]}"; done')
    return {tier: int(minutes) for tier, minutes in (line.split() for line in out.splitlines())}


def test_every_tier_has_a_budget_in_minutes():
    assert list(budgets()) == ["unit", "vllm", "image", "engine"]
    assert all(minutes > 0 for minutes in budgets().values())


def test_a_tier_reads_against_its_budget_and_over_it_is_said():
    assert sourced("tier_summary vllm 370 8") == "vllm      6 min 10 s wall (budget 8 min)\n"
    assert sourced("tier_summary engine 800 12") == (
        "engine   13 min 20 s wall (budget 12 min), over it by 1 min 20 s\n")
    assert sourced("tier_summary unit 180 3") == "unit      3 min 00 s wall (budget 3 min)\n"


def test_the_docs_quote_the_budgets():
    text = (REPO / "docs" / "tests.md").read_text()
    section = text.split("\n## Budgets\n", 1)[1].split("\n## ", 1)[0]
    quoted = {m[1]: int(m[2]) for m in re.finditer(r"^\| (\w+) \| (\d+) min \|", section, re.M)}
    assert quoted == budgets()
