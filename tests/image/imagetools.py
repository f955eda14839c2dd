"""Helpers of the image tier: docker calls, image labels, scripts/build.sh runs."""

from __future__ import annotations

import json
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
BUILD_SH = REPO_ROOT / "scripts" / "build.sh"
MAKE_STANDIN = REPO_ROOT / "tests" / "image" / "make-standin"
# The layers a chain on a stand-in of an already sm_121-enabled base builds (--from v9), and the
# whole chain from the vendor image's stand-in (the fork shape with FlashInfer).
LAYERS = ("v9", "v10", "v11")
FULL_CHAIN = ("v8", *LAYERS)


def docker(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["docker", *args], capture_output=True, text=True, check=check)


def image_id(ref: str) -> str | None:
    result = docker("image", "inspect", "-f", "{{.Id}}", ref, check=False)
    return result.stdout.strip() if result.returncode == 0 else None


def labels(ref: str) -> dict[str, str]:
    result = docker("image", "inspect", "-f", "{{json .Config.Labels}}", ref)
    return json.loads(result.stdout) or {}


@dataclass
class BuildRun:
    args: list[str]
    returncode: int
    output: str
    seconds: float


def run_build(prefix: str, *args: str) -> BuildRun:
    command = [str(BUILD_SH), "--tag-prefix", prefix, *args]
    started = time.monotonic()
    result = subprocess.run(
        command,
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        check=False,
    )
    run = BuildRun(command, result.returncode, result.stdout, time.monotonic() - started)
    print(f"$ {' '.join(command)}  # exit {run.returncode}, {run.seconds:.1f} s\n{run.output}")
    return run
