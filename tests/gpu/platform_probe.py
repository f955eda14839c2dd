#!/usr/bin/env python3
"""The GPU tier's platform stage (`tests/gpu/run platform`): the platform probe
(launcher/platform_probe.py) on this machine's GPU through its own torch, and its read
bandwidth against the card's specification, into one JSON file.

    python3 tests/gpu/platform_probe.py OUT.json

Needs only torch and nvidia-smi (not the payload). The card is named by nvidia-smi; SPECS
gives its memory bandwidth as its maker publishes it, with the source. The check: the read
kernel's figure lies within BOUNDS of the specification. Above it, the kernel read from a
cache, not from memory; far under it, the kernel measured something other than the memory
(launch overhead, a clock stuck low). Exit 0 within the bounds, 1 outside them or when the
card or the figure is missing (the file says why).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

PROBE = Path(__file__).resolve().parents[2] / "launcher" / "platform_probe.py"
# nvidia-smi's name -> (memory bandwidth in GB/s, where the maker publishes it)
SPECS = {
    "NVIDIA H100 80GB HBM3": (3350.0, "NVIDIA H100 Tensor Core GPU datasheet, H100 SXM: 3.35 TB/s "
                                      "(https://www.nvidia.com/en-us/data-center/h100/)"),
    "NVIDIA H100 PCIe": (2000.0, "NVIDIA H100 Tensor Core GPU datasheet, H100 PCIe: 2 TB/s "
                                 "(https://www.nvidia.com/en-us/data-center/h100/)"),
    "NVIDIA H200": (4800.0, "NVIDIA H200 Tensor Core GPU datasheet: 4.8 TB/s "
                            "(https://www.nvidia.com/en-us/data-center/h200/)"),
    "NVIDIA GB10": (273.0, "NVIDIA DGX Spark specifications: 273 GB/s LPDDR5x "
                           "(https://www.nvidia.com/en-us/products/workstations/dgx-spark/)"),
}
# the share of the specification a read kernel's figure may take: a streaming reduction on
# these cards reaches most of it, never more
BOUNDS = (0.6, 1.0)


def card_name() -> tuple[str | None, str]:
    """nvidia-smi's name of GPU 0, or (None, why)."""
    try:
        done = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as error:
        return None, f"nvidia-smi did not run: {error}"
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        return None, f"nvidia-smi exited {done.returncode}: {done.stderr.strip()[:200]}"
    return lines[0].strip(), ""


def judge(name: str | None, why: str, probe: dict) -> dict:
    """The stage's result from the card's NAME and the probe's document."""
    result = {"stage": "platform", "gpu": name, "probe": probe}
    measured = (probe.get("bandwidth") or {}).get("gb_s")
    if name is None:
        return {**result, "passed": False, "why": why}
    if name not in SPECS:
        return {**result, "passed": False,
                "why": f"no specification for {name!r} here (tests/gpu/platform_probe.py SPECS)"}
    spec, source = SPECS[name]
    result.update(spec_gb_s=spec, spec_source=source, bounds=list(BOUNDS))
    if not isinstance(measured, (int, float)):
        why = (probe.get("bandwidth") or {}).get("why", "no figure")
        return {**result, "passed": False, "why": f"the read bandwidth was not measured: {why}"}
    share = measured / spec
    result.update(measured_gb_s=measured, share_of_spec=round(share, 4),
                  passed=BOUNDS[0] <= share <= BOUNDS[1])
    if not result["passed"]:
        result["why"] = (f"{measured:.1f} GB/s is {share:.1%} of the {spec:.0f} GB/s "
                         f"specification, outside {BOUNDS[0]:.0%}..{BOUNDS[1]:.0%}")
    return result


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: tests/gpu/platform_probe.py OUT.json", file=sys.stderr)
        return 2
    # on stdin, as the launcher runs it in a rank's container: run as a file from launcher/,
    # the folder's own modules would come first on sys.path
    done = subprocess.run([sys.executable, "-"], input=PROBE.read_text(), capture_output=True,
                          text=True, timeout=600, check=False)
    try:
        probe = json.loads(done.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        probe = {"why": f"the probe exited {done.returncode}: {done.stderr.strip()[-300:]}"}
    name, why = card_name()
    result = judge(name, why, probe)
    Path(argv[0]).write_text(json.dumps(result, indent=1) + "\n")
    figure = (f"{result['measured_gb_s']:.1f} GB/s, {result['share_of_spec']:.1%} of "
              f"{result['spec_gb_s']:.0f}" if "measured_gb_s" in result else result.get("why"))
    print(f"platform: {name}: {figure}: {'PASS' if result['passed'] else 'FAIL'}"
          + (f" ({result['why']})" if not result["passed"] and "measured_gb_s" in result else ""),
          flush=True)
    return 0 if result["passed"] else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
