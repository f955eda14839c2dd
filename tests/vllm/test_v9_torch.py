"""v9 on an installed vLLM 0.27.1 stack (CPU torch 2.13.0): the DFlash2 modules import and run."""

import json
import os
import sys

import pytest

from tests.vllm.conftest import REPO_ROOT, run_python, run_script

torch = pytest.importorskip("torch", reason="the vllm tier needs CPU torch 2.13.0 (scripts/test installs it)")


@pytest.fixture(scope="module")
def patched_0_27_1(tmp_path_factory, release):
    import shutil
    root = tmp_path_factory.mktemp("v9-torch") / "tree"
    shutil.copytree(release("0.27.1"), root, copy_function=os.link)
    result = run_script("scripts/patch-layer", "v9", "--root", str(root), "--json", "--import-check", "on")
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(result.stdout)
    assert report["outcome"] == "applied"
    assert "2 touched modules import" in report["reason"]
    return root


def test_dflash2_pure_torch_parts_match_plain_loops(patched_0_27_1):
    probe = REPO_ROOT / "tests/vllm/probes/dflash2_parts.py"
    result = run_python(
        [sys.executable, str(probe)], capture_output=True, text=True, timeout=600, check=False,
        env={**os.environ, "PYTHONPATH": str(patched_0_27_1), "PYTHONDONTWRITEBYTECODE": "1"},
    )
    assert result.returncode == 0, result.stderr[-2000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["vllm_file"].startswith(str(patched_0_27_1))
    assert report["speculator_class"] == "DFlash2Speculator"
    assert report["conv_shape"] == [11, 12]
    assert report["conv_max_abs_diff"] < 1e-12
    assert report["scores_shape"] == [2, 3, 4, 4]
    assert report["scores_max_abs_diff"] < 1e-12
