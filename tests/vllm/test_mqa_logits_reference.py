"""The GPU tier's float32 stand-in for DeepGEMM's MQA logits (tests/gpu/mqa_logits_reference.py)
against its contract on CPU: DeepGEMM's own test references as vLLM 0.30.0 carries them
(`fp8_mqa_logits_torch`, `fp8_paged_mqa_logits_torch` in v1/attention/ops/rocm_aiter_mla_sparse.py,
read from the pinned tree at test time), a float64 computation from the raw codes, the window
and page masks, clean_logits, and MXFP4 against FP8 on values both formats hold exactly. A
planted fault must fail the same comparisons."""

from __future__ import annotations

import ast
import sys
import types

import pytest
import torch

from tests.gpu import mqa_logits_reference as ref

PINNED_FILE = "vllm/v1/attention/ops/rocm_aiter_mla_sparse.py"
PINNED = ("fp8_mqa_logits_torch", "fp8_paged_mqa_logits_torch")
HEADS, DIM = 4, 128  # Glm5Next's indexer: 128-dim keys (132-byte states with the scale)


@pytest.fixture(scope="module")
def pinned(release):
    """DeepGEMM's test references from 0.30.0's file, compiled alone (no vLLM import)."""
    source = (release("0.30.0") / PINNED_FILE).read_text()
    wanted = [node for node in ast.parse(source).body
              if isinstance(node, ast.FunctionDef) and node.name in PINNED]
    assert sorted(n.name for n in wanted) == sorted(PINNED), "the pinned references moved"
    namespace = {"torch": torch, "F": torch.nn.functional,
                 "current_platform": types.SimpleNamespace(fp8_dtype=lambda: torch.float8_e4m3fn)}
    exec(compile(ast.Module(body=wanted, type_ignores=[]), PINNED_FILE, "exec"), namespace)
    math_utils = types.ModuleType("vllm.utils.math_utils")
    math_utils.cdiv = lambda a, b: -(-a // b)
    saved = sys.modules.get(math_utils.__name__)
    sys.modules[math_utils.__name__] = math_utils  # the paged reference imports cdiv inside
    yield types.SimpleNamespace(**{name: namespace[name] for name in PINNED})
    if saved is None:
        del sys.modules[math_utils.__name__]
    else:
        sys.modules[math_utils.__name__] = saved


def fp8_rows(generator, *shape):
    return (torch.randn(*shape, generator=generator) * 2).to(torch.float8_e4m3fn)


def close(a: torch.Tensor, b: torch.Tensor, rel: float) -> bool:
    """Same -inf/NaN pattern, finite entries within rel of the largest magnitude."""
    if not torch.equal(torch.isfinite(a), torch.isfinite(b)) or \
            not torch.equal(torch.isnan(a), torch.isnan(b)):
        return False
    finite = torch.isfinite(a)
    scale = b[finite].abs().max().clamp_min(1e-30)
    return bool(((a[finite] - b[finite]).abs() <= rel * scale).all())


def prefill_case(seed=0, rows=6, keys=40):
    generator = torch.Generator().manual_seed(seed)
    q = fp8_rows(generator, rows, HEADS, DIM)
    k = fp8_rows(generator, keys, DIM)
    k_scale = torch.rand(keys, generator=generator) + 0.5
    weights = torch.randn(rows, HEADS, generator=generator)
    ks = torch.tensor([0, 0, 3, 10, 17, 39][:rows], dtype=torch.int32)
    ke = torch.tensor([1, 9, 12, 30, 40, 40][:rows], dtype=torch.int32)
    return q, (k, k_scale), weights, ks, ke


def float64_logits(q, k, weights):
    return (torch.einsum("mhd,nd->mhn", q.double(), k.double()).relu()
            * weights.double()[:, :, None]).sum(1)


def test_prefill_fp8_matches_deepgemm_reference_and_float64(pinned):
    q, kv, weights, ks, ke = prefill_case()
    mine = ref.fp8_fp4_mqa_logits((q, None), kv, weights, ks, ke, clean_logits=True)
    theirs = pinned.fp8_mqa_logits_torch(q, kv, weights, ks, ke)
    assert close(mine, theirs, 2 ** -7)  # theirs rounds each head's product to bf16
    exact = float64_logits(q, kv[0].double() * kv[1].double()[:, None], weights)
    n = torch.arange(kv[0].shape[0])
    inside = (n >= ks[:, None].long()) & (n < ke[:, None].long())
    assert torch.isneginf(mine[~inside]).all()
    assert torch.allclose(mine[inside].double(), exact[inside], rtol=1e-5, atol=1e-3)


def test_window_masks_and_clean_logits():
    q, kv, weights, ks, ke = prefill_case(seed=1)
    clean = ref.fp8_fp4_mqa_logits((q, None), kv, weights, ks, ke, clean_logits=True)
    unclean = ref.fp8_fp4_mqa_logits((q, None), kv, weights, ks, ke, clean_logits=False)
    for row, (start, end) in enumerate(zip(ks.tolist(), ke.tolist())):
        assert torch.isfinite(clean[row, start:end]).all()
        assert torch.isneginf(clean[row, :start]).all() and torch.isneginf(clean[row, end:]).all()
        assert torch.isnan(unclean[row, :start]).all() and torch.isnan(unclean[row, end:]).all()
        assert torch.equal(clean[row, start:end], unclean[row, start:end])


def paged_case(seed=2, batch=3, next_n=1, block_size=16, blocks=12):
    """A block-wise FP8 page pool (each block's values, then each token's fp32 scale), a
    shuffled block table, and the same keys contiguous per request."""
    generator = torch.Generator().manual_seed(seed)
    lens = torch.tensor([37, 5, 48][:batch], dtype=torch.int32)
    pool = torch.zeros(blocks, block_size * (DIM + 4), dtype=torch.uint8)
    order = torch.randperm(blocks, generator=generator)
    tables = torch.zeros(batch, 4, dtype=torch.int32)
    contiguous, used = [], 0
    for b, length in enumerate(lens.tolist()):
        k = fp8_rows(generator, 4 * block_size, DIM)
        scale = torch.rand(4 * block_size, generator=generator) + 0.5
        contiguous.append(k.float()[:length] * scale[:length, None])
        for page in range(-(-length // block_size)):
            physical = int(order[used])
            used += 1
            tables[b, page] = physical
            rows = slice(page * block_size, (page + 1) * block_size)
            pool[physical, :block_size * DIM] = k[rows].view(torch.uint8).flatten()
            pool[physical, block_size * DIM:] = scale[rows].view(torch.uint8).flatten()
    q = fp8_rows(generator, batch, next_n, HEADS, DIM)
    weights = torch.randn(batch * next_n, HEADS, generator=generator)
    return q, pool.view(blocks, block_size, 1, DIM + 4), weights, lens, tables, contiguous


def test_paged_fp8_matches_deepgemm_reference_through_a_shuffled_table(pinned):
    q, cache, weights, lens, tables, _ = paged_case()
    mine = ref.fp8_fp4_paged_mqa_logits((q, None), cache, weights, lens, tables, None, 64,
                                        clean_logits=True)
    theirs = pinned.fp8_paged_mqa_logits_torch(q, cache, weights, lens, tables, 64)
    assert close(mine, theirs, 1e-5)
    for b, length in enumerate(lens.tolist()):
        assert torch.isfinite(mine[b, :length]).all() and torch.isneginf(mine[b, length:]).all()


@pytest.mark.parametrize("two_d", [False, True])
def test_paged_rows_of_a_verify_step_see_their_own_prefix(two_d):
    """next_n = 3 rows per request (a verify step): row j's limit is len - 3 + j + 1 for [B]
    context lengths, or the given [B, 3]; each row equals float64 on the contiguous keys."""
    next_n = 3
    q, cache, weights, lens, tables, contiguous = paged_case(seed=3, next_n=next_n)
    limits = lens[:, None].long() - next_n + 1 + torch.arange(next_n)[None, :]
    context = limits.to(torch.int32) if two_d else lens
    for clean in (True, False):
        out = ref.fp8_fp4_paged_mqa_logits((q, None), cache, weights, context, tables, None,
                                           64, clean_logits=clean)
        for b in range(lens.shape[0]):
            exact = float64_logits(q[b], contiguous[b], weights[b * next_n:(b + 1) * next_n])
            for j in range(next_n):
                row, limit = out[b * next_n + j], int(limits[b, j])
                assert torch.allclose(row[:limit].double(), exact[j, :limit], rtol=1e-5,
                                      atol=1e-3)
                beyond = row[limit:]
                assert (torch.isneginf(beyond) if clean else torch.isnan(beyond)).all()


def mxfp4_case(seed=4, rows=3, keys=20):
    """MXFP4 Q and K from random codes and UE8M0 exponents; their float64 values computed from
    the codes by the e2m1 formula (not the module's table); the same values as FP8."""
    generator = torch.Generator().manual_seed(seed)

    def make(*shape):
        codes = torch.randint(0, 16, (*shape, DIM), generator=generator)
        exponents = torch.randint(124, 130, (*shape, DIM // ref.MXFP4_BLOCK),
                                  generator=generator)
        magnitude_bits, sign = codes & 7, 1 - 2 * (codes >> 3)
        e, m = magnitude_bits >> 1, magnitude_bits & 1
        plain = torch.where(e == 0, m * 0.5, 2.0 ** (e - 1) * (1 + m * 0.5)) * sign
        value = plain.double() * (2.0 ** (exponents.double() - 127)).repeat_interleave(
            ref.MXFP4_BLOCK, -1)
        packed = (codes[..., 0::2] | (codes[..., 1::2] << 4)).to(torch.uint8)
        scales = exponents.to(torch.uint8).contiguous().view(torch.int32)  # four a word
        return packed, scales, value

    q_packed, q_scales, q_value = make(rows, HEADS)
    k_packed, k_scales, k_value = make(keys)
    weights = torch.randn(rows, HEADS, generator=generator)
    return (q_packed, q_scales, q_value), (k_packed, k_scales, k_value), weights


def test_mxfp4_path_equals_float64_and_the_fp8_path_on_shared_values():
    (qp, qs, qv), (kp, kscale, kv), weights = mxfp4_case()
    keys = kv.shape[0]
    ks = torch.zeros(qp.shape[0], dtype=torch.int32)
    ke = torch.full_like(ks, keys)
    fp4 = ref.fp8_fp4_mqa_logits((qp.view(torch.int8), qs), (kp.view(torch.int8),
                                                            kscale.squeeze(-1)), weights,
                                 ks, ke, clean_logits=True)
    assert torch.allclose(fp4.double(), float64_logits(qv, kv, weights), rtol=1e-5, atol=1e-4)
    # every value is e2m1 x 2^-3..2^2: exact in E4M3, so the FP8 path must agree
    fp8 = ref.fp8_fp4_mqa_logits((qv.to(torch.float8_e4m3fn), None),
                                 (kv.to(torch.float8_e4m3fn), torch.ones(keys)), weights,
                                 ks, ke, clean_logits=True)
    assert torch.equal(qv.to(torch.float8_e4m3fn).double(), qv)
    assert torch.allclose(fp4, fp8, rtol=1e-6, atol=1e-5)


def test_planted_faults_fail_the_comparisons(pinned, monkeypatch):
    q, kv, weights, ks, ke = prefill_case()
    theirs = pinned.fp8_mqa_logits_torch(q, kv, weights, ks, ke)
    off_by_one = ref.fp8_fp4_mqa_logits((q, None), kv, weights, ks, ke + 1, clean_logits=True)
    assert not close(off_by_one, theirs, 2 ** -7)
    q_p, cache, w_p, lens, tables, _ = paged_case()
    theirs_paged = pinned.fp8_paged_mqa_logits_torch(q_p, cache, w_p, lens, tables, 64)

    def per_token_pages(kv_cache, dim, fp4):  # the layout fault: one token's bytes together
        values = kv_cache[..., :dim].contiguous().view(torch.float8_e4m3fn).float()
        return (values * kv_cache[..., dim:].contiguous().view(torch.float32)).squeeze(2)

    monkeypatch.setattr(ref, "paged_keys", per_token_pages)
    wrong = ref.fp8_fp4_paged_mqa_logits((q_p, None), cache, w_p, lens, tables, None, 64,
                                         clean_logits=True)
    assert not close(wrong, theirs_paged, 1e-5)
    monkeypatch.undo()
    (qp, qs, qv), (kp, kscale, kv4), w4 = mxfp4_case()
    # Q's nibbles read high first (both Q's and K's swapped alike permute the dimensions of
    # every dot product, which no logit can show)
    swapped = ((qp >> 4) | (qp << 4)).to(torch.uint8)
    full = torch.full((qp.shape[0],), kv4.shape[0], dtype=torch.int32)
    out = ref.fp8_fp4_mqa_logits((swapped, qs), (kp, kscale.squeeze(-1)), w4,
                                 torch.zeros_like(full), full, clean_logits=True)
    assert not torch.allclose(out.double(), float64_logits(qv, kv4, w4), rtol=1e-5, atol=1e-4)


def test_inputs_outside_the_contract_are_refused():
    q, kv, weights, ks, ke = prefill_case()
    with pytest.raises(ref.ContractError, match="float8_e4m3fn"):
        ref.fp8_fp4_mqa_logits((q.float(), None), kv, weights, ks, ke, clean_logits=True)
    with pytest.raises(ref.ContractError, match="weights"):
        ref.fp8_fp4_mqa_logits((q, None), kv, weights[:, :2], ks, ke, clean_logits=True)
    q_p, cache, w_p, lens, tables, _ = paged_case()
    with pytest.raises(ref.ContractError, match="indices"):
        ref.fp8_fp4_paged_mqa_logits((q_p, None), cache, w_p, lens, tables, None, 64, True,
                                     indices=torch.zeros(3, dtype=torch.int32))
    with pytest.raises(ref.ContractError, match="max_model_len"):
        ref.fp8_fp4_paged_mqa_logits((q_p, None), cache, w_p, lens, tables, None, 40, True)


class HostReads(torch.utils._python_dispatch.TorchDispatchMode):
    """Records each aten op's output shapes, and refuses the ops a CUDA graph cannot hold:
    a value read back to the host (`.item()`, `int()`, `bool()`) or a shape that depends on
    values (nonzero, masked_select, unique)."""

    REFUSED = ("_local_scalar_dense", "nonzero", "masked_select", "unique", "equal")

    def __init__(self):
        super().__init__()
        self.trace: list[tuple[str, tuple]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.__name__
        if any(name.startswith(refused) for refused in self.REFUSED):
            raise AssertionError(f"{name}: reads values on the host or sizes by them")
        out = func(*args, **(kwargs or {}))
        shapes = tuple(tuple(t.shape) for t in (out if isinstance(out, (list, tuple)) else [out])
                       if isinstance(t, torch.Tensor))
        self.trace.append((name, shapes))
        return out


def captured_paged(monkeypatch, lens: torch.Tensor, two_d: bool = False):
    """The paged stand-in as a CUDA graph capture would run it (host checks off), its trace."""
    next_n = 3
    q, cache, weights, _, tables, _ = paged_case(seed=5, next_n=next_n)
    limits = lens[:, None].long() - next_n + 1 + torch.arange(next_n)[None, :]
    context = limits.to(torch.int32) if two_d else lens
    monkeypatch.setattr(ref, "_capturing", lambda tensor: True)
    with HostReads() as mode:
        out = ref.fp8_fp4_paged_mqa_logits((q, None), cache, weights, context, tables, None, 64,
                                           clean_logits=False)
    return out, mode.trace


@pytest.mark.parametrize("two_d", [False, True])
def test_the_paged_stand_in_is_capturable(monkeypatch, two_d):
    """Under capture no value reaches the host and every op and shape follows from the
    arguments' shapes alone: two batches of other context lengths run the same ops on the
    same shapes (a graph captured on one replays the other), with the same values as outside
    capture."""
    first, trace = captured_paged(monkeypatch, torch.tensor([37, 5, 48], dtype=torch.int32),
                                  two_d)
    second, other = captured_paged(monkeypatch, torch.tensor([12, 40, 20], dtype=torch.int32),
                                   two_d)
    assert trace == other and first.shape == second.shape
    monkeypatch.undo()
    q, cache, weights, lens, tables, _ = paged_case(seed=5, next_n=3)
    limits = lens[:, None].long() - 2 + torch.arange(3)[None, :]
    eager = ref.fp8_fp4_paged_mqa_logits((q, None), cache, weights,
                                         limits.to(torch.int32) if two_d else lens, tables,
                                         None, 64, clean_logits=False)
    assert close(first, eager, 0.0)


def test_a_host_read_under_capture_is_caught(monkeypatch):
    """The planted fault of the first GPU run: a value read back to the host while a graph is
    captured (there `int(limits.max())`) fails the capture check."""
    plain = ref.paged_keys

    def reading(kv_cache, dim, fp4):
        int(kv_cache[0, 0, 0, 0])  # a host read, as the old per-request loop made
        return plain(kv_cache, dim, fp4)

    monkeypatch.setattr(ref, "paged_keys", reading)
    with pytest.raises(AssertionError, match="_local_scalar_dense"):
        captured_paged(monkeypatch, torch.tensor([37, 5, 48], dtype=torch.int32))
