"""P of layer v8: the package sets (one per base vLLM release that needs its own), and the
check of what is installed against them."""

import re

import pytest

from recipekit.flashinfer_sources import WHEEL_SHA256 as FLASHINFER_SHA256
from recipekit.layers import v8
from recipekit.sm121_packages import (
    B12X_EXTRA,
    PACKAGES,
    PACKAGES_DIR,
    PackageError,
    base_version,
    check,
    notes,
    packages_for,
    read_carried,
    read_pins,
)
from recipekit.tree import TreeView

SETS = sorted(PACKAGES_DIR.glob("packages*.txt"))

PINS = {
    "flashinfer-python": "0.6.18",
    "nvidia-nccl-cu13": "2.30.7",
    "nvidia-cutlass-dsl": "4.6.2",
    "nvidia-cutlass-dsl-libs-base": "4.6.2",
    "nvidia-cutlass-dsl-libs-core": "4.6.2",
    "nvidia-cutlass-dsl-libs-cu12": "4.6.2",
    "nvidia-cutlass-dsl-libs-cu13": "4.6.2",
}


def good():
    return {name: [version] for name, version in PINS.items()} | {"torch": ["2.13.0"]}


def test_the_pins_are_the_seeds_versions():
    assert read_pins() == PINS


def own_pins(path):
    """The pins written in PATH itself (an included set's left out)."""
    return {name: version for name, version in read_pins(path).items()
            if re.search(rf"^{re.escape(name)}==", path.read_text(), re.M | re.I)}


@pytest.mark.parametrize("path", SETS, ids=lambda path: path.name)
def test_every_pin_carries_sha256_and_flashinfer_matches_the_source_tree_pin(path):
    text = path.read_text()
    pins = read_pins(path)
    first = next(line for line in text.splitlines()
                 if line and not line.startswith("#") and not line.startswith("-r "))
    blocks = re.split(r"\n(?=[a-z])", text[text.index(first):])
    assert len(blocks) == len(own_pins(path))
    for block in blocks:
        hashes = re.findall(r"--hash=sha256:[0-9a-f]{64}", block)
        # a pure-Python wheel has one; a binary one a hash per CPython 3.11/3.12 x aarch64/x86_64
        # (NCCL's wheels are per platform only)
        assert len(hashes) in (1, 2, 4), block.splitlines()[0]
    if "flashinfer-python" in own_pins(path):
        flashinfer = next(block for block in blocks if block.startswith("flashinfer-python=="))
        version = pins["flashinfer-python"]
        assert re.findall(r"sha256:([0-9a-f]{64})", flashinfer) == [FLASHINFER_SHA256[version]]
    assert set(pins) | set(read_carried(path)) == set(PINS) | (
        {"b12x"} if path.name != PACKAGES.name else set())


@pytest.mark.parametrize("version", sorted(v8.BASE_REQUIRES))
def test_each_release_needing_its_own_packages_has_a_set_that_gives_them(version):
    path = packages_for(version)
    assert path.name == f"packages-vllm-{version}.txt"
    offered = read_pins(path) | read_carried(path)
    for name, wanted in v8.BASE_REQUIRES[version].items():
        assert offered[name] == wanted, (path.name, name)
    family = {v for name, v in offered.items() if name.startswith("nvidia-cutlass-dsl")}
    assert family == {v8.BASE_REQUIRES[version]["nvidia-cutlass-dsl"]}


@pytest.mark.parametrize("version", [None, "0.1.dev20051+g487ecf187", "0.27.1", "0.99.0"])
def test_any_other_base_gets_the_fork_set(version):
    assert packages_for(version) == PACKAGES


@pytest.mark.parametrize("version", sorted(B12X_EXTRA))
def test_each_base_whose_vllm_names_b12x_gets_that_release(version):
    """vLLM's wheel names one b12x release for its `b12x` extra; that base's set pins it, and
    the CUTLASS DSL it needs is the set's own."""
    path = packages_for(version)
    pins = read_pins(path)
    assert pins["b12x"] == B12X_EXTRA[version]
    cutlass = {"1.3.0": "4.6.2", "1.5.1": "4.8.0"}[B12X_EXTRA[version]]  # b12x's Requires-Dist
    assert pins["nvidia-cutlass-dsl"] == cutlass


def test_the_fork_set_carries_no_b12x():
    """The vendor fork's vLLM has no b12x backend; the package would only add its plugins."""
    assert "b12x" not in read_pins(PACKAGES)


def test_a_set_includes_another_with_r(tmp_path):
    (tmp_path / "base.txt").write_text("flashinfer-python==0.6.18 \\\n    --hash=sha256:00\n")
    (tmp_path / "plus.txt").write_text("# one more\n-r base.txt\nb12x==1.3.0 \\\n"
                                       "    --hash=sha256:11\n")
    assert read_pins(tmp_path / "plus.txt") == {"flashinfer-python": "0.6.18", "b12x": "1.3.0"}
    (tmp_path / "broken.txt").write_text("-r missing.txt\n")
    with pytest.raises(PackageError, match="missing.txt: cannot read the pins"):
        read_pins(tmp_path / "broken.txt")


def test_b12x_under_another_licence_is_a_problem():
    pins = {**PINS, "b12x": "1.3.0"}
    present = {**good(), "b12x": ["1.3.0"]}
    assert check(pins, present, declared={"b12x": "Apache-2.0"}) == []
    assert check(pins, present, declared={"b12x": "LicenseRef-Proprietary"}) == [
        "b12x declares the licence 'LicenseRef-Proprietary'; v8 carries it under Apache-2.0 only"]
    assert check(pins, present, declared={}) == [
        "b12x declares the licence 'none'; v8 carries it under Apache-2.0 only"]


def test_the_base_version_is_read_from_its_version_file(tmp_path):
    assert base_version(tmp_path) is None
    (tmp_path / "vllm").mkdir()
    (tmp_path / "vllm/_version.py").write_text(
        "__version__: str\n__version__ = version = '0.34.0'\n__version_tuple__ = (0, 34, 0)\n")
    assert base_version(tmp_path) == "0.34.0"
    assert packages_for(base_version(tmp_path)).name == "packages-vllm-0.34.0.txt"


def test_a_package_the_base_must_carry_is_checked_never_installed():
    path = packages_for("0.34.0")
    pins, carried = read_pins(path), read_carried(path)
    assert carried == {"flashinfer-python": "0.7.3"} and "flashinfer-python" not in pins
    present = {name: [version] for name, version in (pins | carried).items()}
    assert check(pins, present, carried) == []
    (problem,) = check(pins, present | {"flashinfer-python": ["0.7.4"]}, carried)
    assert problem == ("flashinfer-python is 0.7.4; the base must carry 0.7.3 "
                       "(v8 does not install it)")
    (problem,) = check(pins, present | {"flashinfer-cubin": ["0.7.2"]}, carried)
    assert "beside flashinfer-python 0.7.3" in problem


def test_a_release_whose_set_lacks_its_packages_is_refused_in_one_line(tmp_path, monkeypatch):
    (tmp_path / "vllm").mkdir()
    (tmp_path / "vllm/_version.py").write_text("__version__ = version = '0.33.0'\n")
    assert v8.package_problem(TreeView(tmp_path)) is None
    monkeypatch.setitem(v8.BASE_REQUIRES, "0.33.0", {"flashinfer-python": "0.7.9"})
    assert v8.package_problem(TreeView(tmp_path)) == (
        "vLLM 0.33.0 requires flashinfer-python==0.7.9; v8 pins flashinfer-python==0.7.2.post1 "
        "(patches/v8/packages-vllm-0.33.0.txt); pin them in patches/v8/packages-vllm-0.33.0.txt")
    monkeypatch.setitem(v8.BASE_REQUIRES, "0.30.0", {"nvidia-cutlass-dsl": "4.7.1"})
    (tmp_path / "vllm/_version.py").write_text("__version__ = version = '0.30.0'\n")
    assert v8.package_problem(TreeView(tmp_path)) == (
        "vLLM 0.30.0 requires nvidia-cutlass-dsl==4.7.1; v8 pins nvidia-cutlass-dsl==4.6.2 "
        "(patches/v8/packages-vllm-0.30.0.txt); pin them in patches/v8/packages-vllm-0.30.0.txt")
    monkeypatch.setitem(v8.BASE_REQUIRES, "0.27.1", {"nvidia-cutlass-dsl": "4.7.1"})
    (tmp_path / "vllm/_version.py").write_text("__version__ = version = '0.27.1'\n")
    assert v8.package_problem(TreeView(tmp_path)) == (
        "vLLM 0.27.1 requires nvidia-cutlass-dsl==4.7.1; v8 pins nvidia-cutlass-dsl==4.6.2 "
        "(patches/v8/packages.txt); add patches/v8/packages-vllm-0.27.1.txt with them")


def test_installed_pins_pass():
    assert check(PINS, good()) == []


@pytest.mark.parametrize(
    "change, problem",
    [
        ({"nvidia-nccl-cu13": ["2.29.7"]}, "nvidia-nccl-cu13 is 2.29.7; the pin is 2.30.7"),
        ({"flashinfer-python": []}, "flashinfer-python is not installed; the pin is 0.6.18"),
        (
            {"flashinfer-python": ["0.6.17", "0.6.18"]},
            "flashinfer-python is installed 2 times (0.6.17, 0.6.18); the pin is 0.6.18",
        ),
        (
            {"flashinfer-jit-cache": ["0.6.17+cu130"]},
            "flashinfer-jit-cache 0.6.17+cu130 is installed",
        ),
        (
            {"flashinfer-cubin": ["0.6.17"]},
            "flashinfer-cubin 0.6.17 is installed beside flashinfer-python 0.6.18",
        ),
        (
            {"nvidia-cutlass-dsl-libs-cu14": ["4.7.0"]},
            "nvidia-cutlass-dsl-libs-cu14 is 4.7.0; every nvidia-cutlass-dsl package must be 4.6.2",
        ),
    ],
)
def test_each_departure_from_the_pins_is_one_line(change, problem):
    found = check(PINS, good() | change)
    assert len(found) == 1 and found[0].startswith(problem), found


def test_a_matching_cubin_is_fine_and_a_missing_one_is_explained():
    assert check(PINS, good() | {"flashinfer-cubin": ["0.6.18"]}) == []
    assert notes(PINS, good() | {"flashinfer-cubin": ["0.6.18"]}) == []
    (note,) = notes(PINS, good())
    assert "JIT-compiles" in note and "first boot" in note


def test_a_pins_file_without_flashinfer_or_with_a_range_is_refused(tmp_path):
    path = tmp_path / "packages.txt"
    path.write_text("nvidia-nccl-cu13==2.30.7\n")
    with pytest.raises(PackageError, match="no flashinfer-python==VERSION pin"):
        read_pins(path)
    path.write_text("flashinfer-python>=0.6.18\n")
    with pytest.raises(PackageError, match="is not a `name==version` pin"):
        read_pins(path)
