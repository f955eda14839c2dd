"""Exercise layer v13's adaptive-verify functions and the patched MoE router on CPU torch.

Run with PYTHONPATH set to a v13-patched tree and GLM53_* in the environment (the switch
module reads them at import). Prints one JSON object: the confident prefixes recorded from
designed selector scores, the drafts the rejection sampler is given, and the patched
router's choice against what the unpatched routing computed (its ``_compute_routing``).
"""

import json
import os
from types import SimpleNamespace

import torch
import vllm.platforms
from vllm.platforms.cpu import CpuPlatform

vllm.platforms._current_platform = CpuPlatform()

import vllm.glm53_v13_switches as switches
from vllm.model_executor.layers.fused_moe.router.base_router import BaseRouter

K, TOP_K, MAX_REQS = 4, 5, 6


def scores_with_confidence(confidence: list[list[float]]) -> torch.Tensor:
    """Selector scores whose largest softmax at each (request, draft) is the given value."""
    out = torch.full((MAX_REQS, K, TOP_K), float("-inf"))
    for r, row in enumerate(confidence):
        for j, c in enumerate(row):
            rest = (1.0 - c) / (TOP_K - 1)
            out[r, j] = torch.log(torch.tensor([c] + [rest] * (TOP_K - 1), dtype=torch.float64)).float()
    return out


# request slot r (idx_mapping) -> designed confidences of its 4 drafts
CONFIDENCE = [[0.9, 0.8, 0.25, 0.9], [0.2, 0.9, 0.9, 0.9], [0.95, 0.1, 0.95, 0.95]]
SLOTS = [4, 1, 2]  # persistent request states of the three batch rows
TEMPERATURE = torch.tensor([0.0, 0.0, 0.7, 0.0, 0.0, 0.0])  # slot 2 samples at 0.7


def record():
    speculator = SimpleNamespace(_selector_scores=scores_with_confidence(CONFIDENCE))
    batch = SimpleNamespace(num_reqs=3, idx_mapping=torch.tensor(SLOTS, dtype=torch.int32))
    switches.adaptive_verify_record(speculator, batch)
    state = switches._STATE
    return None if state is None else state.verify_len.tolist()


def verify_batch():
    """The logits rows of one verify step: each request's anchor row and its K drafts."""
    idx = torch.tensor([s for s in SLOTS for _ in range(K + 1)], dtype=torch.int32)
    local = torch.tensor([p for _ in SLOTS for p in range(K + 1)], dtype=torch.int32)
    drafts = torch.arange(100, 100 + idx.numel())
    rows = torch.arange(idx.numel()) + 2  # two prefill rows of another request come first
    return SimpleNamespace(expanded_idx_mapping=idx, expanded_local_pos=local, logits_indices=rows,
                           num_rows=int(rows.max()) + 1), drafts


class FixedRouter(BaseRouter):
    """A router whose own routing is given: what the unpatched select_experts returns."""

    def __init__(self, weights, ids):
        super().__init__(top_k=ids.shape[1], global_num_experts=64)
        self.weights, self.ids = weights, ids

    @property
    def routing_method_type(self):
        return None

    def _compute_routing(self, hidden_states, router_logits, indices_type, input_ids=None):
        return self.weights.clone(), self.ids.clone()


def route(batch, sampler):
    rows = batch.num_rows
    weights = torch.rand(rows, 2, generator=torch.Generator().manual_seed(5))
    ids = torch.randint(0, 64, (rows, 2), generator=torch.Generator().manual_seed(6))
    router = FixedRouter(weights, ids)
    hidden = torch.zeros(rows, 8)
    first_w, first_i = router.select_experts(hidden, torch.zeros(rows, 64))  # sizes the buffers
    switches.adaptive_verify_rows(batch, sampler, SimpleNamespace(parallel_config=SimpleNamespace()))
    got_w, got_i = router.select_experts(hidden, torch.zeros(rows, 64))
    masked = switches.adaptive_verify_masked(batch.expanded_idx_mapping, batch.expanded_local_pos,
                                             TEMPERATURE)
    masked_rows = [] if masked is None else batch.logits_indices[masked].tolist()
    anchor = {int(r): int(batch.logits_indices[i - int(batch.expanded_local_pos[i])])
              for i, r in enumerate(batch.logits_indices.tolist())}
    others = [r for r in range(rows) if r not in masked_rows]
    return {
        "first_call_unchanged": torch.equal(first_w, weights) and torch.equal(first_i, ids),
        "masked_rows": masked_rows,
        "masked_take_anchor_ids": all(torch.equal(got_i[r], ids[anchor[r]]) for r in masked_rows),
        "masked_weight_zero": all(bool((got_w[r] == 0).all()) for r in masked_rows),
        "others_unchanged": torch.equal(got_w[others], weights[others]) and torch.equal(got_i[others], ids[others]),
    }


def main():
    verify_len = record()
    batch, drafts = verify_batch()
    given = switches.adaptive_verify_drafts(drafts, batch.expanded_idx_mapping, batch.expanded_local_pos,
                                            TEMPERATURE)
    sampler = SimpleNamespace(sampling_states=SimpleNamespace(temperature=SimpleNamespace(gpu=TEMPERATURE)))
    print(json.dumps({
        "switches": {name: os.environ.get(name) for name in sorted(os.environ) if name.startswith("GLM53_")},
        "verify_len": verify_len,
        "drafts_given": [given[i * (K + 1):(i + 1) * (K + 1)].tolist() for i in range(len(SLOTS))],
        "drafts": [drafts[i * (K + 1):(i + 1) * (K + 1)].tolist() for i in range(len(SLOTS))],
        "router": route(batch, sampler),
    }))


if __name__ == "__main__":
    main()
