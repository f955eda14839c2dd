"""What v8's changes decide, called through vLLM's and FlashInfer's own code on CPU.

Run with PYTHONPATH=<root holding vllm/ and flashinfer/>; prints one JSON line. The root
may be stock or patched: the test compares both. Only what needs a GPU is stubbed: the
device capability (torch.cuda and FlashInfer's get_compute_capability), vLLM's compiled
extension modules that cuda.py imports (a release tree carries no .so), the kernel module
FlashInfer would JIT-compile, pinned host memory in FlashInfer's wrapper constructor, and
the FlashInfer wrapper _SM90State hands its backend to.
"""

import json
import sys
import types

for name in ("vllm._C_stable_libtorch", "vllm._qutlass_C", "vllm._moe_C_stable_libtorch"):
    sys.modules[name] = types.ModuleType(name)

import torch  # noqa: E402

import vllm.platforms.cuda as cuda  # noqa: E402
from vllm.config import VllmConfig, set_current_vllm_config  # noqa: E402
from vllm.platforms.interface import DeviceCapability  # noqa: E402
from vllm.v1.attention.backends.mla import flashinfer_mla_sparse_sm90 as sm90  # noqa: E402


def with_major(major: int) -> None:
    torch.cuda.current_device = lambda: 0
    torch.cuda.get_device_capability = lambda device=None: (major, 1 if major == 12 else 0)


def backend_priorities() -> list[str]:
    found = cuda._get_backend_priorities(
        use_mla=True,
        device_capability=DeviceCapability(12, 1),
        num_heads=16,
        kv_cache_dtype="fp8_e4m3",
        head_size=576,
    )
    return [backend.name for backend in found]


def pdl_by_major() -> dict[str, bool]:
    verdicts = {}
    for major in (8, 9, 10, 11, 12):
        with_major(major)
        method = cuda.CudaPlatformBase.is_arch_support_pdl
        getattr(method, "cache_clear", lambda: None)()
        verdicts[str(major)] = method()
    return verdicts


def sm90_backend() -> dict:
    # VllmConfig() infers a device from the current platform; CPU's is what this host has.
    import vllm.platforms
    from vllm.platforms.cpu import CpuPlatform

    vllm.platforms._current_platform = CpuPlatform()
    backend = sm90.FlashInferMLASparseSM90Backend
    capability = {
        f"{major}.{minor}": backend.supports_compute_capability(DeviceCapability(major, minor))
        for major, minor in ((9, 0), (10, 0), (12, 1))
    }
    combination = {}
    for feature in (False, True):  # False: what FlashInfer 0.6.17 (no ckv_scale_arr) gives
        sm90.has_flashinfer_sm90_nope_mla = lambda feature=feature: feature
        for kv in ("auto", "bfloat16", "fp8_e4m3"):
            with set_current_vllm_config(VllmConfig()):
                verdict = backend.supports_combination(
                    head_size=576,
                    dtype=torch.bfloat16,
                    kv_cache_dtype=kv,
                    block_size=64,
                    use_mla=True,
                    has_sink=False,
                    use_sparse=True,
                    use_mm_prefix=False,
                    device_capability=DeviceCapability(12, 1),
                )
            combination[f"feature={feature} kv={kv}"] = verdict
    return {"capability": capability, "combination": combination}


def sm90_state_backend() -> dict[str, str]:
    """The backend _SM90State.__init__ hands BatchMLAPagedAttentionWrapper, per device major."""
    import flashinfer.mla

    seen = {}

    class Recorder:
        def __init__(self, workspace, **kwargs):
            seen["backend"] = kwargs.get("backend")

    flashinfer.mla.BatchMLAPagedAttentionWrapper = Recorder
    chosen = {}
    for major in (9, 12):
        with_major(major)
        sm90._SM90State(torch.device("cpu"), 16, torch.float8_e4m3fn, 4, 64, 512, 64, 0.1)
        chosen[str(major)] = seen["backend"]
    return chosen


def flashinfer_fp8_plan() -> dict[str, str]:
    """FlashInfer's own BatchMLAPagedAttentionWrapper.plan with FP8 KV, per device major."""
    from flashinfer.mla import _core

    class KernelModule:  # what get_batch_mla_module would JIT-compile on a GPU host
        def plan(self, *args):
            return [0]

    _core.get_batch_mla_module = lambda *args: KernelModule()
    verdicts = {"flashinfer_file": _core.__file__}
    real_empty = torch.empty
    for major in (9, 10, 12):
        # Pinned host memory needs the driver: the wrapper's constructor gets plain memory.
        torch.empty = lambda *args, pin_memory=False, **kwargs: real_empty(*args, **kwargs)
        _core.get_compute_capability = lambda device, major=major: (major, 1 if major == 12 else 0)
        wrapper = _core.BatchMLAPagedAttentionWrapper(
            torch.empty(1024, dtype=torch.uint8), backend="fa2"
        )
        torch.empty = real_empty
        indptr = torch.tensor([0, 1], dtype=torch.int32)
        try:
            wrapper.plan(
                indptr,
                indptr,
                torch.tensor([0], dtype=torch.int32),
                torch.tensor([1], dtype=torch.int32),
                num_heads=16,
                head_dim_ckv=512,
                head_dim_kpe=64,
                page_size=64,
                causal=False,
                sm_scale=0.1,
                q_data_type=torch.bfloat16,
                kv_data_type=torch.float8_e4m3fn,
            )
            verdicts[str(major)] = "planned"
        except ValueError as error:
            verdicts[str(major)] = f"ValueError: {error}"
    return verdicts


def main() -> None:
    report = {
        "vllm_file": cuda.__file__,
        "priorities_mla_12": backend_priorities(),
        "pdl": pdl_by_major(),
        "sm90": sm90_backend(),
        "sm90_state_backend": sm90_state_backend(),
        "flashinfer_fp8_plan": flashinfer_fp8_plan(),
    }
    print(json.dumps(report))


if __name__ == "__main__":
    main()
