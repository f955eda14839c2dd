"""The GPU tier's tiny Glm5Next (tests/gpu/glm5next_models.py) as vLLM 0.30.0 sees it on CPU:
its own config class accepts the config, its own Glm5NextForCausalLM is built with every layer
kind the recipe serves (KDA, MLA with the sparse indexer, mHC, ModelOpt NVFP4 MoE) and
load_weights fills every parameter from the checkpoint's names, the live variants and the
tokenwise one; the gate/up globals vLLM holds are the ones written; with tests/gpu/standin on
the path, the indexer's kernels are the stand-in's. The float64 MoE reference of check 4 is
tested against the checkpoint's own quantization error. The tokenwise design (part d's
greedy tokens, stock divergence and aux states) is checked against vLLM's own mHC and router
code, a bf16 emulation of its forward, and v8's fold, which must give the twin bit for bit."""

from __future__ import annotations

import json
import os
import sys

import pytest
import torch

from tests.gpu import glm5next_models as tiny
from tests.gpu.mqa_logits_reference import INDEXER_MODULES
from tests.vllm.conftest import REPO_ROOT, run_python

PROBE = REPO_ROOT / "tests/vllm/probes/glm5next_tiny_build.py"
STANDIN = REPO_ROOT / "tests/gpu/standin"  # as part d's servers have it


BUILT = (*tiny.VARIANTS, "tokenwise")


@pytest.fixture(scope="module")
def built(tmp_path_factory, release):
    from tests.gpu import models

    root = tmp_path_factory.mktemp("glm5next-tiny")
    dirs = [str(tiny.write(root / variant, variant)) for variant in tiny.VARIANTS]
    dirs.append(str(tiny.write(root / "tokenwise", "tokenwise",
                               tokenizer=models.margin_target_dir())))
    done = run_python([sys.executable, str(PROBE), *dirs], cwd=root, capture_output=True,
                      text=True, timeout=600,
                      env={**os.environ, "PYTHONPATH": os.pathsep.join(
                          [str(STANDIN), str(release("0.30.0"))])})
    assert done.returncode == 0, done.stderr[-3000:]
    docs = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    return {doc["variant"]: doc for doc in docs}


@pytest.mark.parametrize("variant", BUILT)
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
            expected = {"unequal": tiny.PLANTED_RATIOS, "tokenwise": tiny.TWIN_RATIOS}.get(
                variant, (1.0,) * tiny.EXPERTS)
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


# ----------------------------------------------------------------------------- tokenwise


@pytest.fixture(scope="module")
def design():
    from tests.engine import tiny_models

    return tiny.tokenwise_design(tiny.special_ids(tiny_models.tokenizer_dir()))


def pinned_functions(release, relative: str, names: tuple[str, ...], **namespace):
    """Functions NAMES of a file of the pinned 0.30.0 tree, compiled alone (no vLLM import),
    the names they use from elsewhere given in NAMESPACE."""
    import ast
    import types

    source = (release("0.30.0") / relative).read_text()
    body = [node for node in ast.parse(source).body
            if isinstance(node, ast.FunctionDef) and node.name in names]
    assert sorted(node.name for node in body) == sorted(names), f"{relative} moved"
    for node in body:
        node.decorator_list = []  # torch.compile and the like: the arithmetic is the body's
    scope = {"torch": torch, **namespace}
    exec(compile(ast.Module(body=body, type_ignores=[]), relative, "exec"), scope)
    return types.SimpleNamespace(**{name: scope[name] for name in names})


def test_the_float64_mhc_is_vllms_torch_reference(release):
    """mhc_pre_float64 and mhc_post_float64 against vLLM 0.30.0's own mhc_pre_torch and
    mhc_post_torch (kernels/mhc/torch.py, run from the pinned file) on bf16 streams."""
    vllm_mhc = pinned_functions(release, "vllm/model_executor/kernels/mhc/torch.py",
                                ("mhc_pre_torch", "mhc_post_torch"))
    generator = torch.Generator().manual_seed(3)
    n, hidden = tiny.STREAMS, tiny.HIDDEN
    streams = torch.randn(9, n, hidden, generator=generator).to(torch.bfloat16)
    fn = torch.randn((2 + n) * n, n * hidden, generator=generator) * 0.02
    scale, base = torch.tensor([1.0, 0.7, 1.3]), torch.randn((2 + n) * n, generator=generator)
    post, comb, layer_input = vllm_mhc.mhc_pre_torch(
        streams, fn, scale, base, tiny.RMS_EPS, tiny.HC_EPS, tiny.HC_EPS, tiny.HC_POST_MULT,
        tiny.HC_SINKHORN)
    ours = tiny.mhc_pre_float64(streams.double(), fn, scale, base)
    assert torch.allclose(ours[0], post.squeeze(-1).double(), rtol=1e-5, atol=1e-6)
    assert torch.allclose(ours[1], comb.double(), rtol=1e-5, atol=1e-6)
    assert torch.allclose(ours[2], layer_input.double(), rtol=2 ** -7, atol=1e-3)
    x = torch.randn(9, hidden, generator=generator).to(torch.bfloat16)
    theirs = vllm_mhc.mhc_post_torch(x, streams, post, comb)
    assert torch.allclose(tiny.mhc_post_float64(x.double(), streams.double(), post.squeeze(
        -1).double(), comb.double()), theirs.double(), rtol=2 ** -7, atol=1e-2)
    wrong = tiny.mhc_post_float64(x.double(), streams.double(), post.squeeze(-1).double(),
                                  comb.double().transpose(1, 2))  # rows for columns
    assert not torch.allclose(wrong, theirs.double(), rtol=2 ** -7, atol=1e-2)


def test_the_float64_router_is_vllms_grouped_topk(release):
    import types

    envs = types.SimpleNamespace(VLLM_USE_FUSED_MOE_GROUPED_TOPK=False,
                                 VLLM_BATCH_INVARIANT=False)
    vllm_router = pinned_functions(
        release, "vllm/model_executor/layers/fused_moe/router/grouped_topk_router.py",
        ("grouped_topk",), envs=envs, current_platform=types.SimpleNamespace(
            is_cuda=lambda: False, is_xpu=lambda: False))
    assert vllm_router.grouped_topk.__code__.co_filename.endswith("grouped_topk_router.py")
    generator = torch.Generator().manual_seed(4)
    x = torch.randn(64, tiny.HIDDEN, generator=generator, dtype=torch.float64)
    router = torch.randn(tiny.EXPERTS, tiny.HIDDEN, generator=generator, dtype=torch.float64)
    router /= tiny.HIDDEN ** 0.5
    weights, ids, _ = tiny.route(x, router)
    config = tiny.config("tokenwise")
    theirs_w, theirs_ids = vllm_router.grouped_topk(
        x, x @ router.T, tiny.TOPK, config["norm_topk_prob"], config["n_group"],
        config["topk_group"], config["scoring_func"], config["routed_scaling_factor"])
    order = ids.argsort(-1)
    theirs_order = theirs_ids.long().argsort(-1)
    assert torch.equal(ids.gather(1, order), theirs_ids.long().gather(1, theirs_order))
    assert torch.allclose(weights.gather(1, order).float(), theirs_w.gather(1, theirs_order),
                          rtol=1e-6)


def test_the_design_holds_in_bf16(design):
    """A bf16 emulation of the forward (what vLLM keeps in bf16 rounded as it would) keeps every
    designed choice with its margin, stock's choice at the flip, and the aux states of rows the
    router decides within part d's tolerance, far from the untapped layers."""
    from tests.gpu import glm5next_engine as part_d

    tensors = design.tensors["tokenwise"]
    experts = tiny.intended_experts(tensors)
    everything = torch.arange(tiny.VOCAB)
    exact = tiny.tokenwise_forward(tensors, everything, experts=experts)
    rounded = tiny.tokenwise_forward(tensors, everything, experts=experts,
                                     rounding=torch.bfloat16)
    stock = tiny.tokenwise_forward(tensors, everything, stock=True, experts=experts,
                                   rounding=torch.bfloat16)
    head = tensors["lm_head.weight"].double()
    path = torch.tensor(design.path)
    top = (rounded["hidden"] @ head.T).topk(2, -1)
    assert torch.equal(top.indices[path, 0], torch.tensor(design.next_token)[path])
    assert (top.values[path, 0] - top.values[path, 1]).min() >= tiny.MARGIN_NATS
    flip = design.path[tiny.FLIP_AT]
    assert (stock["hidden"][flip] @ head.T).argmax().item() == design.stock_choice
    judged = exact["routing_gap"] >= tiny.ROUTING_GAP
    assert judged.sum() >= 200
    for tap in tiny.DRAFT_TAPS:
        truth = exact["states"][tap][judged]
        norm = truth.norm(dim=-1)
        error = ((rounded["states"][tap][judged] - truth).norm(dim=-1) / norm).max()
        assert error <= part_d.AUX_TOLERANCE / 2, (tap, error)
        apart = min(((exact["states"][o][judged] - truth).norm(dim=-1) / norm).min()
                    for o in range(len(tiny.MLP_TYPES)) if o != tap)
        assert apart >= part_d.AUX_APART * part_d.AUX_TOLERANCE, (tap, apart)
    assert design.summary()["min_margin_nats"] >= tiny.MARGIN_NATS
    assert len(design.path) == tiny.PATH_TOKENS >= part_d.MAX_TOKENS + 1
    assert not set(design.path) & set(design.summary().get("special", []))


def test_v8s_fold_of_the_tokenwise_checkpoint_is_its_twin(design):
    """What the fold route hands vLLM's kernel for each expert of `tokenwise` (patches/v8's
    own fold, run here) is the twin's w13 bit for bit; stock's (the gate's global for both
    halves) is not."""
    import importlib.util

    from tests.vllm.conftest import REPO_ROOT

    import sys

    spec = importlib.util.spec_from_file_location(
        "glm53_moe_scales_under_test", REPO_ROOT / "patches/v8/moe_global_scales.py")
    fix = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = fix  # its dataclasses look their module up
    try:
        spec.loader.exec_module(fix)
    finally:
        del sys.modules[spec.name]

    def w13(tensors, layer):
        e = [f"model.layers.{layer}.mlp.experts.{i}" for i in range(tiny.EXPERTS)]
        scales = torch.stack([torch.cat([tensors[f"{x}.gate_proj.weight_scale"],
                                         tensors[f"{x}.up_proj.weight_scale"]]) for x in e])
        globals_ = torch.stack([torch.stack([tensors[f"{x}.gate_proj.weight_scale_2"],
                                             tensors[f"{x}.up_proj.weight_scale_2"]])
                                for x in e])
        packed = torch.stack([torch.cat([tensors[f"{x}.gate_proj.weight"],
                                         tensors[f"{x}.up_proj.weight"]]) for x in e])
        return scales, globals_, packed

    for layer in range(1, len(tiny.MLP_TYPES)):
        scales, globals_, packed = w13(design.tensors["tokenwise"], layer)
        twin_scales, twin_globals, twin_packed = w13(design.tensors["twin"], layer)
        folded, folded_globals, report = fix.fold(scales, globals_, packed)
        assert torch.equal(packed, twin_packed)
        assert torch.equal(folded.view(torch.uint8), twin_scales.view(torch.uint8))
        assert torch.equal(folded_globals, twin_globals)
        assert report.folded == sum(r != 1.0 for r in tiny.TWIN_RATIOS)
        assert not torch.equal(scales.view(torch.uint8), twin_scales.view(torch.uint8))


def test_the_designed_drafter_drafts_the_table(design):
    made = tiny.designed_drafter_tensors(design.next_token, mask_id=0)
    codes = made["layers.0.mlp_conv.base_kernel"][1, 1:, 2].float().tolist()
    assert codes == list(tiny.DESIGNED_CODE)
    assert tiny.DESIGNED_CODE == (0.0,) * tiny.DESIGN_RIGHT + (-1.0,) * (
        tiny.DRAFT_K - tiny.DESIGN_RIGHT)
    with pytest.raises(ValueError, match="mask token"):
        tiny.designed_drafter_tensors([0] * tiny.VOCAB, mask_id=0)
