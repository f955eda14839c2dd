#!/usr/bin/env python3
"""The platform probe: the state a speed number was measured in, as one JSON object.

Run inside a rank's container (or a throwaway container of the serving image) with the
image's own python3, the script on stdin: `docker exec -i glm53-rank0 python3 - < this`.
Standard library only at import; torch is imported only to time the read kernel, and only
where an NVIDIA device is present. It prints one JSON object (schema SCHEMA) with five parts,
each either its readings or {"why": ...} saying why it was not measured (never a made-up
value):

- bandwidth: device memory read bandwidth in GB/s. `torch.sum` over a float32 buffer of
  L2_MULTIPLE times the device's L2 (within MIN_BUFFER..MAX_BUFFER), so that no pass can be
  served from the cache; each timed run (CUDA events) is enough passes to last about
  RUN_MS (timed from a pass after the first, which loads the kernel); the figure is the
  median of RUNS runs after WARMUP_RUNS. Bytes read / time.
- clocks: SM and memory clocks, their maxima and the active clock-event (throttle) reasons,
  from nvidia-smi (mounted by the NVIDIA container toolkit with the driver); `locked` is
  whether "applications clocks setting" is among them, the reason NVML gives while clocks
  are held at user-set values (nvidia-smi --lock-gpu-clocks or --applications-clocks).
- memory: MemTotal, MemFree and MemAvailable of /proc/meminfo (the host's: /proc/meminfo is
  not namespaced, and on GB10 the GPU's memory is the host's).
- fragmentation: /proc/buddyinfo summed: free memory, and the part of it in blocks of
  HIGH_ORDER_KIB or more (the huge-page size of a 4 KiB-page kernel, what a large mapping
  wants); a low share means free memory the kernel cannot hand out in large blocks.
- uptime: /proc/uptime's seconds (GB10's bandwidth is reported to fall with uptime).

Test seams (environment): GLM53_PROC (a directory standing in for /proc), GLM53_NVIDIA_SMI
(the nvidia-smi program), GLM53_NVIDIA_DEVICE (the device node whose presence says a GPU is
there, /dev/nvidiactl). --no-gpu skips the read kernel (the CPU-readable parts only).
"""

from __future__ import annotations

import json
import math
import mmap
import os
import statistics
import subprocess
import sys

SCHEMA = "glm53-platform/1"
MIB = 1 << 20
L2_MULTIPLE = 16
MIN_BUFFER = 256 * MIB
MAX_BUFFER = 1024 * MIB
RUN_MS = 20.0
MAX_PASSES = 64
WARMUP_RUNS = 2
RUNS = 7
HIGH_ORDER_KIB = 2048
SMI_TIMEOUT_S = 20
# nvidia-smi's fields, in this order (clocks_throttle_reasons.active on drivers before the
# rename to clocks_event_reasons)
SMI_FIELDS = ("name", "clocks.sm", "clocks.mem", "clocks.max.sm", "clocks.max.mem")
REASON_FIELDS = ("clocks_event_reasons.active", "clocks_throttle_reasons.active")
# NVML's nvmlClocksEventReason bits (nvml.h), by the names nvidia-smi's fields use
REASONS = {0x1: "gpu_idle", 0x2: "applications_clocks_setting", 0x4: "sw_power_cap",
           0x8: "hw_slowdown", 0x10: "sync_boost", 0x20: "sw_thermal_slowdown",
           0x40: "hw_thermal_slowdown", 0x80: "hw_power_brake_slowdown",
           0x100: "display_clock_setting"}
LOCKED_REASON = 0x2


def proc_path(name: str) -> str:
    return os.path.join(os.environ.get("GLM53_PROC", "/proc"), name)


def read_text(name: str) -> str:
    with open(proc_path(name), encoding="ascii", errors="replace") as handle:
        return handle.read()


# ----------------------------------------------------------------------------- /proc


def parse_meminfo(text: str) -> dict:
    """MemTotal, MemFree and MemAvailable in KiB; {"why"} when one is missing."""
    fields = {}
    for line in text.splitlines():
        name, _, rest = line.partition(":")
        words = rest.split()
        if words and words[0].isdigit():
            fields[name.strip()] = int(words[0])
    wanted = {"MemTotal": "total_kib", "MemFree": "free_kib", "MemAvailable": "available_kib"}
    missing = [name for name in wanted if name not in fields]
    if missing:
        return {"why": f"/proc/meminfo has no {', '.join(missing)}"}
    return {key: fields[name] for name, key in wanted.items()}


def parse_buddyinfo(text: str, page_kib: int) -> dict:
    """Free memory by block size over every zone of every node, and its share in blocks of
    HIGH_ORDER_KIB or more."""
    by_order: list[int] = []
    for line in text.splitlines():
        words = line.split()
        if "zone" not in words:
            continue
        counts = words[words.index("zone") + 2:]
        if not counts or not all(word.isdigit() for word in counts):
            return {"why": f"/proc/buddyinfo line not understood: {line.strip()}"}
        for order, count in enumerate(int(word) for word in counts):
            if order == len(by_order):
                by_order.append(0)
            by_order[order] += count * (page_kib << order)
    if not by_order:
        return {"why": "/proc/buddyinfo lists no zone"}
    free = sum(by_order)
    high = sum(kib for order, kib in enumerate(by_order) if page_kib << order >= HIGH_ORDER_KIB)
    return {"page_kib": page_kib, "free_kib": free, "high_order_min_kib": HIGH_ORDER_KIB,
            "free_high_order_kib": high,
            "high_order_share": round(high / free, 4) if free else None,
            "by_order_kib": by_order}


def parse_uptime(text: str) -> dict:
    words = text.split()
    try:
        return {"seconds": float(words[0])}
    except (IndexError, ValueError):
        return {"why": f"/proc/uptime not understood: {text.strip()[:80]}"}


def page_kib() -> int:
    return mmap.PAGESIZE // 1024


def proc_part(name: str, parse) -> dict:
    try:
        text = read_text(name)
    except OSError as error:
        return {"why": f"cannot read /proc/{name}: {error.strerror}"}
    return parse(text)


# ----------------------------------------------------------------------------- clocks


def _mhz(text: str):
    text = text.strip()
    return int(float(text)) if text.replace(".", "", 1).isdigit() else None


def decode_reasons(mask: int) -> list[str]:
    names = [name for bit, name in REASONS.items() if mask & bit]
    unknown = mask & ~sum(REASONS)
    return names + ([f"0x{unknown:x}"] if unknown else [])


def parse_smi(line: str) -> dict:
    """One GPU's CSV line of nvidia-smi --query-gpu=SMI_FIELDS,<reasons> (noheader, nounits)."""
    cells = [cell.strip() for cell in line.split(",")]
    if len(cells) != len(SMI_FIELDS) + 1:
        return {"why": f"nvidia-smi printed {line.strip()!r}, not {len(SMI_FIELDS) + 1} fields"}
    name, sm, mem, max_sm, max_mem, reasons = cells
    doc = {"gpu": name, "sm_mhz": _mhz(sm), "mem_mhz": _mhz(mem), "max_sm_mhz": _mhz(max_sm),
           "max_mem_mhz": _mhz(max_mem)}
    try:
        mask = int(reasons, 16)
    except ValueError:
        return {**doc, "reasons": None, "locked": None,
                "why": f"the clock-event reasons read {reasons!r}"}
    return {**doc, "reasons_mask": f"0x{mask:x}", "reasons": decode_reasons(mask),
            "locked": bool(mask & LOCKED_REASON)}


def clocks() -> dict:
    """The first GPU's clocks and reasons (every rank of a GB10 node has one)."""
    program = os.environ.get("GLM53_NVIDIA_SMI", "nvidia-smi")
    last = ""
    for reasons in REASON_FIELDS:
        argv = [program, f"--query-gpu={','.join((*SMI_FIELDS, reasons))}",
                "--format=csv,noheader,nounits"]
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=SMI_TIMEOUT_S,
                                  check=False)
        except FileNotFoundError:
            return {"why": f"{program} is not in this container (the NVIDIA container toolkit "
                           "mounts it with the driver's utility capability)"}
        except subprocess.TimeoutExpired:
            return {"why": f"{program} did not answer within {SMI_TIMEOUT_S} s"}
        if done.returncode == 0 and done.stdout.strip():
            return parse_smi(done.stdout.strip().splitlines()[0])
        last = (done.stderr or done.stdout).strip().splitlines()[-1:] or [f"exit {done.returncode}"]
        last = last[0]
    return {"why": f"{program} --query-gpu failed: {last}"}


# ----------------------------------------------------------------------------- bandwidth


def buffer_bytes(l2_bytes: int | None) -> int:
    """L2_MULTIPLE times L2, within MIN_BUFFER..MAX_BUFFER, whole MiB (MAX_BUFFER when the
    L2 size is unknown)."""
    if not l2_bytes:
        return MAX_BUFFER
    wanted = -(-L2_MULTIPLE * l2_bytes // MIB) * MIB
    return min(MAX_BUFFER, max(MIN_BUFFER, wanted))


def _timed_ms(torch, buffer, passes: int) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(passes):
        torch.sum(buffer)
    end.record()
    end.synchronize()
    return float(start.elapsed_time(end))


def measure_bandwidth(torch) -> dict:
    """The read kernel on device 0 of TORCH (the real module, or a stand-in in tests)."""
    if not torch.cuda.is_available():
        return {"why": "torch sees no CUDA device"}
    properties = torch.cuda.get_device_properties(0)
    l2 = getattr(properties, "L2_cache_size", None)
    size = buffer_bytes(l2)
    free, _total = torch.cuda.mem_get_info(0)
    if free < 2 * size:
        return {"why": f"only {free / MIB:.0f} MiB free on the device, under twice the "
                       f"{size // MIB} MiB buffer"}
    buffer = torch.ones(size // 4, dtype=torch.float32, device="cuda")
    _timed_ms(torch, buffer, 1)  # the first launch loads the kernel: never a measure of a pass
    one = _timed_ms(torch, buffer, 1)
    passes = max(1, min(MAX_PASSES, math.ceil(RUN_MS / one))) if one > 0 else MAX_PASSES
    for _ in range(WARMUP_RUNS):
        _timed_ms(torch, buffer, passes)
    runs = []
    for _ in range(RUNS):
        ms = _timed_ms(torch, buffer, passes)
        if ms <= 0:
            return {"why": f"a timed run of {passes} passes read {ms} ms"}
        runs.append(size * passes / (ms / 1e3) / 1e9)
    del buffer
    return {"gb_s": round(statistics.median(runs), 1), "runs_gb_s": [round(r, 1) for r in runs],
            "device": torch.cuda.get_device_name(0), "l2_bytes": l2, "buffer_bytes": size,
            "passes_per_run": passes,
            "method": f"torch.sum over a float32 buffer of {size // MIB} MiB, median of {RUNS} "
                      f"runs of {passes} passes (CUDA events) after {WARMUP_RUNS} warm-ups"}


def bandwidth(gpu: bool) -> dict:
    if not gpu:
        return {"why": "not asked (--no-gpu)"}
    device = os.environ.get("GLM53_NVIDIA_DEVICE", "/dev/nvidiactl")
    if not os.path.exists(device):
        return {"why": f"no NVIDIA device in this container ({device} is absent)"}
    try:
        import torch
    except ImportError as error:
        return {"why": f"torch is not importable here: {error}"}
    try:
        return measure_bandwidth(torch)
    except (RuntimeError, AttributeError, TypeError) as error:
        return {"why": f"the read kernel failed: {type(error).__name__}: {str(error)[:200]}"}


def probe(gpu: bool = True) -> dict:
    return {"schema": SCHEMA, "bandwidth": bandwidth(gpu), "clocks": clocks(),
            "memory": proc_part("meminfo", parse_meminfo),
            "fragmentation": proc_part("buddyinfo",
                                       lambda text: parse_buddyinfo(text, page_kib())),
            "uptime": proc_part("uptime", parse_uptime)}


def main(argv: list[str]) -> int:
    unknown = [word for word in argv if word != "--no-gpu"]
    if unknown:
        print(f"platform_probe: unknown argument {unknown[0]}; accepted: --no-gpu",
              file=sys.stderr)
        return 2
    print(json.dumps(probe(gpu="--no-gpu" not in argv), separators=(",", ":")), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
