"""Derived drafter configs as vLLM 0.30.0's own code reads them (installed vllm, CPU torch).

vLLM runs in a child process: importing it needs torchvision, torchaudio and torchcodec
hidden (their PyPI builds do not load beside a CPU-only torch 2.13.0, seen here), and
that must not leak into other tests. Nothing of vLLM is copied: the child imports
`_resolve_layer_attention` from vllm.model_executor.models.qwen3_dflash and builds each
config with vLLM's own `get_config`, exactly as it loads a draft model directory.
"""

import json
import os
import sys

import pytest

from recipekit.drafters.cli import main
from tests.unit.test_drafter_synthetic import make_dflash2_g, make_incoai
from tests.vllm.conftest import run_python

VLLM_READS = r"""
import json, sys
for broken in ("torchvision", "torchaudio", "torchcodec"):
    sys.modules[broken] = None  # a None entry makes `import` fail and find_spec say absent
import vllm
from vllm.model_executor.models.qwen3_dflash import _resolve_layer_attention
from vllm.transformers_utils.config import get_config
from vllm.transformers_utils.repo_utils import get_hf_file_bytes

result = {"version": vllm.__version__}
for name, path in json.loads(sys.argv[1]).items():
    config = get_config(path, trust_remote_code=False)
    try:
        layers = [list(_resolve_layer_attention(config, i)) for i in range(config.num_hidden_layers)]
    except ValueError as error:
        layers = "ValueError: " + str(error)
    mask = get_hf_file_bytes("mask_embedding.pt", path, None)
    result[name] = {"layers": layers, "mask_bytes": None if mask is None else len(mask)}
print(json.dumps(result))
"""


def vllm_reads(paths):
    result = run_python(
        [sys.executable, "-c", VLLM_READS, json.dumps({k: str(v) for k, v in paths.items()})],
        check=False,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "VLLM_LOGGING_LEVEL": "ERROR"},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def read_by_vllm(tmp_path_factory):
    root = tmp_path_factory.mktemp("drafters")
    g_source = make_dflash2_g(root / "g")
    incoai_source = make_incoai(root / "incoai")
    no_window = make_incoai(root / "no-window", use_sliding_window=False)
    summaries = {}
    for name, source in (("g", g_source), ("incoai", incoai_source)):
        assert main([str(source), "--out", str(root / f"{name}-served")]) == 0
        summaries[name] = json.loads(
            (root / f"{name}-served" / ".prepare-drafter.json").read_text()
        )["summary"]
    summaries["no_window_exit"] = main([str(no_window), "--out", str(root / "no-window-served")])
    read = vllm_reads(
        {
            "g": root / "g-served",
            "g_source": g_source,
            "incoai": root / "incoai-served",
            "no_window": no_window,
        }
    )
    return read, summaries


def test_dflash2_g_derived_config_is_eight_non_causal_2048_windows_in_vllm(read_by_vllm):
    read, summaries = read_by_vllm
    assert read["version"] == "0.30.0"
    assert read["g_source"]["layers"] == [[None, False]] * 8  # as published: full attention
    assert read["g"]["layers"] == [[2048, False]] * 8  # as served: non-causal 2048-token windows
    assert (summaries["g"]["window"], summaries["g"]["causal"]) == (2048, False)
    assert read["g"]["mask_bytes"] > 0  # vLLM finds the re-serialised mask file in the served dir


def test_incoai_passes_through_and_our_summary_matches_vllm(read_by_vllm):
    read, summaries = read_by_vllm
    window, causal = summaries["incoai"]["window"], summaries["incoai"]["causal"]
    assert read["incoai"]["layers"] == [[window, causal]] * 5
    assert read["incoai"]["mask_bytes"] is None  # the mask row stays in the safetensors


def test_a_window_vllm_cannot_see_is_what_we_refuse(read_by_vllm):
    # sliding_window without use_sliding_window: refused by read_shape, and vLLM indeed fails on it
    read, summaries = read_by_vllm
    assert summaries["no_window_exit"] == 3
    assert read["no_window"]["layers"].startswith(
        "ValueError: DFlash sliding attention requires a window"
    )
