"""Run the v10-patched Glm5NextModel.forward on a small mHC stack and report what it captured.

Run with PYTHONPATH set to a vLLM 0.30.0 tree patched by v10. The stack's layers are
small stand-ins with Glm5Next's layer contract (forward(positions, x, residual, post,
comb) deferring hc_post to the next layer; hc_post through a real MHCPostOp, routed to
forward_native on CPU). The expected aux states are computed here, independently, from
the post formula out_j = post_j * x + sum_i comb_ij * residual_i and a mean over streams.
Prints one JSON object.
"""

import json
import sys
from types import SimpleNamespace

import torch
import vllm.platforms
from torch import nn
from vllm.platforms.cpu import CpuPlatform

vllm.platforms._current_platform = CpuPlatform()

from vllm.config import VllmConfig, set_current_vllm_config
from vllm.model_executor.layers.mhc import MHCPostOp
from vllm.model_executor.models.interfaces import EagleModelMixin, supports_eagle3
from vllm.models.glm5next.nvidia import mhc_aux_capture
from vllm.models.glm5next.nvidia import model as glm
from vllm.v1.worker.gpu.spec_decode.eagle.eagle3_utils import (
    get_eagle3_aux_layers_from_config,
)

# A single process stands in for rank 0 of one pipeline stage.
glm.get_pp_group = lambda: SimpleNamespace(is_first_rank=True, is_last_rank=True)

NUM_LAYERS, HIDDEN, STREAMS, TOKENS, VOCAB = 12, 16, 4, 5, 40
# Tap sets shaped like the published drafters' (5 and 9 taps over 45 layers), scaled to 12.
TAPS = {"five": [1, 3, 6, 8, 10], "nine": [1, 2, 3, 5, 6, 7, 8, 9, 11]}

torch.manual_seed(0)
with set_current_vllm_config(VllmConfig()):
    POST_OPS = [MHCPostOp() for _ in range(NUM_LAYERS)]
for op in POST_OPS:
    op._forward_method = op.forward_native  # the CPU kernel needs vLLM's compiled ops


class StandInMhcLayer(nn.Module):
    """Glm5Next's decoder-layer contract on a few plain tensors."""

    def __init__(self, layer_idx: int) -> None:
        super().__init__()
        self.layer_idx, self.n = layer_idx, STREAMS
        self.mhc_post_op = POST_OPS[layer_idx]
        self.weight = nn.Parameter(torch.randn(HIDDEN, HIDDEN) * 0.3, requires_grad=False)
        self.mix = nn.Parameter(torch.randn(STREAMS * HIDDEN, STREAMS + STREAMS * STREAMS) * 0.1,
                                requires_grad=False)
        self.received: list[tuple] = []

    def hc_post(self, x, residual, post, comb):
        return self.mhc_post_op(x, residual, post, comb)

    def forward(self, positions, x, residual, post, comb):
        self.received.append(tuple(None if t is None else t.clone() for t in (x, residual, post, comb)))
        if post is None:
            stream = x.unsqueeze(1).expand(-1, STREAMS, -1).contiguous()
        else:
            stream = self.hc_post(x, residual, post, comb)
        mixes = stream.flatten(1) @ self.mix
        new_post = torch.sigmoid(mixes[:, :STREAMS]).unsqueeze(-1)
        new_comb = torch.softmax(mixes[:, STREAMS:].view(-1, STREAMS, STREAMS), dim=-1)
        out = torch.tanh(stream.mean(dim=1) @ self.weight)
        if self.layer_idx == NUM_LAYERS - 1:
            return self.hc_post(out, stream, new_post, new_comb).mean(dim=1), None, None, None
        return out, stream, new_post, new_comb


def build_model(aux_layers):
    model = glm.Glm5NextModel.__new__(glm.Glm5NextModel)
    nn.Module.__init__(model)
    model.layers = nn.ModuleList(StandInMhcLayer(i) for i in range(NUM_LAYERS))
    model.start_layer, model.end_layer = 0, NUM_LAYERS
    model._active_layers = model.layers[0:NUM_LAYERS]
    model.embed_tokens = nn.Embedding(VOCAB, HIDDEN)
    model.norm = nn.Identity()
    model.is_sequence_parallel = False
    model._set_aux_hidden_state_layers(tuple(aux_layers))
    return model


def expected_states(model, input_ids):
    """The completed stream entering every layer boundary 0..NUM_LAYERS, computed here."""
    x = model.embed_tokens(input_ids)
    residual = post = comb = None
    states = []
    for layer in model.layers:
        if post is None:
            states.append(x)
        else:
            completed = post * x.unsqueeze(1) + torch.einsum("sij,sih->sjh", comb, residual)
            states.append(completed.mean(dim=1))
        x, residual, post, comb = layer.forward(None, x, residual, post, comb)
    states.append(x)
    return states


def run(taps):
    spec_config = SimpleNamespace(
        draft_model_config=SimpleNamespace(hf_config=SimpleNamespace(dflash_config={"target_layer_ids": taps}))
    )
    aux_layers = list(get_eagle3_aux_layers_from_config(spec_config))
    input_ids = torch.randint(0, VOCAB, (TOKENS,))
    positions = torch.arange(TOKENS)

    torch.manual_seed(1)
    plain = build_model(())
    plain_out = plain(input_ids, positions, None)
    torch.manual_seed(1)
    tapped = build_model(aux_layers)
    tapped_out, captured = tapped(input_ids, positions, None)
    torch.manual_seed(1)
    reference = expected_states(build_model(()), input_ids)

    deferred_identical = all(
        all((a is None and b is None) or torch.equal(a, b) for a, b in zip(ra, rb))
        for la, lb in zip(plain.layers, tapped.layers)
        for ra, rb in zip(la.received, lb.received)
    )
    return {
        "aux_layers": aux_layers,
        "taps_plus_one": [t + 1 for t in taps],
        "num_captured": len(captured),
        "max_abs_error": max((c - reference[layer]).abs().max().item() for c, layer in zip(captured, aux_layers)),
        "captured_shapes": sorted({tuple(c.shape) for c in captured}),
        "last_layer_tap_is_final_output": (NUM_LAYERS in aux_layers
                                           and torch.equal(captured[-1], plain_out)),
        "plain_returns_tensor": isinstance(plain_out, torch.Tensor),
        "outputs_equal": torch.equal(plain_out, tapped_out),
        "deferred_state_bit_identical": deferred_identical,
    }


def sequence_parallel_gather():
    """Under SP each rank holds a shard; the capture must come back at the full token count."""
    torch.manual_seed(2)
    model = build_model((3,))
    model.is_sequence_parallel = True
    shard = torch.randn(3, HIDDEN)
    calls = []

    def fake_gather(tensor):
        calls.append(tuple(tensor.shape))
        return torch.cat([tensor, tensor + 100.0])  # two ranks' shards, padded to 6 rows

    real = mhc_aux_capture.sp_all_gather
    mhc_aux_capture.sp_all_gather = fake_gather
    try:
        state = mhc_aux_capture.capture_aux_hidden_state(model, 0, shard, None, None, None, 5)
    finally:
        mhc_aux_capture.sp_all_gather = real
    return {"gather_calls": calls, "shape": list(state.shape),
            "first_rows_are_shard": torch.equal(state[:3], shard)}


def main():
    report = {
        "vllm_file": vllm.__file__,
        "model_is_eagle_mixin": issubclass(glm.Glm5NextModel, EagleModelMixin),
        "causal_lm_supports_eagle3": supports_eagle3(glm.Glm5NextForCausalLM),
        "multimodal_supports_eagle3": supports_eagle3(glm.Glm5NextForConditionalGeneration),
        "runs": {name: run(taps) for name, taps in TAPS.items()},
        "sequence_parallel": sequence_parallel_gather(),
    }
    json.dump(report, sys.stdout)
    print()


if __name__ == "__main__":
    main()
