"""Run under TRITON_INTERPRET=1: the draft and target Gumbel noise streams of one vLLM
tree's `v1/worker/gpu/sample/gumbel.py`, and what they do to probabilistic drafting.

    python gumbel_streams.py TREE REQUEST.json

gumbel.py is loaded from TREE by file, with `vllm.triton_utils` stood in by real Triton
and a numpy log1p for libdevice's (the rest of vLLM is not imported). REQUEST:
{"seeds": N, "noise_seeds": M, "alone_seeds": A, "pos": P, "p": [...], "q": [...]}; seeds
are 1..N. Both draws of a step take the same seed, position and keys (token ids), as
DFlash2's selector walk and the rejection sampler's resample do (checked on the trees'
sources by the test).
Prints one JSON line:

- "target_noise", "draft_noise": [seed][key] the Gumbel noise `gumbel_noised_argmax` adds,
  drawn as the target's sampler/resampler draws it (IS_DRAFTING=False) and as a drafter
  does (IS_DRAFTING=True); a tree without IS_DRAFTING has one stream, used by both;
- "tokens": [seed] the token one speculative step emits, built from the tree's own noise
  functions as vLLM's rejection sampler does (Leviathan et al.): the draft is the Gumbel-max
  of log q in the drafting stream, accepted when log p > log u + log q with
  u = tl_rand32(seed, pos), else resampled from max(p - q, 0) in the target's stream;
  many seeds a program, each seed a column of the tree's draws;
- "tokens_alone": [seed] the same for seeds 1..A, one seed a program (a scalar seed, as
  vLLM's kernels draw): equal to the first A of "tokens" unless batching changed a draw.
"""

from __future__ import annotations

import importlib.util
import inspect
import json
import sys
import types
from pathlib import Path

import numpy as np
import torch
import triton
import triton.language as tl
from triton.runtime.interpreter import TensorHandle


def _log1p(x, **_):
    # Triton's interpreter leaves libdevice's functions as stubs returning None (it patches
    # triton.language and its math module only): log1p on the numpy data it runs on
    return tl.tensor(TensorHandle(np.log1p(x.handle.data), x.handle.dtype), x.type)


def load_gumbel(tree: Path) -> types.ModuleType:
    stand_in = types.ModuleType("vllm.triton_utils")
    stand_in.HAS_TRITON, stand_in.tl, stand_in.triton, stand_in.tldevice = (
        True, tl, triton, types.SimpleNamespace(log1p=_log1p))
    sys.modules.setdefault("vllm", types.ModuleType("vllm"))
    sys.modules["vllm.triton_utils"] = stand_in
    path = tree / "vllm" / "v1" / "worker" / "gpu" / "sample" / "gumbel.py"
    spec = importlib.util.spec_from_file_location("gumbel_under_test", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


SEEDS_PER_PROGRAM = 512  # steps_kernel's (a power of two, as tl.arange wants)
# the tree's own functions, bound by main() before any kernel runs (Triton resolves a
# kernel's callees among its module's globals)
gumbel_noised_argmax = tl_rand32 = None


@triton.jit
def draw(logits, keys, mask, seed, pos, SALTED: tl.constexpr, DRAFT: tl.constexpr,
         APPLY: tl.constexpr):
    # a tree without the salt has no IS_DRAFTING: its drafter calls the very same draw
    if SALTED:
        return gumbel_noised_argmax(logits, keys, mask, seed, pos, 1.0, USE_FP64=False,
                                    APPLY_TEMPERATURE=APPLY, IS_DRAFTING=DRAFT)
    else:
        return gumbel_noised_argmax(logits, keys, mask, seed, pos, 1.0, USE_FP64=False,
                                    APPLY_TEMPERATURE=APPLY)


@triton.jit
def noise_kernel(out_ptr, seeds_ptr, pos, V: tl.constexpr, SALTED: tl.constexpr,
                 DRAFT: tl.constexpr):
    row = tl.program_id(0)
    seed = tl.load(seeds_ptr + row)
    keys = tl.arange(0, V)
    for k in tl.static_range(V):
        # zero logits and one key unmasked: the maximum is that key's noise
        value, _ = draw(tl.zeros([V], tl.float32), keys, keys == k, seed, pos, SALTED, DRAFT,
                        True)
        tl.store(out_ptr + row * V + k, value)


@triton.jit
def step_kernel(out_ptr, seeds_ptr, pos, log_p_ptr, log_q_ptr, log_r_ptr, V: tl.constexpr,
                SALTED: tl.constexpr):
    row = tl.program_id(0)
    seed = tl.load(seeds_ptr + row)
    keys = tl.arange(0, V)
    log_p = tl.load(log_p_ptr + keys)
    log_q = tl.load(log_q_ptr + keys)
    _, draft = draw(log_q, keys, keys < V, seed, pos, SALTED, True, True)
    u = tl_rand32(seed, pos, includes_zero=False)
    draft_log_p = tl.sum(tl.where(keys == draft, log_p, 0.0), axis=0)
    draft_log_q = tl.sum(tl.where(keys == draft, log_q, 0.0), axis=0)
    # the resampler's draw: target stream, residual logits already final (no temperature)
    log_r = tl.load(log_r_ptr + keys)
    _, resampled = draw(log_r, keys, log_r > float("-inf"), seed, pos, SALTED, False, False)
    token = tl.where(draft_log_p > tl.log(u) + draft_log_q, draft, resampled)
    tl.store(out_ptr + row, token)


@triton.jit
def steps_kernel(out_ptr, seeds_ptr, n, pos, log_p_ptr, log_q_ptr, log_r_ptr, V: tl.constexpr,
                 SALTED: tl.constexpr, SEEDS: tl.constexpr):
    """step_kernel for SEEDS seeds a program (the interpreter's cost is per program): keys
    down axis 0, seeds across axis 1; the tree's draw is elementwise in both and reduces
    over axis 0 only, so each column is one seed's draw."""
    cols = tl.program_id(0) * SEEDS + tl.arange(0, SEEDS)
    seed = tl.load(seeds_ptr + cols, mask=cols < n, other=1)
    keys = tl.arange(0, V)[:, None]
    log_p = tl.load(log_p_ptr + keys)
    log_q = tl.load(log_q_ptr + keys)
    _, draft = draw(log_q, keys, keys < V, seed[None, :], pos, SALTED, True, True)
    u = tl_rand32(seed, pos, includes_zero=False)
    draft_log_p = tl.sum(tl.where(keys == draft[None, :], log_p, 0.0), axis=0)
    draft_log_q = tl.sum(tl.where(keys == draft[None, :], log_q, 0.0), axis=0)
    log_r = tl.load(log_r_ptr + keys)
    _, resampled = draw(log_r, keys, log_r > float("-inf"), seed[None, :], pos, SALTED, False,
                        False)
    token = tl.where(draft_log_p > tl.log(u) + draft_log_q, draft, resampled)
    tl.store(out_ptr + cols, token, mask=cols < n)


def main(tree: str, request_path: str) -> int:
    request = json.loads(Path(request_path).read_text())
    gumbel = load_gumbel(Path(tree))
    salted = "IS_DRAFTING" in inspect.signature(gumbel.gumbel_noised_argmax.fn).parameters
    global gumbel_noised_argmax, tl_rand32
    gumbel_noised_argmax, tl_rand32 = gumbel.gumbel_noised_argmax, gumbel.tl_rand32
    n, pos = request["seeds"], request["pos"]
    seeds = torch.arange(1, n + 1, dtype=torch.int64)
    p = np.array(request["p"], dtype=np.float64)
    q = np.array(request["q"], dtype=np.float64)
    vocab = len(p)
    noise = {}
    for name, drafting in (("target_noise", False), ("draft_noise", True)):
        out = torch.empty(request["noise_seeds"], vocab, dtype=torch.float32)
        noise_kernel[(request["noise_seeds"],)](out, seeds, pos, V=vocab, SALTED=salted,
                                                 DRAFT=drafting)
        noise[name] = out.tolist()
    residual = np.maximum(p - q, 0.0)
    log_r = np.full(vocab, -np.inf)
    log_r[residual > 0] = np.log(residual[residual > 0])
    as_f32 = lambda a: torch.tensor(a, dtype=torch.float32)
    logs = (as_f32(np.log(p)), as_f32(np.log(q)), as_f32(log_r))
    tokens = torch.empty(n, dtype=torch.int64)
    steps_kernel[(triton.cdiv(n, SEEDS_PER_PROGRAM),)](tokens, seeds, n, pos, *logs, V=vocab,
                                                       SALTED=salted, SEEDS=SEEDS_PER_PROGRAM)
    # the first seeds again, one scalar seed a program, as vLLM's kernels draw
    alone = torch.empty(request["alone_seeds"], dtype=torch.int64)
    step_kernel[(request["alone_seeds"],)](alone, seeds, pos, *logs, V=vocab, SALTED=salted)
    print(json.dumps({"gumbel_file": str(gumbel.__file__), "salted": salted, **noise,
                      "tokens": tokens.tolist(), "tokens_alone": alone.tolist()}))
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
