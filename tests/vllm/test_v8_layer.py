"""v8 on real trees: vLLM 0.27.1, 0.30.0, 0.33.0, 0.34.0 and the FlashInfer 0.6.17, 0.6.18,
0.7.2.post1 and 0.7.4 wheels.

The patched code is then exercised on CPU through vLLM's and FlashInfer's own functions
(tests/vllm/probes/sm121_dispatch.py; FlashInfer 0.7.x's planner:
tests/vllm/probes/flashinfer07_fp8_plan.py), the Triton kernel V7c changes runs in Triton's
interpreter, and F1's C++ expression is compiled and evaluated by g++.
"""

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from recipekit.flashinfer_sources import flashinfer_tree
from tests.vllm.conftest import REPO_ROOT, patch_layer, run_python, tree_digest

PROBES = REPO_ROOT / "tests/vllm/probes"
CUDA = "vllm/platforms/cuda.py"
SM90 = "vllm/v1/attention/backends/mla/flashinfer_mla_sparse_sm90.py"
INDEXER_0300 = "vllm/model_executor/layers/sparse_attn_indexer_kpool.py"
INDEXER_0330 = "vllm/models/glm5next/nvidia/sparse_indexer.py"
KPOOL = "vllm/models/glm5next/nvidia/ops/kpool_compress.py"
MLA_HEADER = "flashinfer/data/include/flashinfer/attention/mla.cuh"
MLA_CORE = "flashinfer/mla/_core.py"
FA_COMMON = "flashinfer/mla/_batch_mla/_backends/_fa_common.py"
ALL = ["D1", "D2a", "D2b", "D2c", "D2e", "D4", "V7a", "V7b", "V7c", "F1", "F2", "F3"]
# FlashInfer 0.6.x has no Python mirror of the kernel's fp8 tile: F3 is skipped there
FORK_SET = dict.fromkeys(ALL[:-1], "applied") | {"F3": "skipped"}
INSTALL_FIRST = "install the FlashInfer of v8's package set for this base first"


def patch(root, *extra):
    return patch_layer("v8", root, *extra)[:2]


def statuses(report):
    return {finding["change"]: finding["status"] for finding in report["changes"]}


def findings(report, change):
    return [finding for finding in report["changes"] if finding["change"] == change]


@pytest.fixture
def root(tmp_path, release):
    """root(vllm_version, flashinfer_version=None) -> a private tree holding vllm/ (and flashinfer/).

    Hard links into the caches: the layer replaces files through a rename, never in place.
    """

    def make(vllm_version, flashinfer_version=None):
        target = tmp_path / f"root-{vllm_version}-{flashinfer_version}"
        shutil.copytree(release(vllm_version) / "vllm", target / "vllm", copy_function=os.link)
        if flashinfer_version:
            source = flashinfer_tree(flashinfer_version) / "flashinfer"
            shutil.copytree(source, target / "flashinfer", copy_function=os.link)
        return target

    return make


def rewrite(path: Path, old: str, new: str) -> None:
    """Replace ``old`` (exactly once) in a hard-linked file without touching the cache."""
    text = path.read_text()
    assert text.count(old) == 1, f"{path}: {old!r} occurs {text.count(old)} times"
    path.unlink()
    path.write_text(text.replace(old, new))


@pytest.fixture(scope="module")
def patched_0300(tmp_path_factory, release):
    """vLLM 0.30.0 with FlashInfer 0.6.18 beside it, v8 applied (module imports checked)."""
    target = tmp_path_factory.mktemp("v8") / "root"
    shutil.copytree(release("0.30.0") / "vllm", target / "vllm", copy_function=os.link)
    shutil.copytree(
        flashinfer_tree("0.6.18") / "flashinfer", target / "flashinfer", copy_function=os.link
    )
    code, report = patch(target, "--import-check", "on")
    assert code == 0, report
    return target, report


def test_0300_with_flashinfer_0618_applies_every_change(patched_0300, release):
    target, report = patched_0300
    assert report["outcome"] == "applied", report["reason"]
    assert statuses(report) == FORK_SET
    assert sorted(report["files"]) == sorted(
        [CUDA, SM90, INDEXER_0300, KPOOL, MLA_HEADER, MLA_CORE]
    )
    assert "touched modules import" in report["reason"]
    assert report["reason"].endswith(
        "[applied: D1 D2a D2b D2c D2e D4 V7a V7b V7c F1 F2; skipped: F3]")
    stock = tree_digest(release("0.30.0")) | {
        f"flashinfer/{k}": v
        for k, v in tree_digest(flashinfer_tree("0.6.18") / "flashinfer").items()
    }
    changed = {name for name, digest in tree_digest(target).items() if stock.get(name) != digest}
    assert changed == set(report["files"])


def test_second_run_is_already_applied_and_byte_identical(patched_0300):
    target, _ = patched_0300
    before = tree_digest(target)
    code, report = patch(target)
    assert (code, report["outcome"]) == (0, "already-applied")
    assert statuses(report) == dict.fromkeys(ALL[:-1], "present") | {"F3": "skipped"}
    assert report["files"] == []
    assert tree_digest(target) == before


def test_check_writes_nothing(root):
    target = root("0.30.0", "0.6.18")
    before = tree_digest(target)
    code, report = patch(target, "--check")
    assert (code, report["outcome"]) == (0, "applied")
    assert "check only" in report["reason"]
    assert tree_digest(target) == before


def test_0271_applies_d4_and_says_why_it_skips_the_rest(root):
    target = root("0.27.1")
    code, report = patch(target, "--import-check", "off")
    assert (code, report["outcome"]) == (0, "applied")
    assert report["files"] == [CUDA]
    assert statuses(report) == {
        "D1": "skipped",
        "D2a": "skipped",
        "D2b": "skipped",
        "D2c": "skipped",
        "D2e": "skipped",
        "D4": "applied",
        "V7a": "skipped",
        "V7b": "skipped",
        "V7c": "skipped",
        "F1": "skipped",
        "F2": "skipped",
        "F3": "skipped",
    }
    for change in ("D1", "D2a", "D2b", "D2c", "D2e"):
        assert "no SM90 sparse MLA backend" in findings(report, change)[0]["detail"]
        assert "FLASHINFER_MLA_SPARSE_SM90" in findings(report, change)[0]["detail"]
    for change in ("V7a", "V7b", "V7c"):
        assert "no Glm5Next" in findings(report, change)[0]["detail"]
    for change in ("F1", "F2", "F3"):
        assert "no flashinfer/ package beside vllm/" in findings(report, change)[0]["detail"]
    assert "return major in (9, 10)" in (target / CUDA).read_text()


@pytest.mark.parametrize(("version", "flashinfer"), [("0.33.0", "0.7.2.post1"), ("0.34.0", "0.7.4")])
def test_a_base_with_flashinfer_0_7_gets_every_change_and_f2_f3_in_the_fa_planner(root, version, flashinfer):
    """0.33.0 with its own FlashInfer; 0.34.0 with 0.7.4, the release after its 0.7.3 (not on
    PyPI): F2's check and F3's two tile mirrors are in the FA backends' shared planner."""
    target = root(version, flashinfer)
    code, report = patch(target, "--require-flashinfer", "--import-check", "off")
    assert (code, report["outcome"]) == (0, "applied"), report["reason"]
    # 0.33.0 maps FP8's uint8 storage to float8_e4m3fn for the plan itself (D2e present)
    assert statuses(report) == dict.fromkeys(ALL, "applied") | {"D2e": "present"}
    assert sorted(report["files"]) == sorted([CUDA, SM90, INDEXER_0330, KPOOL, MLA_HEADER, FA_COMMON])
    for change in ("F2", "F3"):
        assert findings(report, change)[0]["file"] == FA_COMMON
    planner = (target / FA_COMMON).read_text()
    assert "major not in (9, 12)" in planner and "tile_kv = min(tile_kv, 32)" in planner
    before = tree_digest(target)
    code, again = patch(target, "--require-flashinfer", "--import-check", "off")
    assert (code, again["outcome"]) == (0, "already-applied")
    assert statuses(again) == dict.fromkeys(ALL, "present")
    assert tree_digest(target) == before


@pytest.fixture(scope="module")
def fa_planner(tmp_path_factory, release):
    """FlashInfer 0.7.2.post1's FA planner as each device would see it: stock, and patched by
    v8 on vLLM 0.33.0 (tests/vllm/probes/flashinfer07_fp8_plan.py)."""
    reports = {}
    for name in ("stock", "patched"):
        target = tmp_path_factory.mktemp(f"fa-{name}") / "root"
        shutil.copytree(flashinfer_tree("0.7.2.post1") / "flashinfer", target / "flashinfer",
                        copy_function=os.link)
        if name == "patched":
            shutil.copytree(release("0.33.0") / "vllm", target / "vllm", copy_function=os.link)
            code, report = patch(target, "--import-check", "off")
            assert (code, report["outcome"]) == (0, "applied"), report["reason"]
            shutil.rmtree(target / "vllm")  # the probe imports FlashInfer alone
        result = run_python(
            [sys.executable, str(PROBES / "flashinfer07_fp8_plan.py")], capture_output=True,
            text=True, timeout=300, check=False,
            env={**os.environ, "PYTHONPATH": str(target), "PYTHONDONTWRITEBYTECODE": "1"})
        assert result.returncode == 0, result.stderr[-3000:]
        reports[name] = json.loads(result.stdout.strip().splitlines()[-1])
        assert reports[name]["flashinfer_file"].startswith(str(target))
    return reports


def test_f2_flashinfer_07_plans_nope_fp8_mla_on_gb10_and_refuses_what_does_not_fit(fa_planner):
    stock, patched = fa_planner["stock"]["plan"], fa_planner["patched"]["plan"]
    assert stock["9"] == patched["9"] == {"0": "planned", "64": "planned"}
    assert all("requires an SM90 (Hopper) device, got SM121" in v for v in stock["12"].values())
    # GLM-5.3-Flash's sparse MLA is NoPE (kpe 0): planned. With a 64-wide rope part the tile-16
    # kernel needs 101,888 B of GB10's 101,376 B (as sizeof measured on a GPU): refused, not run.
    assert patched["12"]["0"] == "planned"
    assert patched["12"]["64"] == ("unsupported: fa2 MLA needs 101888 shared-memory bytes per "
                                   "block, but this device supports 101376.")
    assert all("got SM100" in v for v in patched["10"].values()), "F2 admits 12 only"


def test_f3_the_planners_fp8_tile_follows_f1_on_gb10_only(fa_planner):
    stock, patched = fa_planner["stock"], fa_planner["patched"]
    # stock mirrors a forced tile of 32: on GB10 it asks 117,312 B (the kernel's stock sizeof)
    assert stock["shared_bytes"]["12"] == {"0": 117312, "64": 129536}
    assert patched["shared_bytes"]["12"] == {"0": 91680, "64": 101888}
    for device in ("9", "10"):  # Hopper-sized shared memory dispatches 32 or more: unchanged
        assert patched["shared_bytes"][device] == stock["shared_bytes"][device]
        assert patched["causal"][device] == stock["causal"][device]
    # A key the tile-32 kernel covers but the tile-16 one does not: stock would let it through
    # on GB10, the patched bound refuses it there (the kernel GB10 runs has native tile 16).
    assert stock["causal"]["12"]["48"] == "accepted"
    assert "key=48, native KV tile=16" in patched["causal"]["12"]["48"]
    assert stock["causal"]["9"]["48"] == "accepted"


def as_unreleased(target):
    """The tree with its _version.py saying a dev build (as the vendor fork image's does)."""
    version = target / "vllm/_version.py"
    os.unlink(version)  # break the hard link before editing
    version.write_text("__version__ = version = '0.1.dev0+local'\n")
    return target


def test_0330_finds_v7ab_where_it_moved_and_d4_under_its_cache_decorator(root):
    # 0.33.0's code shape on a dev build (a base without a package set of its own)
    target = as_unreleased(root("0.33.0"))
    code, report = patch(target, "--import-check", "off")
    assert (code, report["outcome"]) == (0, "applied")
    assert statuses(report) == dict.fromkeys(ALL[:9], "applied") | {
        "D2e": "present",
        "F1": "skipped",
        "F2": "skipped",
        "F3": "skipped",
    }
    for change in ("V7a", "V7b"):
        (found,) = findings(report, change)
        assert found["file"] == INDEXER_0330
        assert f"not in {INDEXER_0300}" in found["detail"]
    assert sorted(report["files"]) == sorted([CUDA, SM90, INDEXER_0330, KPOOL])
    cuda = (target / CUDA).read_text()
    assert "    @cache\n    def is_arch_support_pdl(cls) -> bool:" in cuda
    assert cuda.count("return major in (9, 10)") == 1
    indexer = (target / INDEXER_0330).read_text()
    assert (
        indexer.count("pool_topk = torch.full(\n") == 2 and "pool_topk = torch.empty" not in indexer
    )
    # The AMD twin of the indexer is not a CUDA path: v8 leaves it alone.
    assert (
        "pool_topk = torch.empty"
        in (target / "vllm/models/glm5next/amd/sparse_indexer.py").read_text()
    )
    code, again = patch(target)
    assert (code, again["outcome"]) == (0, "already-applied")


def test_flashinfer_0617_is_refused_naming_the_file_and_the_pin(root):
    target = root("0.30.0", "0.6.17")
    before = tree_digest(target)
    code, report = patch(target)
    assert (code, report["outcome"]) == (3, "refused")
    assert statuses(report)["F1"] == "refused" and statuses(report)["F2"] == "refused"
    assert statuses(report)["D1"] == "not-written"
    assert report["reason"].startswith(f"F1 {MLA_HEADER}: ")
    assert f"F2 {MLA_CORE}: " in report["reason"]
    assert INSTALL_FIRST in findings(report, "F1")[0]["detail"]
    assert INSTALL_FIRST in findings(report, "F2")[0]["detail"]
    assert len(report["reason"].splitlines()) == 1
    assert tree_digest(target) == before


def test_require_flashinfer_refuses_a_root_without_it(root):
    target = root("0.30.0")
    code, report = patch(target, "--require-flashinfer")
    assert (code, report["outcome"]) == (3, "refused")
    assert (
        "no flashinfer/ package beside vllm/" in report["reason"]
        and INSTALL_FIRST in report["reason"]
    )


@pytest.mark.parametrize(
    "change, relative, old, new, message",
    [
        (
            "D1",
            CUDA,
            "                AttentionBackendEnum.TRITON_MLA,\n                AttentionBackendEnum.FLASHINFER_MLA_SPARSE_SM120,",
            "                AttentionBackendEnum.FLASHINFER_MLA_SPARSE_SM120,\n                AttentionBackendEnum.TRITON_MLA,",
            "the capability-12 MLA list is [AttentionBackendEnum.FLASHINFER_MLA_SPARSE_SM120, AttentionBackendEnum.TRITON_MLA]",
        ),
        ("D2b", SM90, 'backend="fa3",', 'backend="auto",', 'not backend="fa3"'),
        ("D4", CUDA, "return major >= 9", "return major >= 8", "expected one `return major >= 9`"),
        (
            "V7a",
            INDEXER_0300,
            "                pool_topk = torch.empty(",
            "                pool_topk = torch.zeros(",
            "expected one `pool_topk = torch.empty(...)` under `if has_prefill:`",
        ),
        (
            "V7c",
            KPOOL,
            "hist_out = tl.where(pid >= 0, hist_val, -1)",
            "hist_out = tl.where(pid > -1, hist_val, -1)",
            "not tl.where(pid >= 0, ...)",
        ),
        ("F1", MLA_HEADER, "? 32 : CTA_TILE_KV;", "? 64 : CTA_TILE_KV;", INSTALL_FIRST),
        (
            "F2",
            MLA_CORE,
            "            if major != 9:\n",
            "            if major < 9:\n",
            "`if major != 9:` in plan's FP8 branch",
        ),
    ],
)
def test_drift_is_refused_and_the_tree_is_untouched(root, change, relative, old, new, message):
    target = root("0.30.0", "0.6.18")
    rewrite(target / relative, old, new)
    before = tree_digest(target)
    code, report = patch(target)
    assert (code, report["outcome"]) == (3, "refused")
    assert [f["change"] for f in report["changes"] if f["status"] == "refused"] == [change]
    assert message in findings(report, change)[0]["detail"]
    assert report["reason"].startswith(f"{change} {relative}: ")
    assert len(report["reason"].splitlines()) == 1
    assert tree_digest(target) == before


def test_a_change_the_base_already_has_is_present_and_the_rest_apply(root):
    # A base that fixed PDL itself (say a later release): D4 is present, nothing else is lost.
    target = root("0.30.0", "0.6.18")
    rewrite(target / CUDA, "return major >= 9", "return major in (9, 10)")
    code, report = patch(target, "--import-check", "off")
    assert (code, report["outcome"]) == (0, "applied")
    assert statuses(report) == FORK_SET | {"D4": "present"}


@pytest.fixture(scope="module")
def dispatch(patched_0300, release, tmp_path_factory):
    """The probe's report on the stock tree and on the patched one."""
    stock = tmp_path_factory.mktemp("v8-stock") / "root"
    shutil.copytree(release("0.30.0") / "vllm", stock / "vllm", copy_function=os.link)
    shutil.copytree(
        flashinfer_tree("0.6.18") / "flashinfer", stock / "flashinfer", copy_function=os.link
    )
    reports = {}
    for name, tree in (("stock", stock), ("patched", patched_0300[0])):
        result = run_python(
            [sys.executable, str(PROBES / "sm121_dispatch.py")],
            capture_output=True,
            text=True,
            timeout=900,
            check=False,
            env={**os.environ, "PYTHONPATH": str(tree), "PYTHONDONTWRITEBYTECODE": "1"},
        )
        assert result.returncode == 0, result.stderr[-3000:]
        reports[name] = json.loads(result.stdout.strip().splitlines()[-1])
        assert reports[name]["vllm_file"].startswith(str(tree))
        assert reports[name]["flashinfer_fp8_plan"]["flashinfer_file"].startswith(str(tree))
    return reports


def test_d1_capability_12_tries_sm90_sparse_before_sm120(dispatch):
    assert dispatch["stock"]["priorities_mla_12"] == ["TRITON_MLA", "FLASHINFER_MLA_SPARSE_SM120"]
    patched = dispatch["patched"]["priorities_mla_12"]
    assert patched.index("FLASHINFER_MLA_SPARSE_SM90") < patched.index(
        "FLASHINFER_MLA_SPARSE_SM120"
    )


def test_d4_pdl_only_on_majors_9_and_10(dispatch):
    assert dispatch["stock"]["pdl"] == {"8": False, "9": True, "10": True, "11": True, "12": True}
    assert dispatch["patched"]["pdl"] == {
        "8": False,
        "9": True,
        "10": True,
        "11": False,
        "12": False,
    }


def test_d2a_d2c_sm90_backend_on_capability_12(dispatch):
    stock, patched = dispatch["stock"]["sm90"], dispatch["patched"]["sm90"]
    assert stock["capability"] == {"9.0": True, "10.0": False, "12.1": False}
    assert patched["capability"] == {"9.0": True, "10.0": False, "12.1": True}
    needs = "requires FlashInfer with SM90 MLA support"
    # Without FlashInfer's feature (0.6.17), stock refuses even bf16 KV; v8 asks it of fp8 only.
    assert needs in stock["combination"]["feature=False kv=auto"]
    assert patched["combination"]["feature=False kv=auto"] is None
    assert patched["combination"]["feature=False kv=bfloat16"] is None
    assert needs in patched["combination"]["feature=False kv=fp8_e4m3"]
    assert patched["combination"]["feature=True kv=fp8_e4m3"] is None


def test_d2b_fa3_on_hopper_fa2_on_gb10(dispatch):
    assert dispatch["stock"]["sm90_state_backend"] == {"9": "fa3", "12": "fa3"}
    assert dispatch["patched"]["sm90_state_backend"] == {"9": "fa3", "12": "fa2"}


def test_f2_flashinfer_plans_fp8_mla_on_sm121(dispatch):
    stock, patched = (
        dispatch["stock"]["flashinfer_fp8_plan"],
        dispatch["patched"]["flashinfer_fp8_plan"],
    )
    assert stock["9"] == patched["9"] == "planned"
    assert "requires an SM90 (Hopper) device, got SM121" in stock["12"]
    assert patched["12"] == "planned"
    assert "got SM100" in patched["10"], "F2 admits 12 only, not every major"


def test_v7c_pool_ids_past_pool_len_expand_to_minus_one(patched_0300, release):
    """The Triton kernel itself, stock and patched, in Triton's CPU interpreter."""
    rows = {}
    for name, tree in (("stock", release("0.30.0")), ("patched", patched_0300[0])):
        result = run_python(
            [sys.executable, str(PROBES / "kpool_expand.py"), str(tree / KPOOL)],
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
            env={**os.environ, "TRITON_INTERPRET": "1", "PYTHONDONTWRITEBYTECODE": "1"},
        )
        assert result.returncode == 0, result.stderr[-3000:]
        rows[name] = json.loads(result.stdout.strip().splitlines()[-1])["rows"]
    # Row 0: seq_len 17, pool ids [0, 3, 6, -1] (pool_len 4): id 6 is past the valid pools.
    assert rows["stock"][0][8:12] == [24, 25, 26, 27], "stock expands an invalid pool id to tokens"
    assert rows["patched"][0][:12] == [0, 1, 2, 3, 12, 13, 14, 15, -1, -1, -1, -1]
    # Row 1: seq_len 8 (pool_len 2): pool id 2 == pool_len is past the end as well.
    assert rows["stock"][1][4:8] == [8, 9, 10, 11]
    assert rows["patched"][1][:8] == [4, 5, 6, 7, -1, -1, -1, -1]
    assert rows["patched"][0][16] == rows["stock"][0][16] == 16, "the tail token is untouched"


def _fp8_tile_values(header: Path, tmp_path: Path, name: str) -> dict[str, int]:
    """EFF_CTA_TILE_KV as the header's own line computes it, compiled and run by g++."""
    compiler = shutil.which("g++")
    assert compiler, "g++ is needed to evaluate F1's C++ expression (apt-get install g++)"
    lines = [
        line
        for line in header.read_text().splitlines()
        if "constexpr uint32_t EFF_CTA_TILE_KV =" in line
    ]
    assert len(lines) == 1
    program = tmp_path / f"{name}.cc"
    program.write_text(
        "#include <cstdint>\n#include <cstdio>\n#include <type_traits>\n"
        "struct __nv_fp8_e4m3 {};\nstruct bf16 {};\n"
        "template <typename DTypeKV, uint32_t CTA_TILE_KV>\nconstexpr uint32_t eff() {\n"
        f"{lines[0]}\n  return EFF_CTA_TILE_KV;\n}}\n"
        "int main() {\n"
        '  std::printf("fp8/16=%u fp8/32=%u fp8/64=%u bf16/16=%u bf16/64=%u\\n", eff<__nv_fp8_e4m3, 16>(),\n'
        "              eff<__nv_fp8_e4m3, 32>(), eff<__nv_fp8_e4m3, 64>(), eff<bf16, 16>(), eff<bf16, 64>());\n"
        "}\n"
    )
    binary = tmp_path / name
    subprocess.run(
        [compiler, "-std=c++17", "-o", str(binary), str(program)], check=True, timeout=120
    )
    output = subprocess.run([str(binary)], capture_output=True, text=True, check=True).stdout
    return {key: int(value) for key, value in re.findall(r"(\S+)=(\d+)", output)}


def test_f1_fp8_tile_follows_the_dispatched_tile_on_gb10(patched_0300, tmp_path):
    stock = _fp8_tile_values(flashinfer_tree("0.6.18") / MLA_HEADER, tmp_path, "stock")
    patched = _fp8_tile_values(patched_0300[0] / MLA_HEADER, tmp_path, "patched")
    # GB10's 101,376 B of shared memory dispatches CTA_TILE_KV 16; stock forces fp8 to 32.
    assert stock == {"fp8/16": 32, "fp8/32": 32, "fp8/64": 32, "bf16/16": 16, "bf16/64": 64}
    assert patched == {"fp8/16": 16, "fp8/32": 32, "fp8/64": 32, "bf16/16": 16, "bf16/64": 64}


def test_fork_shape_with_flashinfer_0618_applies_every_change_then_is_already_applied(root):
    """The fork carries the SM90 sparse backend and the kpool indexer, so every change
    applies there, as the seed's exact edits did on the real image."""
    target = root("fork", "0.6.18")
    code, report = patch(target, "--require-flashinfer")
    assert (code, report["outcome"]) == (0, "applied"), report["reason"]
    assert statuses(report) == FORK_SET
    assert sorted(report["files"]) == sorted([CUDA, SM90, INDEXER_0300, KPOOL, MLA_HEADER, MLA_CORE])
    before = tree_digest(target)
    code, again = patch(target, "--require-flashinfer")
    assert (code, again["outcome"]) == (0, "already-applied")
    assert statuses(again) == dict.fromkeys(ALL[:-1], "present") | {"F3": "skipped"}
    assert tree_digest(target) == before
