"""The quality gate's KL estimate computed from float64 next-token distributions, to compare
with what bench/quality.py measured on a server (the engine tier on CPU, the GPU tier on
CUDA): both read the reference's top N and a tail bucket (bench/divergence.py)."""

from __future__ import annotations

import numpy as np

from bench import divergence


def top(row: list[float], n: int) -> dict[int, float]:
    order = np.argsort(row)[::-1][:n]
    return {int(t): float(row[t]) for t in order}


def expected_kls(ref_rows: list, cand_rows: list, ref_tokens: list[int], top_n: int
                 ) -> tuple[list[float], list[float]]:
    """(the gate's estimator on float64 top-N lists, the full KL) per position."""
    coarse, full = [], []
    for row_p, row_q, token in zip(ref_rows, cand_rows, ref_tokens):
        listed_q = top(row_q, top_n)
        listed_q.setdefault(token, row_q[token])  # vLLM adds the scored token
        coarse.append(divergence.score_position(
            top(row_p, top_n), listed_q, sorted(row_q, reverse=True)[top_n - 1]).kl)
        p, q = np.exp(np.array(row_p)), np.array(row_q)
        full.append(float(np.sum(p * (np.array(row_p) - q))))
    return coarse, full
