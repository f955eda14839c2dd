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
    whole = int(sourced('echo "${ALL_BUDGET_MIN}"'))
    assert quoted == {**budgets(), "all": whole}


# A stand-in for the test venv's python: `-m tests.engine.engine_env` does nothing, and
# `-m pytest ARGS... tests/TIER` records the tier's start and end in $RUNS. The vllm tier
# waits until the image tier has started (so it ends only when the image tier runs beside
# it: no clock is read), and the tier named by $FAIL exits 1.
FAKE_PYTHON = r"""#!/usr/bin/env bash
[[ "$2" == pytest ]] || exit 0
tier="${!#}"; tier="${tier#tests/}"
echo "start ${tier}" >>"${RUNS}"
if [[ "${tier}" == vllm ]]; then
  for _ in $(seq 600); do grep -qx "start image" "${RUNS}" && break; sleep 0.1; done
  grep -qx "start image" "${RUNS}" || { echo "vllm: image never started beside it"; exit 3; }
fi
echo "output of ${tier}"
echo "end ${tier}" >>"${RUNS}"
[[ "${tier}" != "${FAIL:-}" ]]
"""


def run_tiers(tmp_path: Path, fail: str = "") -> tuple[subprocess.CompletedProcess, list[str]]:
    python = tmp_path / "python"
    python.write_text(FAKE_PYTHON)
    python.chmod(0o755)
    runs = tmp_path / "runs"
    runs.touch()
    result = subprocess.run(["bash", "-c", f'source "{SCRIPT}"; run_tiers "{python}"'],
                            capture_output=True, text=True, timeout=120, cwd=REPO,
                            env={"PATH": "/usr/bin:/bin", "RUNS": str(runs), "FAIL": fail,
                                 "TMPDIR": str(tmp_path)})
    return result, runs.read_text().splitlines()


def test_the_image_tier_runs_beside_the_vllm_tier_and_its_output_follows(tmp_path):
    result, runs = run_tiers(tmp_path)
    assert result.returncode == 0, result.stderr
    assert runs.index("start image") < runs.index("end vllm")  # beside, not after
    assert runs.index("end unit") < runs.index("start image")
    assert runs.index("end vllm") < runs.index("start engine")
    assert runs.index("end image") < runs.index("start engine")
    # the image tier's output whole, after the vllm tier's, and each tier's wall said
    assert result.stdout.splitlines() == ["output of unit", "output of vllm", "output of image",
                                          "output of engine"]
    for tier in ("unit", "vllm", "image", "engine", "all"):
        assert re.search(rf"^test: {tier} +\d+ min \d\d s wall \(budget \d+ min\)$",
                         result.stderr, re.M), result.stderr
    assert result.stderr.splitlines()[-1] == "test: every tier passed"
    assert not list(tmp_path.glob("glm53-tier-image.*")), "the image tier's log is left behind"


def test_a_failed_tier_beside_another_is_named_and_the_rest_still_run(tmp_path):
    result, runs = run_tiers(tmp_path, fail="image")
    assert result.returncode == 1
    assert "end engine" in runs
    assert result.stderr.splitlines()[-1] == "test: failed tiers: image"
