# SPDX-License-Identifier: Apache-2.0
"""DFlash keeps the trailing prefix-cache block EAGLE drops (installed by the GLM-5.3-Flash DGX
Spark recipe as ``vllm/config/glm53_dflash_block_drop.py``, patcher v11_dflash_block_drop).

EAGLE builds a position's draft KV from its hidden state and the next token, so the last cached
block of a prompt is volatile and vLLM drops it from every hit, and backs the KDA/Mamba
checkpoint off one block to match. DFlash builds its draft KV from the target's hidden states
alone, so the drop only costs the hit a block: with GLM-5.3-Flash's 2304-token blocks, one
block of every turn 2. vLLM 0.33.0 says so itself (``needs_eagle_block_drop`` leaves DFlash
out); this module gives the same answer to the bases before it.

No vLLM imports: ``vllm/config/speculative.py`` imports this while ``vllm.config`` is still
being built.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

DFLASH = "dflash"


def needs_block_drop(method: str | None) -> bool:
    """Whether a drafter of this ``speculative_config.method`` needs EAGLE's trailing-block drop
    (asked only where the base would drop it)."""
    return method != DFLASH


def without_dflash_block_drop(use_eagle_block_drop: Callable[[Any], bool]) -> Callable[[Any], bool]:
    """For ``SpeculativeConfig.use_eagle_block_drop``: False for DFlash, the base's answer for
    every other method."""

    @functools.wraps(use_eagle_block_drop)
    def decorated(self: Any) -> bool:
        return use_eagle_block_drop(self) and needs_block_drop(getattr(self, "method", None))

    return decorated


def drops_trailing_block(use_eagle: bool, speculative_config: Any) -> bool:
    """For a scheduler that drops the block whenever ``use_eagle()`` holds (the fork's shape,
    before ``use_eagle_block_drop`` existed): whether it should drop it."""
    return use_eagle and needs_block_drop(getattr(speculative_config, "method", None))
