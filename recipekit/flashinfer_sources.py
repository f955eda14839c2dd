"""Real FlashInfer package trees: the pinned ``flashinfer-python`` wheels from PyPI, unpacked.

The wheel is pure Python (``py3-none-any``) and carries the CUDA headers FlashInfer
JIT-compiles from (``flashinfer/data/include``), so the whole ``flashinfer/`` directory is
kept: v8 patches one Python file and one header of it.
"""

from __future__ import annotations

from pathlib import Path

from recipekit.pinned_wheels import PinnedWheel, SourceError, unpacked_tree, wheel_file

# sha256 of flashinfer_python-VERSION-py3-none-any.whl as served by PyPI. 0.6.18 is the
# version the fork's set pins (patches/v8/packages.txt carries the same hash); 0.6.17 is the
# release before it, which v8 must refuse. 0.7.2.post1 is vLLM 0.33.0's (its set,
# patches/v8/packages-vllm-0.33.0.txt, carries the same hash); 0.7.4 is the release after
# 0.7.3, which vLLM 0.34.0 requires and PyPI does not have.
WHEEL_SHA256 = {
    "0.6.17": "ab7ce3aec42faf2f6079aa840c2407ac00ecd277a0524cdb708a8ff4a64dad90",
    "0.6.18": "d5d26edb48f8def0bf28b2c94415aef7f0754e2cd9e3cb3d6e7081262d068aad",
    "0.7.2.post1": "bfdc18b9e1e4d8d0730fe4343dc0e284cd0c160086de80f99888bc4867922d49",
    "0.7.4": "a051a62e09a2738e8b0de47a1944fd2f0f3eff01b728b662141ea660cb09dd32",
}


def _pinned(version: str) -> PinnedWheel:
    if version not in WHEEL_SHA256:
        known = ", ".join(sorted(WHEEL_SHA256))
        raise SourceError(
            f"flashinfer-python {version} has no pinned wheel hash; pinned versions: {known}"
        )
    return PinnedWheel(
        project="flashinfer-python",
        version=version,
        sha256=WHEEL_SHA256[version],
        package="flashinfer",
        cache_dir="flashinfer-src",
        pin_file="recipekit/flashinfer_sources.py",
    )


def flashinfer_tree(version: str, log=lambda message: None) -> Path:
    """The directory holding the ``flashinfer/`` package of ``version`` (fetched once)."""
    return unpacked_tree(_pinned(version), log)


def flashinfer_wheel(version: str, log=lambda message: None) -> Path:
    """The pinned ``flashinfer-python`` wheel of ``version`` itself (what a stand-in installs)."""
    return wheel_file(_pinned(version), log)
