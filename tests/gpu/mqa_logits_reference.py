"""A float32 torch stand-in for DeepGEMM's two MQA logits kernels, for the GPU tier only.

Glm5Next's sparse indexer scores its keys with `vllm.utils.deep_gemm.fp8_fp4_mqa_logits`
(prefill) and `fp8_fp4_paged_mqa_logits` (decode). In vLLM 0.30.0 both go to DeepGEMM's
compiled module alone, which does not load under the H200's torch 2.11 (docs/gpu-tier.md).
This module computes what their docstrings in `vllm/utils/deep_gemm.py` say, so that a tiny
Glm5Next can run every other kernel of its forward for real. It is a stand-in for ONE kernel
family, named so in every result (`STAND_IN`); it proves nothing about DeepGEMM itself.

The contract, as read from 0.30.0's docstrings and its callers in
`model_executor/layers/sparse_attn_indexer_kpool.py`:
- logits[m, n] = sum_h weights[m, h] * relu(q[m, h] . k[n]), with q and k dequantized:
  FP8 Q as it is (its per-token scale already folded into `weights`), FP8 K times its fp32
  scale per token; MXFP4 Q and K as e2m1 nibbles (low nibble first) times a UE8M0 scale per
  32 values (`MXFP4_BLOCK`).
- prefill: row m reads keys n with cu_seqlen_ks[m] <= n < cu_seqlen_ke[m].
- decode (paged): request b's row j reads its context through block_tables[b]; with
  context_lens [B] the row's limit is context_lens[b] - next_n + j + 1 (row j is the j-th of
  the last next_n positions), with [B, next_n] it is context_lens[b, j]. FP8 pages are
  [num_blocks, block_size, 1, D + 4] uint8 whose bytes run all values of the block first,
  then each token's fp32 scale (as DeepGEMM's own test reference reads them); MXFP4 pages
  the same, values D/2 bytes a token then scales D/32 bytes a token.
- clean_logits=True puts -inf where a row reads nothing. With False the kernel leaves those
  entries unwritten; here they are NaN, so a caller that reads them shows up instead of
  being fed plausible numbers.
Arguments the contract does not cover here (`indices` for varlen rows) are refused.
"""

from __future__ import annotations

import torch

STAND_IN = ("tests/gpu/mqa_logits_reference.py: float32 torch stand-in for DeepGEMM's "
            "fp8_fp4_mqa_logits and fp8_fp4_paged_mqa_logits (the indexer's logits only)")
MXFP4_BLOCK = 32
E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
UNWRITTEN = float("nan")


class ContractError(ValueError):
    """An input the documented contract does not cover; the message names it."""


def e2m1_values(packed: torch.Tensor) -> torch.Tensor:
    """float32 [..., 2 * bytes] from packed e2m1 pairs, the low nibble first."""
    raw = packed.view(torch.uint8).to(torch.int64)
    grid = torch.tensor(E2M1, dtype=torch.float32, device=packed.device)
    pairs = []
    for nibble in (raw & 0xF, raw >> 4):
        sign = 1.0 - 2.0 * (nibble >> 3).to(torch.float32)
        pairs.append(grid[nibble & 0x7] * sign)
    return torch.stack(pairs, -1).flatten(-2)


def ue8m0_scales(scales: torch.Tensor, blocks: int) -> torch.Tensor:
    """float32 [..., blocks] powers of two from UE8M0 bytes, given as uint8 [..., blocks] or
    packed four to an int32 (little-endian) [..., blocks / 4], as DeepGEMM's scales are."""
    raw = scales if scales.dtype == torch.uint8 else scales.contiguous().view(torch.uint8)
    if raw.shape[-1] != blocks:
        raise ContractError(f"MXFP4 scales: {raw.shape[-1]} bytes a row, expected {blocks}")
    return torch.exp2(raw.to(torch.float32) - 127.0)


def mxfp4_dequantized(values: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    plain = e2m1_values(values)
    blocks = plain.shape[-1] // MXFP4_BLOCK
    if scales.dtype == torch.int32 and scales.shape == values.shape[:-1]:
        scales = scales.unsqueeze(-1)  # one int32 (four scales) a row, squeezed by the caller
    factor = ue8m0_scales(scales, blocks)
    return (plain.unflatten(-1, (blocks, MXFP4_BLOCK)) * factor[..., None]).flatten(-2)


def query(q: tuple[torch.Tensor, torch.Tensor | None]) -> torch.Tensor:
    values, scales = q
    if scales is None:
        if values.dtype != torch.float8_e4m3fn:
            raise ContractError(f"FP8 Q: dtype {values.dtype}, expected float8_e4m3fn")
        return values.to(torch.float32)
    if values.dtype not in (torch.uint8, torch.int8):
        raise ContractError(f"MXFP4 Q: dtype {values.dtype}, expected packed uint8 or int8")
    return mxfp4_dequantized(values, scales)


def keys(kv: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    values, scales = kv
    if values.dtype == torch.float8_e4m3fn:
        return values.to(torch.float32) * scales.to(torch.float32).reshape(-1, 1)
    if values.dtype not in (torch.uint8, torch.int8):
        raise ContractError(f"K: dtype {values.dtype}, expected float8_e4m3fn or packed fp4")
    return mxfp4_dequantized(values, scales)


def weighted_scores(q: torch.Tensor, k: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """[M, N]: sum over heads of weights[m, h] * relu(q[m, h] . k[n]), in float32."""
    if weights.dtype != torch.float32 or weights.shape != q.shape[:2]:
        raise ContractError(f"weights: {tuple(weights.shape)} {weights.dtype}, expected "
                            f"{tuple(q.shape[:2])} float32")
    per_head = torch.einsum("mhd,nd->mhn", q, k).relu()
    return (per_head * weights[:, :, None]).sum(1)


def fp8_fp4_mqa_logits(q, kv, weights, cu_seqlen_ks, cu_seqlen_ke,
                       clean_logits: bool) -> torch.Tensor:
    qf, kf = query(q), keys(kv)
    if qf.shape[-1] != kf.shape[-1]:
        raise ContractError(f"Q head dim {qf.shape[-1]} != K's {kf.shape[-1]}")
    logits = weighted_scores(qf, kf, weights)
    n = torch.arange(kf.shape[0], device=kf.device)
    inside = (n[None, :] >= cu_seqlen_ks[:, None]) & (n[None, :] < cu_seqlen_ke[:, None])
    return logits.masked_fill(~inside, -torch.inf if clean_logits else UNWRITTEN)


def paged_keys(kv_cache: torch.Tensor, dim: int, fp4: bool) -> torch.Tensor:
    """float32 [num_blocks, block_size, dim] from the paged cache's bytes."""
    num_blocks, block_size = kv_cache.shape[:2]
    value_bytes = dim // 2 if fp4 else dim
    scale_bytes = dim // MXFP4_BLOCK if fp4 else 4
    if kv_cache.shape[-1] != value_bytes + scale_bytes:
        raise ContractError(f"kv_cache: {kv_cache.shape[-1]} bytes a token, expected "
                            f"{value_bytes + scale_bytes} for head dim {dim}")
    page = kv_cache.reshape(num_blocks, -1).view(torch.uint8)
    values = page[:, :block_size * value_bytes].reshape(num_blocks, block_size, value_bytes)
    scales = page[:, block_size * value_bytes:].reshape(num_blocks, block_size, scale_bytes)
    if fp4:
        return mxfp4_dequantized(values, scales)
    fp8 = values.contiguous().view(torch.float8_e4m3fn).to(torch.float32)
    return fp8 * scales.contiguous().view(torch.float32)


def fp8_fp4_paged_mqa_logits(q, kv_cache, weights, context_lens, block_tables,
                             schedule_metadata, max_model_len: int, clean_logits: bool,
                             indices: torch.Tensor | None = None) -> torch.Tensor:
    """Capturable in a CUDA graph: every shape follows from the arguments' shapes alone (each
    request's whole block table is read and masked by its limits), and no value goes to the
    host; the contract check on the limits is a host check outside capture and a device
    assertion inside it."""
    del schedule_metadata  # work distribution across SMs: no bearing on the values
    if indices is not None:
        raise ContractError("indices (varlen rows) is outside this stand-in's contract")
    qf = query(q)
    if qf.dim() != 4:
        raise ContractError(f"paged Q: {qf.dim()} dims, expected [B, next_n, H, D]")
    batch, next_n, heads, dim = qf.shape
    if weights.dtype != torch.float32 or tuple(weights.shape) != (batch * next_n, heads):
        raise ContractError(f"weights: {tuple(weights.shape)} {weights.dtype}, expected "
                            f"{(batch * next_n, heads)} float32")
    if context_lens.dim() == 1:
        last = context_lens.to(torch.int64)[:, None]
        limits = last - next_n + 1 + torch.arange(next_n, device=last.device)[None, :]
    else:
        limits = context_lens.to(torch.int64).reshape(batch, next_n)
    if _capturing(qf):
        torch._assert_async((limits <= max_model_len).all(),
                            "paged MQA logits: a context exceeds max_model_len")
    elif int(limits.max()) > max_model_len:
        raise ContractError(f"a context of {int(limits.max())} exceeds max_model_len "
                            f"{max_model_len}")
    num_blocks, block_size = kv_cache.shape[:2]
    width = block_tables.shape[1]
    # each request's pages in table order (entries past its context are masked below)
    table = block_tables.to(torch.int64).clamp(0, num_blocks - 1)
    pages = paged_keys(kv_cache[table.reshape(-1)], dim, fp4=q[1] is not None)
    columns = min(width * block_size, max_model_len)
    context = pages.reshape(batch, width * block_size, dim)[:, :columns]
    per_head = torch.einsum("bjhd,bnd->bjhn", qf, context).relu()
    scores = (per_head * weights.reshape(batch, next_n, heads, 1)).sum(2)
    fill = -torch.inf if clean_logits else UNWRITTEN
    inside = torch.arange(columns, device=qf.device)[None, None, :] < limits[:, :, None]
    logits = torch.full((batch * next_n, max_model_len), fill, dtype=torch.float32,
                        device=qf.device)
    logits[:, :columns] = scores.masked_fill(~inside, fill).reshape(batch * next_n, columns)
    return logits


def _capturing(tensor: torch.Tensor) -> bool:
    return tensor.is_cuda and torch.cuda.is_current_stream_capturing()


def get_paged_mqa_logits_metadata(context_lens, block_size, num_sms, indices=None):
    """Scheduling metadata the paged kernel alone reads: zeros of the shape vLLM's buffer
    takes ([slots + 1, 2] int32), since the stand-in ignores it."""
    del block_size, indices
    from vllm.utils.deep_gemm import _paged_mqa_logits_schedule_slots

    next_n = context_lens.shape[1] if context_lens.dim() == 2 else 1
    slots = _paged_mqa_logits_schedule_slots(num_sms, next_n)
    return torch.zeros(slots + 1, 2, dtype=torch.int32, device=context_lens.device)


REPLACED = ("fp8_fp4_mqa_logits", "fp8_fp4_paged_mqa_logits", "get_paged_mqa_logits_metadata")


# vLLM 0.30.0's modules that ask `has_deep_gemm()` before taking the kernels above (the two
# indexers refuse to build without it, the backend picks its decode shapes by it)
INDEXER_MODULES = ("vllm.model_executor.layers.sparse_attn_indexer",
                   "vllm.model_executor.layers.sparse_attn_indexer_kpool",
                   "vllm.v1.attention.backends.mla.indexer")


def deep_gemm_present() -> bool:
    """What the indexer's modules are told: DeepGEMM's three kernels they take are here."""
    return True


def install_presence(module) -> None:
    """Answer `has_deep_gemm()` with yes in `module`, one of INDEXER_MODULES, so it takes the
    path it takes where DeepGEMM loads; every other module still asks vLLM's own check
    (False here: DeepGEMM's module does not load), so no other DeepGEMM kernel is chosen."""
    import sys

    module.has_deep_gemm = deep_gemm_present
    print(f"gpu tier: {module.__name__} sees DeepGEMM present: {STAND_IN}", file=sys.stderr,
          flush=True)


def install(deep_gemm) -> None:
    """Point the functions in REPLACED of `deep_gemm` (vllm.utils.deep_gemm) at this module's,
    and say so once on stderr. Called while that module is first imported (tests/gpu/standin),
    so a module that imports them by name binds the stand-in."""
    import sys

    for name in REPLACED:
        setattr(deep_gemm, name, globals()[name])
    print(f"gpu tier: stand-in installed: {STAND_IN}", file=sys.stderr, flush=True)
