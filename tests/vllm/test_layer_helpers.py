"""The helper modules v10 and v11 install, unit-tested against the installed vLLM 0.30.0."""

import importlib.util
from types import SimpleNamespace

import pytest

from tests.vllm.conftest import REPO_ROOT

torch = pytest.importorskip("torch")
interface = pytest.importorskip("vllm.v1.kv_cache_interface")


def load(relative):
    spec = importlib.util.spec_from_file_location(relative.replace("/", "_"), REPO_ROOT / relative)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


draft_kv = load("patches/v11/glm5_next_draft_kv.py")
aux = load("patches/v10/mhc_aux_capture.py")


def sliding(head_size=128, window=2048, block=64):
    return interface.SlidingWindowSpec(
        block_size=block, num_kv_heads=2, head_size=head_size, dtype=torch.bfloat16, sliding_window=window,
    )


@pytest.mark.parametrize("attention_block, draft_block", [(1024, 256), (64, 16), (48, 16), (16, 16), (256, 64)])
def test_draft_block_is_a_quarter_but_at_least_16(attention_block, draft_block):
    assert draft_kv.draft_block_size(attention_block) == draft_block


def test_only_plain_sliding_specs_are_drafter_layers():
    tail = interface.KpoolTailSpec(block_size=64, num_kv_heads=1, head_size=16, dtype=torch.uint8, sliding_window=4)
    target, draft = draft_kv.split_draft_specs({"tail": tail, "d0": sliding()})
    assert list(target) == ["tail"] and list(draft) == ["d0"]


def test_without_drafter_layers_groups_pass_through_unchanged():
    groups = [interface.KVCacheGroupSpec(["a"], sliding(block=64))]
    assert draft_kv.with_draft_group(groups, {}) is groups
    assert draft_kv.with_draft_group(None, {"d0": sliding()}) is None
    assert draft_kv.draft_bytes_per_block(groups[:0]) == 0
    assert draft_kv.draft_kv_cache_tensors([], 10, 100, 0) == []


def test_drafter_group_and_its_tensors():
    anchor = interface.KVCacheGroupSpec(["mla"], interface.FullAttentionSpec(
        block_size=256, num_kv_heads=1, head_size=64, dtype=torch.bfloat16))
    groups = draft_kv.with_draft_group([anchor], {"d0": sliding(block=256), "d1": sliding(block=256)})
    drafter = groups[-1]
    assert drafter.layer_names == ["d0", "d1"] and drafter.kv_cache_spec.block_size == 64
    page = 64 * 2 * 256 * 2
    assert draft_kv.draft_bytes_per_block(groups) == 2 * page
    tensors = draft_kv.draft_kv_cache_tensors(groups, num_blocks=10, size=999, offset=7)
    assert [(t.layers, t.offset, t.layer_stride, t.block_stride, t.size) for t in tensors] == [
        (["d0"], 7, page * 10, page, 999), (["d1"], 7 + page * 10, page * 10, page, 999),
    ]
    config = SimpleNamespace(
        parallel_config=SimpleNamespace(decode_context_parallel_size=1),
        model_config=SimpleNamespace(max_model_len=100_000), max_in_flight_tokens=256,
    )
    assert draft_kv.draft_max_pages(config, groups) == -(-(2047 + 256) // 64) + 1


def test_mixed_page_sizes_or_windows_are_refused_clearly():
    with pytest.raises(ValueError, match=r"KV pages of \[\d+, \d+\] bytes"):
        draft_kv.with_draft_group([object()], {"d0": sliding(128), "d1": sliding(64)})
    anchor = SimpleNamespace(kv_cache_spec=SimpleNamespace(block_size=64))
    with pytest.raises(ValueError, match=r"differ \(windows \[1024, 2048\]\)"):
        draft_kv.with_draft_group([anchor], {"d0": sliding(window=2048), "d1": sliding(window=1024)})


class PostLayer:
    """A previous layer whose post op records its inputs."""

    n = 2

    def __init__(self):
        self.calls = []

    def hc_post(self, x, residual, post, comb):
        self.calls.append((x, residual, post, comb))
        return post * x.unsqueeze(1) + torch.einsum("sij,sih->sjh", comb, residual)


def test_completed_state_materialises_the_deferred_post_and_averages_streams():
    layer = PostLayer()
    x, residual = torch.randn(3, 4), torch.randn(3, 2, 4)
    post, comb = torch.rand(3, 2, 1), torch.rand(3, 2, 2)
    state = aux.completed_hidden_state(layer, x, residual, post, comb)
    expected = (post * x.unsqueeze(1) + torch.einsum("sij,sih->sjh", comb, residual)).mean(dim=1)
    assert torch.allclose(state, expected)
    assert len(layer.calls) == 1


def test_without_deferred_state_the_hidden_state_is_already_complete():
    x = torch.randn(3, 4)
    assert aux.completed_hidden_state(None, x, None, None, None) is x
    with pytest.raises(ValueError, match="deferred mHC state without the layer"):
        aux.completed_hidden_state(None, x, torch.randn(3, 2, 4), torch.rand(3, 2, 1), torch.rand(3, 2, 2))


def test_drafter_tensors_take_the_bases_kvcachetensor_form(monkeypatch):
    import dataclasses

    @dataclasses.dataclass
    class SharedByTensor:  # vLLM 0.27.1/0.28.0 and the fork: one allocation per tensor
        size: int
        shared_by: list
        offset: int = 0
        block_stride: int = 0

    anchor = interface.KVCacheGroupSpec(["mla"], interface.FullAttentionSpec(
        block_size=256, num_kv_heads=1, head_size=64, dtype=torch.bfloat16))
    groups = draft_kv.with_draft_group([anchor], {"d0": sliding(block=256), "d1": sliding(block=256)})
    page = 64 * 2 * 256 * 2
    assert draft_kv.tensor_form() == "layers"  # the installed 0.30.0
    monkeypatch.setattr(draft_kv, "KVCacheTensor", SharedByTensor)
    assert draft_kv.tensor_form() == "shared_by"
    tensors = draft_kv.draft_kv_cache_tensors(groups, num_blocks=10, size=999, offset=7)
    assert tensors == [SharedByTensor(page * 10, ["d0"]), SharedByTensor(page * 10, ["d1"])]

    @dataclasses.dataclass
    class Unknown:
        size: int

    monkeypatch.setattr(draft_kv, "KVCacheTensor", Unknown)
    with pytest.raises(TypeError, match=r"KVCacheTensor has fields \['size'\]"):
        draft_kv.tensor_form()


def test_seam_decorators_are_the_identity_without_a_drafter():
    calls = []

    def _glm5_next_tensor_layout(kv_cache_groups):
        calls.append(list(kv_cache_groups))
        return None

    layout = draft_kv.glm5_next_layout_past_draft(_glm5_next_tensor_layout)
    groups = [interface.KVCacheGroupSpec(["a"], sliding(block=64))]
    assert layout(groups) is None and calls == [[]]  # a plain sliding group is the drafter's
    target = [interface.KVCacheGroupSpec(["m"], interface.FullAttentionSpec(
        block_size=64, num_kv_heads=1, head_size=8, dtype=torch.bfloat16))]
    layout(target)
    assert calls[-1] == target

    def bytes_per_block(kv_cache_groups):
        return 123

    assert draft_kv.bytes_per_block_with_draft(bytes_per_block)(target) == 123
    assert draft_kv.bytes_per_block_with_draft(bytes_per_block).__wrapped__ is bytes_per_block
