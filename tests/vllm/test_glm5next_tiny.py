"""The GPU tier's tiny Glm5Next (tests/gpu/glm5next_models.py) as vLLM 0.30.0 sees it on CPU:
its own config class accepts the config, its own Glm5NextForCausalLM is built with every layer
kind the recipe serves (KDA, MLA with the sparse indexer, mHC, ModelOpt NVFP4 MoE) and
load_weights fills every parameter from the checkpoint's names, both variants; the gate/up
globals vLLM holds are the ones written; with tests/gpu/standin on the path, the indexer's
kernels are the stand-in's. The float64 MoE reference of check 4 is tested
against the checkpoint's own quantization error."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from tests.gpu import glm5next_models as tiny
from tests.gpu.mqa_logits_reference import INDEXER_MODULES
from tests.vllm.conftest import REPO_ROOT

PROBE = REPO_ROOT / "tests/vllm/probes/glm5next_tiny_build.py"
STANDIN = REPO_ROOT / "tests/gpu/standin"  # as part d's servers have it


@pytest.fixture(scope="module")
def built(tmp_path_factory, release):
    root = tmp_path_factory.mktemp("glm5next-tiny")
    dirs = [str(tiny.write(root / variant, variant)) for variant in tiny.VARIANTS]
    done = subprocess.run([sys.executable, str(PROBE), *dirs], cwd=root, capture_output=True,
                          text=True, timeout=600,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(
                              [str(STANDIN), str(release("0.30.0"))])})
    assert done.returncode == 0, done.stderr[-3000:]
    docs = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    return {doc["variant"]: doc for doc in docs}


@pytest.mark.parametrize("variant", tiny.VARIANTS)
def test_vllm_builds_every_layer_kind_and_loads_every_parameter(built, variant):
    doc = built[variant]
    assert doc["not_loaded"] == [] and doc["unknown"] == []
    assert doc["layer_types"] == ["linear_attention", "attention"] * 2
    kinds = [(layer["attention"], layer["indexer"], layer["mlp"], layer["experts_method"])
             for layer in doc["layers"]]
    assert kinds == [
        ("Glm5NextLinearAttention", "NoneType", "Glm5NextMLP", "NoneType"),
        ("Glm5NextMLAAttention", "Indexer", "Glm5NextMoE", "ModelOptNvFp4FusedMoE"),
        ("Glm5NextLinearAttention", "NoneType", "Glm5NextMoE", "ModelOptNvFp4FusedMoE"),
        ("Glm5NextMLAAttention", "Indexer", "Glm5NextMoE", "ModelOptNvFp4FusedMoE"),
    ]
    assert all(layer["mhc"] for layer in doc["layers"])


def test_the_stand_in_holds_the_indexer_kernels_and_nothing_else(built):
    """On the real 0.30.0 tree, with the model built: the three names the indexer uses are
    the stand-in's, wherever imported, and its three modules alone see DeepGEMM present
    (their build refuses without it on CUDA); DeepGEMM's other kernels and vLLM's own
    presence check stay vLLM's."""
    for doc in built.values():
        names = doc["deep_gemm_names"]
        assert names.pop("deep_gemm.fp8_gemm_nt") == "vllm.utils.deep_gemm"
        assert names.pop("vllm.utils.deep_gemm.has_deep_gemm") == "vllm.utils.import_utils"
        assert set(names.values()) == {"gpu_mqa_logits_reference"}, names
        assert sorted(n.removesuffix(".has_deep_gemm") for n in names
                      if n.endswith(".has_deep_gemm")) == sorted(INDEXER_MODULES)


def test_the_gate_and_up_globals_vllm_holds_are_the_variants(built):
    for variant, doc in built.items():
        for name, pairs in doc["w13_weight_scale_2"].items():
            ratios = [up / gate for gate, up in pairs]
            expected = tiny.PLANTED_RATIOS if variant == "unequal" else (1.0,) * tiny.EXPERTS
            assert ratios == pytest.approx(expected, rel=1e-6), (variant, name)


def test_moe_float64_is_the_intended_experts_and_sees_a_folded_up_half():
    """On the unequal variant: the reference on the checkpoint's weights is within NVFP4's
    rounding of the unquantized experts' product; folding each up half with the gate's
    global (stock vLLM's reading) moves it far beyond that."""
    tensors = tiny.checkpoint_tensors("unequal")
    x = torch.randn(32, tiny.HIDDEN, generator=torch.Generator().manual_seed(1),
                    dtype=torch.float64)
    reference = tiny.moe_float64(x, tensors, layer=1)
    folded = dict(tensors)
    for expert in range(tiny.EXPERTS):
        e = f"model.layers.1.mlp.experts.{expert}"
        folded[f"{e}.up_proj.weight_scale_2"] = tensors[f"{e}.gate_proj.weight_scale_2"]
    stock = tiny.moe_float64(x, folded, layer=1)
    off = ((stock - reference).norm() / reference.norm()).item()
    assert off > 0.1  # experts with ratios 4 and 0.25 carry much of the output
    equal = tiny.checkpoint_tensors("equal")
    for expert in range(tiny.EXPERTS):
        e = f"model.layers.2.mlp.experts.{expert}"
        assert equal[f"{e}.gate_proj.weight_scale_2"] == equal[f"{e}.up_proj.weight_scale_2"]


def test_nvfp4_round_trip_is_within_half_a_step_and_a_planted_scale_is_not():
    generator = torch.Generator().manual_seed(2)
    weight = torch.randn(64, 128, generator=generator, dtype=torch.float64)
    global_scale = weight.abs().max().item() / (6.0 * tiny.E4M3_MAX)
    packed, scales = tiny.nvfp4(weight, global_scale)
    back = tiny.nvfp4_dequantized(packed, scales, global_scale)
    step = scales.double().repeat_interleave(tiny.GROUP, -1) * global_scale
    # e2m1's widest gap is 2 (between 4 and 6): half of it, times the block's step, bounds
    # the value's rounding; the E4M3 rounding of the scale can push a value past 6 by 1/16
    bound = step * (1.0 + 6.0 / 16) + 1e-12
    assert ((back - weight).abs() <= bound).all()
    wrong = tiny.nvfp4_dequantized(packed, scales, global_scale * 1.3)
    assert not ((wrong - weight).abs() <= bound).all()
