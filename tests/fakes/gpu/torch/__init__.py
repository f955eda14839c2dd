"""A stand-in for torch with one CUDA device, for the platform probe's read kernel
(launcher/platform_probe.py) in tests: what a kernel reads is counted, and a CUDA event's
elapsed time is those bytes at the bandwidth the test sets.

  FAKE_TORCH_GB_S       the device's read bandwidth in GB/s (default 250)
  FAKE_TORCH_GB_S_FILE  a file holding it instead, read at each timing (a test changes it)
  FAKE_TORCH_CUDA=0     no CUDA device
  FAKE_TORCH_FREE_MIB   free device memory (default 100000 MiB)
  FAKE_TORCH_L2_MIB     the L2 size (default 24 MiB, GB10's)
  FAKE_TORCH_DEVICE     the device name (default "NVIDIA GB10")
  FAKE_TORCH_COLD_MS    milliseconds the first timed launch takes on top (a kernel's load)
"""

import os
from types import SimpleNamespace

float32 = "float32"
_read = [0]  # bytes every kernel so far has read
_timed = [0]  # timings taken so far


def _gb_s() -> float:
    path = os.environ.get("FAKE_TORCH_GB_S_FILE")
    if path:
        with open(path) as handle:
            return float(handle.read().split()[0])
    return float(os.environ.get("FAKE_TORCH_GB_S", "250"))


class _Buffer:
    def __init__(self, count: int, itemsize: int):
        self.nbytes = count * itemsize


def ones(count, dtype=None, device=None):
    assert device == "cuda" and dtype == float32
    return _Buffer(count, 4)


def sum(buffer):  # noqa: A001 (torch's name)
    _read[0] += buffer.nbytes
    return 0.0


class _Event:
    def __init__(self, enable_timing=False):
        assert enable_timing
        self.at = None

    def record(self):
        self.at = _read[0]

    def synchronize(self):
        pass

    def elapsed_time(self, end) -> float:
        _timed[0] += 1
        cold = float(os.environ.get("FAKE_TORCH_COLD_MS", "0")) if _timed[0] == 1 else 0.0
        return cold + (end.at - self.at) / (_gb_s() * 1e9) * 1e3


def _available() -> bool:
    return os.environ.get("FAKE_TORCH_CUDA", "1") != "0"


def _free() -> int:
    return int(os.environ.get("FAKE_TORCH_FREE_MIB", "100000")) << 20


cuda = SimpleNamespace(
    is_available=_available,
    Event=_Event,
    get_device_properties=lambda index: SimpleNamespace(
        L2_cache_size=int(os.environ.get("FAKE_TORCH_L2_MIB", "24")) << 20),
    get_device_name=lambda index: os.environ.get("FAKE_TORCH_DEVICE", "NVIDIA GB10"),
    mem_get_info=lambda index: (_free(), 128 << 30),
)
