"""The platform probe (launcher/platform_probe.py) with its parts faked: /proc as planted
files, nvidia-smi as tests/fakes/fake-nvidia-smi, the GPU's timing as tests/fakes/gpu's
torch (its events time the bytes a kernel read at a set bandwidth); and once for real, on
this machine's /proc, the parts a CPU can read."""

from __future__ import annotations

import json
import mmap
import os
import subprocess
import sys

import pytest

from launcher.plan import node_platform
from launcher import platform_probe as probe
from tests.timing import HANG_GUARD_S
from tests.unit.test_launcher_support import REPO

FAKES = REPO / "tests" / "fakes"
MIB = 1 << 20
MEMINFO = ("MemTotal:       131072000 kB\nMemFree:         2048000 kB\n"
           "MemAvailable:   104857600 kB\nBuffers:            1024 kB\n")
# two zones; 4 KiB pages: order 9 is 2 MiB
BUDDYINFO = ("Node 0, zone      DMA      1      0      0      0      0      0      0      0      0"
             "      0      2\n"
             "Node 0, zone   Normal    100     50      0      0      0      0      0      0      0"
             "     10     20\n")


def plant_proc(folder, meminfo=MEMINFO, buddyinfo=BUDDYINFO, uptime="93784.51 100.0\n"):
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in (("meminfo", meminfo), ("buddyinfo", buddyinfo), ("uptime", uptime)):
        if text is not None:
            (folder / name).write_text(text)
    return folder


def run_script(env, *args):
    done = subprocess.run([sys.executable, str(node_platform.PROBE), *args], env=env,
                          capture_output=True, text=True, timeout=HANG_GUARD_S, check=False)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.fixture
def fake_gpu(tmp_path, monkeypatch):
    """This process's probe module sees tests/fakes/gpu's torch, a planted device node and
    the fake nvidia-smi; returns the environment a subprocess needs for the same."""
    device = tmp_path / "nvidiactl"
    device.touch()
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(FAKES / "gpu"),
           "GLM53_NVIDIA_DEVICE": str(device), "GLM53_NVIDIA_SMI": str(FAKES / "fake-nvidia-smi"),
           "GLM53_PROC": str(plant_proc(tmp_path / "proc"))}
    for name, value in env.items():
        if name != "PATH":
            monkeypatch.setenv(name, value)
    monkeypatch.syspath_prepend(str(FAKES / "gpu"))
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    return env


# ----------------------------------------------------------------------------- parts


def test_meminfo_gives_total_free_and_available_or_says_what_is_missing():
    assert probe.parse_meminfo(MEMINFO) == {"total_kib": 131072000, "free_kib": 2048000,
                                            "available_kib": 104857600}
    assert probe.parse_meminfo("MemTotal: 1 kB\nMemFree: 2 kB\n") == {
        "why": "/proc/meminfo has no MemAvailable"}


def test_buddyinfo_sums_free_memory_and_its_share_in_2_mib_blocks():
    found = probe.parse_buddyinfo(BUDDYINFO, page_kib=4)
    # order 0: 101 pages, order 1: 50 x 2, order 9: 10 x 512, order 10: 22 x 1024 (x 4 KiB)
    assert found["by_order_kib"] == [404, 400, 0, 0, 0, 0, 0, 0, 0, 20480, 90112]
    assert found["free_kib"] == 111396
    assert found["free_high_order_kib"] == 110592
    assert found["high_order_share"] == round(110592 / 111396, 4)
    # with 64 KiB pages order 5 is 2 MiB already: every block from order 5 up counts
    sixty_four = probe.parse_buddyinfo(BUDDYINFO, page_kib=64)
    assert sixty_four["free_high_order_kib"] == (10 * 512 + 22 * 1024) * 64
    assert probe.parse_buddyinfo("Node 0, zone Normal 1 x 3\n", 4)["why"].startswith(
        "/proc/buddyinfo line not understood")
    assert probe.parse_buddyinfo("", 4) == {"why": "/proc/buddyinfo lists no zone"}


def test_a_fragmented_node_shows_a_low_share():
    fragmented = "Node 0, zone   Normal  90000  40000  10000      0      0      0      0      0" \
                 "      0      1      0\n"
    share = probe.parse_buddyinfo(fragmented, page_kib=4)["high_order_share"]
    assert share == round(2048 / (90000 * 4 + 40000 * 8 + 10000 * 16 + 2048), 4) < 0.01


def test_uptime_is_its_first_field():
    assert probe.parse_uptime("93784.51 100.0\n") == {"seconds": 93784.51}
    assert probe.parse_uptime("")["why"].startswith("/proc/uptime not understood")


def test_a_clock_line_is_read_with_its_reasons_and_whether_clocks_are_locked():
    assert probe.parse_smi("NVIDIA GB10, 2405, [N/A], 3003, [N/A], 0x0000000000000001") == {
        "gpu": "NVIDIA GB10", "sm_mhz": 2405, "mem_mhz": None, "max_sm_mhz": 3003,
        "max_mem_mhz": None, "reasons_mask": "0x1", "reasons": ["gpu_idle"], "locked": False}
    held = probe.parse_smi("NVIDIA H100 80GB HBM3, 1980, 2619, 1980, 2619, 0x0000000000000006")
    assert held["reasons"] == ["applications_clocks_setting", "sw_power_cap"]
    assert held["locked"] is True
    assert probe.parse_smi("GPU, 1, 2, 3, 4, 0x800")["reasons"] == ["0x800"]
    assert probe.parse_smi("GPU, 1, 2")["why"].startswith("nvidia-smi printed")


def test_the_buffer_is_16_l2s_within_256_mib_and_1_gib():
    assert probe.buffer_bytes(24 * MIB) == 384 * MIB        # GB10
    assert probe.buffer_bytes(50 * MIB) == 800 * MIB        # H100
    assert probe.buffer_bytes(60 * MIB) == 960 * MIB        # H200
    assert probe.buffer_bytes(4 * MIB) == 256 * MIB
    assert probe.buffer_bytes(100 * MIB) == 1024 * MIB
    assert probe.buffer_bytes(None) == 1024 * MIB


# ----------------------------------------------------------------------------- the read kernel


def test_the_read_kernel_reports_the_bandwidth_its_bytes_took(fake_gpu, monkeypatch):
    import torch  # tests/fakes/gpu's

    monkeypatch.setenv("FAKE_TORCH_GB_S", "251.5")
    found = probe.measure_bandwidth(torch)
    assert found["gb_s"] == 251.5 and found["runs_gb_s"] == [251.5] * probe.RUNS
    # 384 MiB at 251.5 GB/s is 1.6 ms a pass: 13 passes make a run of about 20 ms
    assert (found["buffer_bytes"], found["passes_per_run"]) == (384 * MIB, 13)
    assert found["method"] == ("torch.sum over a float32 buffer of 384 MiB, median of 7 runs of "
                               "13 passes (CUDA events) after 2 warm-ups")


def test_a_slow_first_launch_does_not_set_the_passes(fake_gpu, monkeypatch):
    """The first launch loads the kernel (tens of ms on an H100): timed alone it would make
    every run one pass long, and launch overhead part of the figure."""
    import torch

    monkeypatch.setenv("FAKE_TORCH_COLD_MS", "50")
    found = probe.measure_bandwidth(torch)
    assert (found["gb_s"], found["passes_per_run"]) == (250.0, 13)


def test_the_read_kernel_refuses_to_crowd_the_device_and_needs_cuda(fake_gpu, monkeypatch):
    import torch

    monkeypatch.setenv("FAKE_TORCH_FREE_MIB", "700")
    assert probe.measure_bandwidth(torch) == {
        "why": "only 700 MiB free on the device, under twice the 384 MiB buffer"}
    monkeypatch.setenv("FAKE_TORCH_CUDA", "0")
    assert probe.measure_bandwidth(torch) == {"why": "torch sees no CUDA device"}


def test_clocks_fall_back_to_the_older_field_and_say_why_they_are_unread(fake_gpu, monkeypatch):
    assert probe.clocks()["reasons"] == ["gpu_idle"]
    monkeypatch.setenv("FAKE_SMI_OLD", "1")
    assert probe.clocks()["sm_mhz"] == 2405
    monkeypatch.setenv("FAKE_SMI_FAIL", "NVIDIA-SMI has failed because it couldn't communicate")
    assert probe.clocks() == {"why": f"{FAKES / 'fake-nvidia-smi'} --query-gpu failed: "
                                     "NVIDIA-SMI has failed because it couldn't communicate"}
    monkeypatch.setenv("GLM53_NVIDIA_SMI", "/nonexistent/nvidia-smi")
    assert probe.clocks()["why"].startswith("/nonexistent/nvidia-smi is not in this container")


# ----------------------------------------------------------------------------- the script


def test_the_script_on_fakes_prints_every_part(fake_gpu):
    doc = run_script({**fake_gpu, "FAKE_TORCH_GB_S": "238"})
    assert doc["schema"] == probe.SCHEMA
    assert doc["bandwidth"]["gb_s"] == 238.0
    assert doc["clocks"]["locked"] is False
    assert doc["memory"]["available_kib"] == 104857600
    page = mmap.PAGESIZE // 1024
    assert doc["fragmentation"] == probe.parse_buddyinfo(BUDDYINFO, page)
    assert doc["uptime"] == {"seconds": 93784.51}
    line = node_platform.describe({"node": "192.0.2.1", "role": "head", **doc})
    assert line.startswith("read 238.0 GB/s (NVIDIA GB10, 384 MiB buffer); SM 2405 of 3003 MHz, "
                           "memory n/a, clocks not locked, clock-event reasons: gpu_idle; "
                           "MemAvailable 100.0 GiB; ")
    assert line.endswith("up 1 d 2 h")


def test_the_script_says_why_a_part_is_missing(tmp_path, fake_gpu):
    env = {**fake_gpu, "GLM53_PROC": str(plant_proc(tmp_path / "bare", buddyinfo=None)),
           "GLM53_NVIDIA_DEVICE": str(tmp_path / "absent")}
    doc = run_script(env)
    assert doc["bandwidth"] == {"why": f"no NVIDIA device in this container ({tmp_path}/absent "
                                       "is absent)"}
    assert doc["fragmentation"] == {"why": "cannot read /proc/buddyinfo: No such file or "
                                           "directory"}
    assert "bandwidth not measured (no NVIDIA device" in node_platform.describe(doc)


def test_the_real_proc_of_this_machine_is_read(tmp_path):
    """The tiny real run: this machine's /proc, no GPU asked."""
    env = {"PATH": os.environ["PATH"], "GLM53_NVIDIA_SMI": str(tmp_path / "no-nvidia-smi")}
    doc = run_script(env, "--no-gpu")
    assert doc["bandwidth"] == {"why": "not asked (--no-gpu)"}
    assert 0 < doc["memory"]["available_kib"] <= doc["memory"]["total_kib"]
    assert doc["fragmentation"]["free_kib"] > 0 and 0 <= doc["fragmentation"][
        "high_order_share"] <= 1
    assert doc["uptime"]["seconds"] > 0


def test_an_unknown_argument_is_refused():
    done = subprocess.run([sys.executable, str(node_platform.PROBE), "--gpu"], capture_output=True,
                          text=True, timeout=HANG_GUARD_S, check=False)
    assert (done.returncode, done.stderr) == (
        2, "platform_probe: unknown argument --gpu; accepted: --no-gpu\n")


def test_a_levers_change_is_phrased_from_two_probes_or_says_why_not():
    before = {"bandwidth": {"gb_s": 238.0}, "fragmentation": {"high_order_share": 0.31}}
    after = {"bandwidth": {"gb_s": 264.0}, "fragmentation": {"high_order_share": 0.93}}
    assert node_platform.change(before, after) == ("read bandwidth 238.0 -> 264.0 GB/s (+10.9%); "
                                              "free memory in 2 MiB blocks 31% -> 93%")
    blind = {"bandwidth": {"why": "torch sees no CUDA device"}, "fragmentation": {}}
    assert node_platform.change(blind, after) == ("read bandwidth not compared (torch sees no CUDA "
                                             "device)")
