"""On PYTHONPATH of the GPU tier's Glm5Next servers only (tests/gpu/run d). DeepGEMM's
compiled module does not load under the H200's torch 2.11 (docs/gpu-tier.md), and Glm5Next's
sparse indexer has no other path to its MQA logits in vLLM 0.30.0. This puts the float32
stand-in of tests/gpu/mqa_logits_reference.py in place of those kernels alone, as soon as
vllm.utils.deep_gemm is imported and before any module imports them by name; every other
kernel of the forward is vLLM's own."""

import importlib.abc
import importlib.util
import os
import sys

TARGET = "vllm.utils.deep_gemm"
REFERENCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir,
                         "mqa_logits_reference.py")


class _StandInForDeepGemmLogits(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != TARGET:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        run_module = spec.loader.exec_module

        def exec_module(module):
            run_module(module)
            loaded = importlib.util.spec_from_file_location("gpu_mqa_logits_reference",
                                                            REFERENCE)
            reference = importlib.util.module_from_spec(loaded)
            loaded.loader.exec_module(reference)
            reference.install(module)

        spec.loader.exec_module = exec_module
        return spec


sys.meta_path.insert(0, _StandInForDeepGemmLogits())
