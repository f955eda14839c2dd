# SPDX-License-Identifier: Apache-2.0
"""Auxiliary hidden states of Glm5Next for EAGLE3-style drafters (DFlash), with mHC semantics.

Installed beside vllm/models/glm5next/nvidia/model.py by the GLM-5.3-Flash DGX Spark
recipe's v10 layer; the patched ``Glm5NextModel.forward`` calls it once per tapped layer.

Each mHC layer defers its final ``hc_post`` into the next layer's fused pre-op, so
between two layers the loop holds the raw layer output plus the deferred state
(``residual``, ``post``, ``comb``). The drafter was trained on the completed stream:
materialise that ``hc_post`` with the previous layer's own post op (which returns a
new tensor and leaves the deferred state untouched for the next layer), then average
the ``hc_mult`` streams into one hidden vector, as ``hc_contract`` does at the end of
the model.
"""

from __future__ import annotations

import torch
from torch import nn

from vllm.model_executor.layers.mhc import hc_contract
from vllm.models.common.ops.sequence_parallel import sp_all_gather


def completed_hidden_state(
    previous_layer: nn.Module | None,
    hidden_states: torch.Tensor,
    residual: torch.Tensor | None,
    post: torch.Tensor | None,
    comb: torch.Tensor | None,
) -> torch.Tensor:
    """The finished output of ``previous_layer`` as one ``hidden_size`` vector per token.

    Without deferred state (the embeddings before layer 0, a non-mHC layer, or the
    last layer, which materialises and contracts itself) ``hidden_states`` already is
    that output.
    """
    if post is None:
        return hidden_states
    if previous_layer is None or residual is None or comb is None:
        raise ValueError("deferred mHC state without the layer that owns it")
    completed = previous_layer.hc_post(hidden_states, residual, post, comb)
    return hc_contract(completed, previous_layer.n)


def capture_aux_hidden_state(
    model: nn.Module,
    layer_idx: int,
    hidden_states: torch.Tensor,
    residual: torch.Tensor | None,
    post: torch.Tensor | None,
    comb: torch.Tensor | None,
    num_tokens: int,
) -> torch.Tensor:
    """The stream entering layer ``layer_idx`` of ``model``, over all ``num_tokens`` tokens."""
    previous_layer = model.layers[layer_idx - 1] if layer_idx > 0 else None
    state = completed_hidden_state(previous_layer, hidden_states, residual, post, comb)
    if model.is_sequence_parallel:
        # Layers run on this rank's token shard; the drafter reads every token.
        state = sp_all_gather(state)[:num_tokens]
    return state
