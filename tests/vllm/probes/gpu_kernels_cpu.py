"""Run with PYTHONPATH=<vLLM 0.30.0's tree> on CPU torch: tests/gpu/kernels.py's whole case
table built and checked on CPU against HELPER.py (the v13 helper as this checkout has it),
with tests/gpu/kernel_emulation.py's stand-ins for Marlin. Every call the GPU machine makes
of the helper and of vLLM's schemes runs here with its arguments; each linear's shape is cut
to at most N_CPU x K_CPU (the format's code and the bound are the same at any size). Prints
one JSON line: kernels.py's document, and whether a kernel class other than the expected one
fails its case.

    python gpu_kernels_cpu.py HELPER.py
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO_ROOT))

from tests.gpu import kernel_emulation, kernels  # noqa: E402
from tests.vllm.probes.weight_groups_roundtrip import load  # noqa: E402

N_CPU, K_CPU = 64, 1024


def main(helper_path: str) -> int:
    import torch

    torch.set_num_threads(1)
    helper = load(helper_path)
    kernel_emulation.install()
    shapes = {name: (min(n, N_CPU), min(k, K_CPU)) for name, (n, k) in kernels.GPU_SHAPES.items()}
    doc: dict = {}
    kernels.run(doc, helper, device="cpu", shapes=shapes,
                expected=kernel_emulation.EXPECTED_KERNELS, graph=False, timed=False,
                whole_plants=True)
    # the same case judged against the GPU's expected kernel classes: the class differs
    case = kernels.cases({"mla.o_proj": (N_CPU, K_CPU)})[0]
    w = kernels.weight(case.n, case.k, case.seed)
    from vllm.config import set_current_vllm_config

    with set_current_vllm_config(kernels.marlin_config("cpu")):
        other = kernels.check_case(helper, case, w, torch.Generator().manual_seed(1), "cpu",
                                   False, kernels.EXPECTED_KERNELS, False)
    doc["other_kernel_expected"] = {"kernel": other["kernel"],
                                    "expected": other["expected_kernel"],
                                    "passed": other["passed"]}
    doc["helper_scales"] = {"target": helper.TARGET_NVFP4_SCALES,
                            "draft": helper.DRAFT_NVFP4_SCALES}
    print(json.dumps(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
