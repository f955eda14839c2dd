"""The MoE scale fold on its own (patches/v8/moe_global_scales.py, installed by v8_moe_scales):
equal experts untouched bit for bit, a power-of-two ratio folded exactly, no block scale past
E4M3's 448, and the per-model report. vLLM's own method around it: tests/vllm."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

HELPER = Path(__file__).resolve().parents[2] / "patches/v8/moe_global_scales.py"


@pytest.fixture(scope="module")
def helper():
    spec = importlib.util.spec_from_file_location("moe_global_scales", HELPER)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def layer(globals_: list[list[float]], rows: int = 4, blocks: int = 3, top: float = 448.0):
    """E4M3 block scales spanning (0, top], gate rows first; packed fp4 all ones (value 0.5)."""
    experts = len(globals_)
    values = torch.linspace(0.02, top, experts * 2 * rows * blocks).reshape(experts, 2 * rows,
                                                                              blocks)
    scales = values.to(torch.float8_e4m3fn)
    packed = torch.full((experts, 2 * rows, blocks * 8), 0x11, dtype=torch.uint8)
    return scales, torch.tensor(globals_, dtype=torch.float32), packed


def effective(scales, globals_, rows):
    """Each row's block scales times its half's global, in float64."""
    per_row = globals_.double().repeat_interleave(rows, 1)[:, :, None]
    return scales.double() * per_row


def test_equal_experts_are_untouched_bit_for_bit(helper):
    scales, globals_, packed = layer([[0.5, 0.5], [2e-3, 2e-3]])
    new_scales, new_globals, report = helper.fold(scales, globals_, packed)
    assert torch.equal(new_scales.view(torch.uint8), scales.view(torch.uint8))
    assert torch.equal(new_globals, globals_)
    assert (report.folded, report.experts) == (0, 2)


def test_a_power_of_two_ratio_folds_exactly(helper):
    scales, globals_, packed = layer([[0.25, 0.5]], top=200.0)
    new_scales, new_globals, report = helper.fold(scales, globals_, packed)
    assert new_globals[0, 0] == new_globals[0, 1]
    assert torch.equal(effective(new_scales, new_globals, 4), effective(scales, globals_, 4))
    assert report.folded == 1 and report.largest_ratio == pytest.approx(2.0)


def test_no_block_scale_passes_448_and_each_expert_keeps_a_half_exact(helper):
    scales, globals_, packed = layer([[1.0, 1.7], [3.0, 0.3], [1.0, 1.01]])
    new_scales, new_globals, report = helper.fold(scales, globals_, packed)
    assert torch.isfinite(new_scales.float()).all() and new_scales.float().max() <= 448
    before, after = effective(scales, globals_, 4), effective(new_scales, new_globals, 4)
    for expert in range(3):
        halves = [torch.equal(after[expert, h * 4:(h + 1) * 4], before[expert, h * 4:(h + 1) * 4])
                  for h in (0, 1)]
        assert any(halves), expert
    # the other half within half an E4M3 step (3 mantissa bits) of the checkpoint's
    assert ((after - before).abs() <= 2.0 ** -4 * before + 1e-12).all()
    assert report.folded == 3 and report.largest_ratio == pytest.approx(10.0, rel=1e-6)


def test_the_model_report_sums_its_layers(helper):
    total = helper.FoldReport()
    for globals_ in ([[1.0, 2.0], [1.0, 1.0]], [[1.0, 1.0], [4.0, 1.0]]):
        total.add(helper.fold(*layer(globals_, top=100.0))[2])
    assert (total.layers, total.experts, total.folded) == (2, 4, 2)
    assert total.largest_ratio == pytest.approx(4.0)
    assert total.line().startswith("4 experts in 2 layers; 2 folded into block scales")
    assert total.line().endswith("(largest gate/up ratio 4; layers per route: fold 2)")


class Marlin:
    """Stands in for the experts class the exact route needs."""


class FlashInferCutlass:
    """Stands in for an experts class whose activation runs inside the kernel."""


@pytest.fixture()
def routed(helper, monkeypatch):
    monkeypatch.setattr(helper, "exact_experts_class", lambda: Marlin)
    monkeypatch.delenv(helper.ROUTE_ENV, raising=False)
    return helper


def method(experts_cls):
    return type("Method", (), {"experts_cls": experts_cls})()


def test_the_route_is_exact_on_marlin_and_a_fold_elsewhere_unless_asked(routed, monkeypatch):
    assert routed.choose_route(method(Marlin)) == "exact"
    assert routed.choose_route(method(FlashInferCutlass)) == "fold"
    monkeypatch.setenv(routed.ROUTE_ENV, "fold")
    assert routed.choose_route(method(Marlin)) == "fold"
    monkeypatch.setenv(routed.ROUTE_ENV, "exact")
    with pytest.raises(RuntimeError, match="GLM53_MOE_SCALE_ROUTE=exact: experts "
                                           "FlashInferCutlass run the activation inside"):
        routed.choose_route(method(FlashInferCutlass))
    monkeypatch.setenv(routed.ROUTE_ENV, "exactly")
    with pytest.raises(ValueError, match="GLM53_MOE_SCALE_ROUTE='exactly': use one of auto"):
        routed.choose_route(method(Marlin))


def seen_by_activation(helper, ratios, topk_ids, expert_map=None):
    """What the wrapped activation receives: rows of (gate 1, 1 | up 1, 1), top-k slots."""
    received = {}

    def activation(kind, output, input, *, topk_ids=None, expert_map=None):
        received.update(kind=kind, input=input.clone(), topk_ids=topk_ids)

    rows = topk_ids.numel()
    inputs = torch.ones(rows, 4, dtype=torch.bfloat16)
    helper.UpHalfRatio(activation, ratios)("silu", None, inputs, topk_ids=topk_ids,
                                           expert_map=expert_map)
    return received


def test_each_row_s_up_half_is_scaled_by_its_own_expert_s_ratio(helper):
    ratios = torch.tensor([1.0, 1.3, 0.25, 10.0])
    topk_ids = torch.tensor([[3, 1], [0, 2]], dtype=torch.int32)  # rows: token-major
    received = seen_by_activation(helper, ratios, topk_ids)
    up = received["input"][:, 2:].float()
    expected = torch.tensor([10.0, 1.3, 1.0, 0.25]).bfloat16().float()
    assert torch.equal(up, expected[:, None].expand(-1, 2))
    assert torch.equal(received["input"][:, :2].float(), torch.ones(4, 2))  # gate untouched
    assert received["kind"] == "silu" and received["topk_ids"] is topk_ids


def test_a_ratio_is_applied_in_float32_and_rounded_once(helper):
    """1.3 is not a bfloat16 value: rounded first, the product would be 1.296875 x up."""
    received = seen_by_activation(helper, torch.tensor([1.3]), torch.tensor([[0]]))
    assert received["input"][0, 2].item() == torch.tensor(1.3).bfloat16().item()
    up = torch.tensor([3.0], dtype=torch.bfloat16)
    up.mul_(torch.tensor([1.3]))
    assert up.item() == torch.tensor(3.9).bfloat16().item() != (up.new_tensor(1.3) * 3).item()


def test_global_ids_are_mapped_to_the_rank_s_experts(helper):
    ratios = torch.tensor([2.0, 4.0])  # this rank holds global experts 5 and 7
    expert_map = torch.full((8,), -1, dtype=torch.int32)
    expert_map[5], expert_map[7] = 0, 1
    received = seen_by_activation(helper, ratios, torch.tensor([[7, 5]]), expert_map)
    assert received["input"][:, 2].float().tolist() == [4.0, 2.0]


def test_an_activation_call_without_the_row_map_is_refused(helper):
    wrapped = helper.UpHalfRatio(lambda *a, **k: None, torch.tensor([2.0]))
    with pytest.raises(RuntimeError, match="without topk_ids"):
        wrapped("silu", None, torch.ones(1, 4))
