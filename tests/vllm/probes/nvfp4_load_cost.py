"""Run with PYTHONPATH=<a vLLM release tree> on CPU torch: what v13's NVFP4 quantization of one
(N, K) BF16 weight with SCALES block scales (amax or searched) costs, as every rank pays it
at load. Seeded weights as weight_groups_roundtrip.py makes them; torch on THREADS threads
(1 by default: a shared machine's other cores only add noise). Prints one JSON line: the
seconds, the output's bytes and the peak resident memory the call added (one scaling a
process: the peak only grows). With MALLOC_MMAP_THRESHOLD_=65536 that peak is what was live:
glibc otherwise keeps freed chunks, a few hundred MiB in some runs here.

    python nvfp4_load_cost.py HELPER.py N K SCALES [THREADS]

GLM-5.3-Flash's largest target group at TP 2 is the lm_head shard, 77440 x 4096.
"""

from __future__ import annotations

import importlib.util
import json
import resource
import sys
import time

import torch


def load(path: str):
    spec = importlib.util.spec_from_file_location("glm53_weight_groups", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def main(helper_path: str, rows: str, columns: str, scales: str, threads: str = "1") -> int:
    helper = load(helper_path)
    torch.set_num_threads(int(threads))
    n, k = int(rows), int(columns)
    generator = torch.Generator().manual_seed(0)
    w = torch.empty(n, k, dtype=torch.bfloat16)
    for start in range(0, n, 1024):  # made in slices: a float32 copy of it would set the peak
        block = torch.randn(min(1024, n - start), k, generator=generator) * 0.02
        block[:, ::97] *= 8.0
        w[start:start + 1024] = block.to(torch.bfloat16)
    before = peak_rss_bytes()
    started = time.perf_counter()
    tensors = helper.nvfp4(w, scales)
    seconds = time.perf_counter() - started
    out = {"shape": [n, k], "scales": scales, "threads": torch.get_num_threads(),
           "chunk": helper.NVFP4_CHUNK, "seconds": round(seconds, 2),
           "weight_bytes": w.numel() * w.element_size(),
           "output_bytes": sum(t.numel() * t.element_size() for t in tensors.values()),
           "peak_rss_added_bytes": peak_rss_bytes() - before}
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
