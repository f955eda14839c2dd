"""What the GPU tier carries to the GPU machine, built here from pinned sources, and its
install there.

    python -m tests.gpu.payload pack [DIR]                   (here: needs PyPI; DIR default
                                                              .gpu-payload)
    python3 tests/gpu/payload.py install PART DIR [SENT]    (there: no network)

The GPU machine has torch 2.11 (CUDA 13), Triton and transformers but no vLLM, and takes at
most 64 MiB a call; so the payload is four parts, each sent with one call, the later ones
while the machine is still warm. Sending one part's folder replaces the whole sent folder
there, so `install` first copies the part from SENT (the carried .gpu-payload) into DIR
(GLM53_GPU_PAYLOAD, outside it) and installs from that copy:

- part `a`: vLLM 0.30.0's tree from its pinned wheel (Python files and data, no compiled
  libraries) with layers v9 (provided by the release), v10, v11, v11_dflash_block_drop, v13 and
  v13_weights applied here by this repository's own tool; the Glm5Next kernel libraries
  (FlashMLA, DeepSelect, FlashKDA, DeepGEMM), which the part's probe tries to load; the wheels of
  tests/gpu/requirements.txt (hash-checked); the models (tests/gpu/models.py); the launcher's
  rank-0 argv and environment from `DRY_RUN=1 ./run.sh` at k = 3 and at k = 7 (part d's tiny
  Glm5Next is made on the GPU machine from its seed, so it is not carried).
- part `b`: `_C_stable_libtorch.abi3.so` (Marlin, the model's custom ops) and FlashAttention
  3, xz-compressed.
- part `moe`: `_moe_C_stable_libtorch.abi3.so` (the fused MoE's ops: Marlin MoE's block
  alignment, top-k), xz-compressed: without it no MoE layer runs (about 38 MB: no room in a or b).
- part `fi`: the FlashInfer wheel vLLM 0.30.0 pins (tests/gpu/requirements-fi.txt, checked
  against the vLLM wheel's METADATA), for FP8 KV through FLASHINFER_MLA_SPARSE_SM90; installed
  into DIR/flashinfer-site, on part d's servers' path alone.

Installing puts the tree in DIR/tree and the packages in DIR/site, beside the parts' copies
(DIR is outside the sent folder, so a warm machine keeps them between calls). A part over its
share of the 64 MiB is refused at pack time, naming its size.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import lzma
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

VERSION = "0.30.0"
# v8's vLLM changes too (its FlashInfer ones skip: no flashinfer/ in the tree; part fi carries
# the FlashInfer 0.30.0 pins): the kpool fills and the SM90 sparse MLA backend's FP8 plan dtype
LAYERS = ("v8", "v8_moe_scales", "v8_linear_scales", "v9", "v10", "v11", "v11_dflash_block_drop", "v13",
          "v13_weights")
LOCK = Path(__file__).with_name("requirements.txt")
FI_LOCK = Path(__file__).with_name("requirements-fi.txt")  # part fi's FlashInfer
FLASHINFER_SITE = "flashinfer-site"  # tests/gpu/glm5next_engine.py reads the same name
CALL_LIMIT = 64 << 20  # what one call of the device tool carries, the repository included
PART_A_SO = ("vllm/_flashmla_C.abi3.so", "vllm/_flashmla_extension_C.abi3.so",
             "vllm/_deepselect_C.abi3.so", "vllm/_flashkda_C.abi3.so",
             "vllm/third_party/deep_gemm/_C.cpython-312-x86_64-linux-gnu.so")
PART_B_SO = ("vllm/_C_stable_libtorch.abi3.so", "vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so")
PART_MOE_SO = ("vllm/_moe_C_stable_libtorch.abi3.so",)
# the parts' compiled libraries, each part's installed after part a's tree
LIBRARY_PARTS = {"b": PART_B_SO, "moe": PART_MOE_SO}
PARTS = ("a", *LIBRARY_PARTS, "fi")
# left out of the tree: compiled libraries (carried one by one above or not at all), C++
# headers for kernels compiled at run time by other backends, the wheel's Rust front end
LEFT_OUT = (".so",)
LEFT_OUT_PARTS = ("include",)
LEFT_OUT_FILES = ("vllm/vllm-rs", f"vllm-{VERSION}.dist-info/RECORD")
XZ_PRESET = 9 | lzma.PRESET_EXTREME
MODELS = ("margin-target", "margin-drafter", "target-bf16", "target-int8")
# the launcher's rank-0 argv at each k: 3 for tests/gpu/engine.py, 7 for part d (Glm5Next)
LAUNCHERS = {"launcher_rank0.json": 3, "launcher_rank0_k7.json": 7}


class PayloadError(RuntimeError):
    """The payload cannot be made or installed; the message says why and what to do."""


def log(message: str) -> None:
    print(f"gpu payload: {message}", file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------- pack (here)


def vllm_wheel() -> Path:
    from recipekit.pinned_wheels import PinnedWheel, wheel_file
    from recipekit.vllm_sources import WHEEL_PLATFORM, WHEEL_PYTHON, WHEEL_SHA256

    return wheel_file(PinnedWheel(
        project="vllm", version=VERSION, sha256=WHEEL_SHA256[VERSION], package="vllm",
        cache_dir="vllm-src", platform=WHEEL_PLATFORM, python=WHEEL_PYTHON,
        pin_file="recipekit/vllm_sources.py"), log)


def _kept(name: str) -> bool:
    return not (name.endswith("/") or name.endswith(LEFT_OUT) or name in LEFT_OUT_FILES
                or any(part in LEFT_OUT_PARTS for part in name.split("/")))


def patched_tree(wheel: Path, out: Path) -> dict[str, str]:
    """The wheel's tree (minus what LEFT_OUT says) in `out`, with every layer applied."""
    from recipekit.layers import load_layer, run_layer

    with zipfile.ZipFile(wheel) as archive:
        members = [m for m in archive.namelist() if _kept(m)]
        archive.extractall(out, members)
    outcomes = {}
    for name in LAYERS:
        result = run_layer(load_layer(name), out, import_check="off")
        if result.outcome not in ("applied", "provided-by-base"):
            raise PayloadError(f"layer {name} on vLLM {VERSION}: {result.outcome}: "
                               f"{result.reason}")
        outcomes[name] = f"{result.outcome}: {result.reason}"[:400]
        log(f"layer {name}: {result.outcome}")
    return outcomes


def tar_xz(path: Path, root: Path, names: list[str]) -> int:
    with tarfile.open(path, "w:xz", preset=XZ_PRESET) as archive:
        for name in names:
            archive.add(root / name, arcname=name)
    return path.stat().st_size


def libraries(wheel: Path, names: tuple[str, ...], out: Path) -> int:
    """The wheel's compiled libraries `names` in one xz tarball, cached by the wheel's hash
    (compressing the 78 MB _C takes a minute or two)."""
    from recipekit.pinned_wheels import cache_root, sha256_file

    key = hashlib.sha256((sha256_file(wheel) + " ".join(names)).encode()).hexdigest()[:16]
    cached = cache_root() / "gpu-payload" / f"libraries-{key}.tar.xz"
    if not cached.is_file():
        cached.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory() as scratch:
            with zipfile.ZipFile(wheel) as archive:
                archive.extractall(scratch, names)
            log(f"compressing {', '.join(n.rsplit('/', 1)[-1] for n in names)} (xz -9e)")
            staging = cached.with_suffix(".partial")
            tar_xz(staging, Path(scratch), list(names))
            os.replace(staging, cached)
    shutil.copyfile(cached, out)
    return out.stat().st_size


def wheels(out: Path, lock: Path = LOCK) -> None:
    out.mkdir(parents=True)
    platforms = [arg for n in (17, 24, 26, 27, 28, 31, 34, 35, 38, 39)
                 for arg in ("--platform", f"manylinux_2_{n}_x86_64")]
    done = subprocess.run(
        [sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check",
         "--no-deps", "--only-binary=:all:", "--python-version", "3.12", "--implementation",
         "cp", *platforms, "--platform", "manylinux2014_x86_64", "--require-hashes", "-r",
         str(lock), "-d", str(out)], capture_output=True, text=True, check=False)
    if done.returncode:
        raise PayloadError(f"pip download -r {lock.relative_to(REPO_ROOT)} failed: "
                           f"{(done.stderr or done.stdout).strip().splitlines()[-1:]}")


def flashinfer_pin() -> str:
    """The FlashInfer version FI_LOCK pins (its one requirement line)."""
    pinned = re.search(r"^flashinfer-python==(\S+) ", FI_LOCK.read_text(), re.MULTILINE)
    if not pinned:
        raise PayloadError(f"{FI_LOCK.relative_to(REPO_ROOT)}: no flashinfer-python line")
    return pinned.group(1)


def flashinfer_pin_matches(wheel: Path) -> str:
    """The FlashInfer version of FI_LOCK, refused unless the vLLM wheel requires exactly it."""
    pinned = flashinfer_pin()
    with zipfile.ZipFile(wheel) as archive:
        metadata = archive.read(f"vllm-{VERSION}.dist-info/METADATA").decode()
    wanted = re.search(r"^Requires-Dist: flashinfer-python==(\S+)\s*$", metadata, re.MULTILINE)
    if not wanted or pinned != wanted.group(1):
        raise PayloadError(f"{FI_LOCK.relative_to(REPO_ROOT)}: flashinfer-python {pinned}, but "
                           f"{wheel.name} requires {wanted and wanted.group(1)}; pin the one "
                           f"vLLM {VERSION} requires")
    return pinned


def models(out: Path) -> dict[str, str]:
    from tests.gpu import models as made
    from tests.vllm.probes.weight_groups_roundtrip import load

    # the helper as the v13 layer installs it; it imports vLLM 0.30.0 (the test venv's)
    helper = load(str(REPO_ROOT / "patches" / "v13" / "weight_groups.py"))
    margin = made.margin_target_dir()
    dirs = {"margin-target": margin, "margin-drafter": made.margin_drafter_dir(margin),
            "target-bf16": made.bf16_target_dir(), "target-int8": made.int8_target_dir(helper)}
    for name, source in dirs.items():
        shutil.copytree(source, out / name, ignore=shutil.ignore_patterns(".complete"))
    return {name: source.name for name, source in dirs.items()}


def launcher_rank0(model: str, k: int = 3) -> dict:
    """Rank 0's vllm argv and container environment of a one-node `DRY_RUN=1 ./run.sh`, at
    drafter k K and the recipe's two sequences: k = 3 (the tiny Qwen3 drafter's) gives
    capture sizes 1, 2, 4, 8; k = 7 (part d's Glm5Next drafter, the recipe's own) more."""
    from tests.engine.test_launcher_engine import rank_launch
    from tests.unit.test_launcher_support import dry_run, serve_commands

    with tempfile.TemporaryDirectory() as scratch:
        # MODEL is the path inside the GPU machine's servers, not on this host: no host scan
        stdout = dry_run(Path(scratch), nodes=1, MODEL=model, MODEL_REVISION=None,
                         NUM_SPECULATIVE_TOKENS=str(k), CHECKPOINT_SCAN="off")
    (_, docker), = serve_commands(stdout).values()
    argv, container = rank_launch(docker)
    return {"argv": argv, "env": container["env"]}


def repository_bytes() -> int:
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=REPO_ROOT,
                            capture_output=True, check=True).stdout.split(b"\0")
    return sum((REPO_ROOT / name.decode()).stat().st_size for name in listed
               if name and (REPO_ROOT / name.decode()).is_file())


def pack(out: Path) -> dict:
    wheel = vllm_wheel()
    if out.exists():
        shutil.rmtree(out)
    part_a = out / "a"
    for part in PARTS:
        (out / part).mkdir(parents=True)
    manifest: dict = {"vllm": VERSION, "wheel": wheel.name}
    with tempfile.TemporaryDirectory() as scratch:
        tree = Path(scratch) / "tree"
        manifest["layers"] = patched_tree(wheel, tree)
        names = sorted(str(p.relative_to(tree)) for p in tree.rglob("*") if p.is_file())
        tar_xz(part_a / "tree.tar.xz", tree, names)
    libraries(wheel, PART_A_SO, part_a / "glm5next-libraries.tar.xz")
    for part, names in LIBRARY_PARTS.items():
        libraries(wheel, names, out / part / "libraries.tar.xz")
    wheels(part_a / "wheels")
    manifest["flashinfer"] = flashinfer_pin_matches(wheel)
    wheels(out / "fi" / "wheels", FI_LOCK)
    with tempfile.TemporaryDirectory() as scratch:
        manifest["models"] = models(Path(scratch))
        tar_xz(part_a / "models.tar.xz", Path(scratch), list(MODELS))
    for name, k in LAUNCHERS.items():
        (part_a / name).write_text(json.dumps(launcher_rank0("/models/tiny", k), indent=1))
    repository = repository_bytes()
    manifest["repository_bytes"] = repository
    for part in (out / name for name in PARTS):
        size = sum(p.stat().st_size for p in part.rglob("*") if p.is_file())
        manifest[f"part_{part.name}_bytes"] = size
        if size + repository > CALL_LIMIT:
            raise PayloadError(f"{part}: {size + repository} bytes with the repository, over "
                               f"one call's {CALL_LIMIT}; carry less in it")
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1))
    sizes = ", ".join(f"part {name} {manifest[f'part_{name}_bytes'] >> 20} MiB" for name in PARTS)
    log(f"packed {out}: {sizes}, repository {repository >> 20} MiB")
    return manifest


# ----------------------------------------------------------------------------- install (there)


def _pip_target(wheels: list[Path], target: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-index", "--no-deps",
         "--no-compile", "--no-cache-dir", "--disable-pip-version-check", "--target",
         str(target), *map(str, wheels)], capture_output=True, text=True, check=False)
    if done.returncode:
        raise PayloadError(f"pip install into {target} failed: {done.stderr[-800:]}")


def receive(part: str, root: Path, sent: Path | None) -> Path:
    """ROOT/PART, first replaced by SENT/PART where this call carried it (the sent folder is
    replaced by the next call's, ROOT is not)."""
    kept = root / part
    if sent is not None and (sent / part).is_dir():
        if kept.exists():
            shutil.rmtree(kept)
        root.mkdir(parents=True, exist_ok=True)
        shutil.copytree(sent / part, kept)
    if not kept.is_dir():
        raise PayloadError(f"{kept}: no part {part} here; send it with the call "
                           f"(carry .gpu-payload/{part}), part a first")
    return kept


def install(part: str, root: Path, sent: Path | None = None) -> None:
    source = receive(part, root, sent)
    tree = root / "tree"
    if part == "a":
        for stale in (tree, root / "site", root / "models"):
            shutil.rmtree(stale, ignore_errors=True)
        for archive, into in (("tree.tar.xz", tree), ("glm5next-libraries.tar.xz", tree),
                              ("models.tar.xz", root / "models")):
            with tarfile.open(source / archive) as opened:
                opened.extractall(into, filter="data")
        _pip_target(sorted((source / "wheels").glob("*.whl")), root / "site")
        for name in LAUNCHERS:
            shutil.copyfile(source / name, root / name)
    elif not (tree / "vllm" / "__init__.py").is_file():
        raise PayloadError(f"{tree}: part a is not installed (the machine went cold "
                           f"between the calls?); send part a again, then part {part}")
    elif part == "fi":
        shutil.rmtree(root / FLASHINFER_SITE, ignore_errors=True)
        _pip_target(sorted((source / "wheels").glob("*.whl")), root / FLASHINFER_SITE)
    else:
        with tarfile.open(source / "libraries.tar.xz") as opened:
            opened.extractall(tree, filter="data")
    log(f"installed part {part} under {root}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("pack").add_argument("dir", nargs="?", type=Path,
                                        default=REPO_ROOT / ".gpu-payload")
    installing = sub.add_parser("install")
    installing.add_argument("part", choices=PARTS)
    installing.add_argument("dir", type=Path)
    installing.add_argument("sent", type=Path, nargs="?")
    args = parser.parse_args(argv)
    try:
        if args.command == "pack":
            pack(args.dir)
        else:
            install(args.part, args.dir, args.sent)
    except PayloadError as error:
        print(f"gpu payload: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
