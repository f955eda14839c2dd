"""Drafted decoding through the kpool indexer's real Triton kernels: do decode-built pools
equal prefill-built ones?

Loads ``kpool_compress.py`` of a vLLM tree by path (its ``vllm`` imports served by real
triton and tiny stand-ins), prefills each request, then runs verify steps of k drafts of
which a seeded random number is accepted: accepted drafts carry the committed token's key,
rejected ones a key of their own. At the end every complete committed pool of the indexer
cache is compared, byte for byte, with the pool ``kpool_compress_and_write_cache`` writes
when it prefills the same committed tokens. Runs under ``TRITON_INTERPRET=1`` on CPU or on
a GPU with ``--device cuda``. Prints one JSON object.

Mapping variants (what the tail ring and the seed see):
  served   ring = kpool, packed seed address (v11; v13 with GLM53_KPOOL_TAIL_FIX unset)
  fixed    ring = max(kpool, next_pow2(k + kpool - 1)), seed through the view's strides
  no-ring  the fix with ring = kpool        (part 1 reverted)
  no-seed  the fix with the packed seed     (part 2 reverted)
  no-v2    the fix, but V2 slots from the generic one-block mapping (part 3 reverted)
  upstream 0.33.0's kernels with its ring kpool * next_pow2(cdiv(kpool + k, kpool))
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import time
import types

import torch

HEAD_DIM = 128
KPOOL = 4
PAGE = 64  # indexer cache entries per page
POOLS_PER_REQ = 64

SCENARIOS = {  # name -> (k, requests, prefill chunks)
    "k7-c1": (7, 1, 1),
    "k7-c2": (7, 2, 1),
    "mtp-k4-c2": (4, 2, 1),
    "k5-c4": (5, 4, 1),
    "k7-chunked": (7, 1, 3),
}


def load_kernels(path: str, switches: str | None, fix: bool):
    """The kernel module at ``path`` with its vllm imports served by stand-ins."""
    import triton
    import triton.language as tl

    os.environ["GLM53_KPOOL_TAIL_FIX"] = "1" if fix else "0"
    for name in [n for n in sys.modules if n == "vllm" or n.startswith("vllm.")]:
        del sys.modules[name]
    stubs = {
        "vllm": types.ModuleType("vllm"),
        "vllm.triton_utils": types.SimpleNamespace(tl=tl, triton=triton),
        "vllm.utils": types.ModuleType("vllm.utils"),
        "vllm.utils.deep_gemm": types.SimpleNamespace(mqa_logits_use_mx_scales=lambda: False),
        "vllm.v1": types.ModuleType("vllm.v1"),
        "vllm.v1.attention": types.ModuleType("vllm.v1.attention"),
        "vllm.v1.attention.ops": types.ModuleType("vllm.v1.attention.ops"),
    }

    @triton.jit
    def pack_ue8m0_x4(x):  # only reached with MX scales, which this simulation turns off
        return x

    stubs["vllm.v1.attention.ops.common"] = types.SimpleNamespace(pack_ue8m0_x4=pack_ue8m0_x4)
    sys.modules.update(stubs)
    if switches:
        spec = importlib.util.spec_from_file_location("vllm.glm53_v13_switches", switches)
        module = importlib.util.module_from_spec(spec)
        sys.modules["vllm.glm53_v13_switches"] = module
        spec.loader.exec_module(module)
    spec = importlib.util.spec_from_file_location(f"kpool_compress_{time.monotonic_ns()}", path)
    kernels = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(kernels)
    return kernels


def next_pow2(value: int) -> int:
    return 1 << max(0, value - 1).bit_length()


def ring_of(variant: str, k: int) -> int:
    if variant in ("served", "no-ring"):
        return KPOOL
    if variant == "upstream":
        return KPOOL * next_pow2(-(-(KPOOL + k) // KPOOL))
    return max(KPOOL, next_pow2(k + KPOOL - 1))


def true_key(req: int, pos: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1_000_003 * (req + 1) + pos)
    k = torch.randn(HEAD_DIM, generator=g).to(torch.bfloat16)
    s = torch.randn(HEAD_DIM, generator=g).to(torch.bfloat16)
    return k.to(device), s.to(device)


def simulate(kernels, variant: str, k: int, num_reqs: int, chunks: int, device, steps: int = 12, seed: int = 0):
    ring = ring_of(variant, k)
    rng = torch.Generator().manual_seed(seed * 7919 + k * 31 + num_reqs)
    ape = torch.randn(KPOOL, HEAD_DIM, generator=rng).float().to(device)
    num_blocks = num_reqs + 1  # tail block 0 is nobody's (the V2 bug lands there)
    page_elems = 2 * ring * HEAD_DIM + 3 * HEAD_DIM  # the tail view sits inside a larger page
    raw = torch.zeros(num_blocks, page_elems, dtype=torch.bfloat16, device=device)
    tail = raw[:, : 2 * ring * HEAD_DIM].view(num_blocks, 2, ring, HEAD_DIM)
    pages = num_reqs * POOLS_PER_REQ // PAGE + 1
    cache = torch.zeros(pages, PAGE, HEAD_DIM + 4, dtype=torch.uint8, device=device)
    reference = torch.zeros_like(cache)

    def loc(r, pool):
        return r * POOLS_PER_REQ + pool

    def tail_slot(r, pos):
        if variant == "no-v2":  # the generic mapping of a one-block-per-request group
            block = (r + 1) if pos // ring == 0 else 0
            return block * ring + pos % ring
        return (r + 1) * ring + pos % ring

    prompt = [11 + 3 * r + (r % 2) for r in range(num_reqs)]  # lengths not multiples of kpool
    # Prefill, in ``chunks`` pieces: complete pools compressed, then the tail seeded.
    for c in range(chunks):
        rows = []
        for r in range(num_reqs):
            lo, hi = prompt[r] * c // chunks, prompt[r] * (c + 1) // chunks
            rows += [(r, p) for p in range(lo, hi)]
        keys = torch.stack([true_key(r, p, device)[0] for r, p in rows])
        scores = torch.stack([true_key(r, p, device)[1] for r, p in rows])
        pools = [(r, p) for r, p in rows if p % KPOOL == KPOOL - 1]
        if pools:
            idx = [rows.index((r, p - KPOOL + 1 + j)) if (r, p - KPOOL + 1 + j) in rows else None
                   for r, p in pools for j in range(KPOOL)]
            if all(i is not None for i in idx):
                slot_k = keys[idx].view(len(pools), KPOOL, HEAD_DIM)
                slot_s = scores[idx].view(len(pools), KPOOL, HEAD_DIM)
                locs = torch.tensor([loc(r, p // KPOOL) for r, p in pools], dtype=torch.int64, device=device)
                kernels.kpool_compress_and_write_cache(cache, slot_k, slot_s, ape, locs, KPOOL)
            else:  # a pool split across chunks: complete it from the committed keys
                for r, p in pools:
                    ks = torch.stack([true_key(r, q, device)[0] for q in range(p - KPOOL + 1, p + 1)])
                    ss = torch.stack([true_key(r, q, device)[1] for q in range(p - KPOOL + 1, p + 1)])
                    kernels.kpool_compress_and_write_cache(
                        cache, ks[None], ss[None], ape,
                        torch.tensor([loc(r, p // KPOOL)], dtype=torch.int64, device=device), KPOOL)
        tslot = torch.tensor([tail_slot(r, p) for r, p in rows], dtype=torch.int64, device=device)
        kernels.kpool_seed_tail_cache(tail, keys, scores, tslot, KPOOL)

    # Drafted decoding: each step verifies [last token, k drafts] for every request.
    committed = list(prompt)  # tokens with keys in the model's history
    for step in range(steps):
        n = k + 1
        key = torch.zeros(num_reqs, n, HEAD_DIM, dtype=torch.bfloat16, device=device)
        score = torch.zeros_like(key)
        slots = torch.full((num_reqs, n), -1, dtype=torch.int32, device=device)
        tslots = torch.full((num_reqs, n), -1, dtype=torch.int32, device=device)
        positions = torch.zeros(num_reqs, n, dtype=torch.int32, device=device)
        accepted = []
        for r in range(num_reqs):
            a = int(torch.randint(0, k + 1, (1,), generator=rng))
            accepted.append(a)
            for t in range(n):
                pos = committed[r] + t
                if t <= a:
                    kk, ss = true_key(r, pos, device)
                else:  # a rejected draft: a key the model never commits
                    kk, ss = true_key(r + 97, pos + 10_000 * (step + 1), device)
                key[r, t], score[r, t] = kk, ss
                positions[r, t] = pos
                tslots[r, t] = tail_slot(r, pos)
                if pos % KPOOL == KPOOL - 1:
                    slots[r, t] = loc(r, pos // KPOOL)
        kernels.kpool_decode_update_and_maybe_write_cache_batched(
            cache, tail, tslots, key, score, ape, slots, positions, KPOOL)
        for r in range(num_reqs):
            committed[r] += accepted[r] + 1

    # The reference: every complete committed pool, prefilled from the committed keys.
    pools = [(r, j) for r in range(num_reqs) for j in range(committed[r] // KPOOL)]
    ks = torch.stack([torch.stack([true_key(r, j * KPOOL + q, device)[0] for q in range(KPOOL)]) for r, j in pools])
    ss = torch.stack([torch.stack([true_key(r, j * KPOOL + q, device)[1] for q in range(KPOOL)]) for r, j in pools])
    locs = torch.tensor([loc(r, j) for r, j in pools], dtype=torch.int64, device=device)
    kernels.kpool_compress_and_write_cache(reference, ks, ss, ape, locs, KPOOL)
    flat, ref = cache.view(-1, HEAD_DIM + 4), reference.view(-1, HEAD_DIM + 4)
    # An entry's fp8 K and, at the end of its page, its fp32 scale.
    scale, ref_scale = cache[:, :, :].reshape(pages, -1), reference.reshape(pages, -1)
    differing = 0
    for r, j in pools:
        at = loc(r, j)
        page, off = divmod(at, PAGE)
        k_bytes = slice(off * HEAD_DIM, (off + 1) * HEAD_DIM)
        s_bytes = slice(PAGE * HEAD_DIM + 4 * off, PAGE * HEAD_DIM + 4 * off + 4)
        same = torch.equal(scale[page, k_bytes], ref_scale[page, k_bytes]) and torch.equal(
            scale[page, s_bytes], ref_scale[page, s_bytes])
        differing += 0 if same else 1
    return {"differing": differing, "pools": len(pools), "ring": ring}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kernels", required=True, help="kpool_compress.py of a v13-patched tree")
    parser.add_argument("--switches", help="glm53_v13_switches.py beside it (patched trees)")
    parser.add_argument("--upstream", help="0.33.0's kpool_compress.py (the independent reference)")
    parser.add_argument("--stock", help="the unpatched 0.30.0 kpool_compress.py")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--scenarios", default=",".join(SCENARIOS))
    args = parser.parse_args()
    device = torch.device(args.device)
    started = time.monotonic()
    report: dict = {"device": args.device, "interpreter": os.environ.get("TRITON_INTERPRET") == "1", "runs": {}}
    plans = [("fixed", args.kernels, True), ("served", args.kernels, False),
             ("no-ring", args.kernels, True), ("no-seed", args.kernels, True), ("no-v2", args.kernels, True)]
    if args.stock:
        plans.append(("stock", args.stock, False))
    if args.upstream:
        plans.append(("upstream", args.upstream, False))
    for variant, path, fix in plans:
        kernels = load_kernels(path, args.switches if path == args.kernels else None, fix)
        if variant == "no-seed":  # the fix with the served, packed seed address
            switches = sys.modules["vllm.glm53_v13_switches"]
            kernels.kpool_seed_geometry = lambda tail, kpool, head_dim: {
                "TAIL_BLOCK_ELEMS": 2 * tail.shape[2] * head_dim, "KPOOL_HEAD": tail.shape[2] * head_dim,
                "RING": tail.shape[2]}
            assert switches.KPOOL_TAIL_FIX
        mapping = "served" if variant == "stock" else variant
        for name in args.scenarios.split(","):
            k, reqs, chunks = SCENARIOS[name]
            report["runs"].setdefault(variant, {})[name] = simulate(kernels, mapping, k, reqs, chunks, device)
    report["wall_s"] = round(time.monotonic() - started, 1)
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
