"""Run DFlash2's pure-torch parts from the tree on PYTHONPATH against plain loops.

Prints one JSON object: the largest absolute difference for each part, and which
vllm was imported (so the caller can prove the patched tree was the one used).
"""

import itertools
import json

import torch
import vllm
from vllm.model_executor.models import qwen3_dflash2
from vllm.v1.worker.gpu.spec_decode.dflash2 import speculator

torch.manual_seed(0)


def grouped_conv_reference(hidden, delta, base, block_size, num_groups, group_size, taps):
    tokens = hidden.shape[0]
    out = torch.zeros_like(hidden)
    for t, g, j in itertools.product(range(tokens), range(num_groups), range(group_size)):
        channel = g * group_size + j
        total = 0.0
        for tap in range(taps):
            if t % block_size >= tap:
                coefficient = base[0, tap, channel] + delta[t, tap, g]
                total += coefficient * hidden[t - tap, channel]
        out[t, channel] = total
    return out


def score_edges_reference(pred_table, succ_table, candidates, unary, hidden, anchors):
    batch, steps, top_k = candidates.shape
    out = torch.zeros(batch, steps, top_k, top_k, dtype=hidden.dtype)
    for b, step, p, c in itertools.product(range(batch), range(steps), range(top_k), range(top_k)):
        previous = anchors[b] if step == 0 else candidates[b, step - 1, p]
        following = candidates[b, step, c]
        edge = sum(
            pred_table[previous, r] * hidden[b, step, r] * succ_table[following, r]
            for r in range(hidden.shape[-1])
        )
        out[b, step, p, c] = unary[b, step, c] + edge
    return out


def main():
    tokens, groups, group_size, taps, block = 11, 3, 4, 2, 4
    hidden = torch.randn(tokens, groups * group_size, dtype=torch.float64)
    delta = torch.randn(tokens, taps, groups, dtype=torch.float64)
    base = torch.randn(1, taps, groups * group_size, dtype=torch.float64)
    conv = qwen3_dflash2._grouped_conv(hidden, delta, base, block, groups, group_size, taps)
    conv_ref = grouped_conv_reference(hidden, delta, base, block, groups, group_size, taps)

    vocab, rank, batch, steps, top_k = 50, 6, 2, 3, 4
    pred_table = torch.randn(vocab, rank, dtype=torch.float64)
    succ_table = torch.randn(vocab, rank, dtype=torch.float64)
    candidates = torch.randint(0, vocab, (batch, steps, top_k))
    unary = torch.randn(batch, steps, top_k, dtype=torch.float64)
    hidden_r = torch.randn(batch, steps, rank, dtype=torch.float64)
    anchors = torch.randint(0, vocab, (batch,))
    scores = qwen3_dflash2._score_edges(pred_table, succ_table, candidates, unary, hidden_r, anchors, top_k)
    scores_ref = score_edges_reference(pred_table, succ_table, candidates, unary, hidden_r, anchors)

    print(json.dumps({
        "vllm_file": vllm.__file__,
        "speculator_class": speculator.DFlash2Speculator.__name__,
        "conv_shape": list(conv.shape),
        "conv_max_abs_diff": (conv - conv_ref).abs().max().item(),
        "scores_shape": list(scores.shape),
        "scores_max_abs_diff": (scores - scores_ref).abs().max().item(),
    }))


if __name__ == "__main__":
    main()
