"""The kpool tail ring under Triton's interpreter: drafted decoding through the real kernels
of 0.30.0 (served), of v13 (fixed) and of 0.33.0 (upstream's ring, an independent reference).

Pools built by decoding must equal pools built by prefilling the same committed tokens
(tests/vllm/kpool_ring_sim.py). Each run of the simulation takes minutes of CPU here, so
all variants run once per module.
"""

import json
import os
import shutil
import sys

import pytest

from recipekit.layers.v13_groups import KPOOL_KERNELS
from tests.vllm.conftest import REPO_ROOT, run_python, run_script

SCENARIOS = ("k7-c1", "k7-c2", "mtp-k4-c2", "k5-c4", "k7-chunked")


@pytest.fixture(scope="module")
def simulation(tmp_path_factory, release):
    root = tmp_path_factory.mktemp("v13-sim") / "tree"
    shutil.copytree(release("0.30.0"), root, copy_function=os.link)
    result = run_script("scripts/patch-layer", "v13", "--root", str(root), "--import-check", "off")
    assert result.returncode == 0, result.stderr
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONDONTWRITEBYTECODE": "1"}
    run = run_python(
        [sys.executable, str(REPO_ROOT / "tests/vllm/kpool_ring_sim.py"),
         "--kernels", str(root / KPOOL_KERNELS), "--switches", str(root / "vllm/glm53_v13_switches.py"),
         "--stock", str(release("0.30.0") / KPOOL_KERNELS), "--upstream", str(release("0.33.0") / KPOOL_KERNELS)],
        capture_output=True, text=True, timeout=1800, check=False, env=env,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    report = json.loads(run.stdout.strip().splitlines()[-1])
    print(f"kpool ring simulation: {report['wall_s']} s under the interpreter")
    return report["runs"]


def differing(runs, variant):
    return {name: runs[variant][name]["differing"] for name in SCENARIOS}


def test_the_fix_gives_decode_pools_equal_to_prefill_pools(simulation):
    assert differing(simulation, "fixed") == dict.fromkeys(SCENARIOS, 0)
    assert all(simulation["fixed"][name]["pools"] >= 15 for name in SCENARIOS)


def test_as_served_rejected_drafts_corrupt_committed_pools(simulation):
    assert all(count > 0 for count in differing(simulation, "served").values())
    # v13 with its switch off is the stock 0.30.0 kernel, pool for pool.
    assert simulation["served"] == simulation["stock"]


def test_upstream_0_33_0_gives_the_same_verdict(simulation):
    assert differing(simulation, "upstream") == dict.fromkeys(SCENARIOS, 0)


@pytest.mark.parametrize("part", ["no-ring", "no-seed", "no-v2"])
def test_each_part_of_the_fix_reverted_alone_fails_a_scenario(simulation, part):
    assert any(count > 0 for count in differing(simulation, part).values())
