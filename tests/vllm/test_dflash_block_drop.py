"""Patcher v11_dflash_block_drop on the pinned trees: applied on 0.30.0 (a decorator on
SpeculativeConfig.use_eagle_block_drop) and on the fork shape (the scheduler's two EAGLE drop
sites), provided by 0.33.0, refused on drift. What it does to turn 2 is proven on vLLM's own
scheduler in test_prefix_reuse.py."""

import os

import pytest

from tests.vllm.conftest import patch_layer, tree_digest

LAYER = "v11_dflash_block_drop"
HELPER = "vllm/config/glm53_dflash_block_drop.py"


# The patched modules' imports (vllm.config imports the helper while half built) are proven by
# test_prefix_reuse.py's probe, which imports them on these trees.
@pytest.mark.parametrize("base, target", [
    ("0.30.0", "vllm/config/speculative.py"),
    ("fork", "vllm/v1/core/sched/scheduler.py"),
])
def test_applies_then_is_already_applied(tree_copy, base, target):
    root = tree_copy(base)
    code, report, _ = patch_layer(LAYER, root, "--import-check", "off")
    assert (code, report["outcome"]) == (0, "applied"), report
    assert report["files"] == [target, HELPER]
    before = tree_digest(root)
    code, report, _ = patch_layer(LAYER, root)
    assert (code, report["outcome"]) == (0, "already-applied"), report
    assert tree_digest(root) == before


def test_0_33_0_provides_it(tree_copy):
    root = tree_copy("0.33.0")
    before = tree_digest(root)
    code, report, _ = patch_layer(LAYER, root)
    assert (code, report["outcome"]) == (0, "provided-by-base"), report
    assert "needs_eagle_block_drop" in report["reason"]
    assert tree_digest(root) == before


@pytest.mark.parametrize("base, relative, old, new, message", [
    # 0.30.0's method answering otherwise: nobody knows whether DFlash still gets the drop
    ("0.30.0", "vllm/config/speculative.py",
     "return self.use_eagle() and not self.disable_eagle_block_drop",
     "return self.use_eagle()", "use_eagle_block_drop returns 'self.use_eagle()'"),
    # the fork's KDA back-off under another condition
    ("fork", "vllm/v1/core/sched/scheduler.py", "        if self.use_eagle:\n            last_cache_position",
     "        if self.use_eagle and block_size:\n            last_cache_position",
     "0 'if self.use_eagle:' KDA back-offs"),
])
def test_drift_is_refused_in_one_line_and_the_tree_is_unchanged(tree_copy, base, relative, old, new, message):
    root = tree_copy(base)
    target = root / relative
    text = target.read_text()
    assert text.count(old) == 1
    os.unlink(target)  # a hard link into the cache: write a file of its own
    target.write_text(text.replace(old, new))
    before = tree_digest(root)
    code, report, _ = patch_layer(LAYER, root)
    assert code == 3 and report["outcome"] == "refused"
    assert message in report["reason"] and len(report["reason"].splitlines()) == 1, report
    assert tree_digest(root) == before
