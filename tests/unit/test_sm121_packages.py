"""P of layer v8: the pins file, and the check of what is installed against it."""

import re

import pytest

from recipekit.flashinfer_sources import WHEEL_SHA256 as FLASHINFER_SHA256
from recipekit.sm121_packages import PACKAGES, PackageError, check, notes, read_pins

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


def test_every_pin_carries_sha256_and_flashinfer_matches_the_source_tree_pin():
    text = PACKAGES.read_text()
    blocks = re.split(r"\n(?=[a-z])", text[text.index("flashinfer-python==") :])
    for block in blocks:
        assert re.findall(r"--hash=sha256:[0-9a-f]{64}", block), block.splitlines()[0]
    flashinfer = blocks[0]
    assert flashinfer.startswith("flashinfer-python==0.6.18")
    assert re.findall(r"sha256:([0-9a-f]{64})", flashinfer) == [FLASHINFER_SHA256["0.6.18"]]


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
