"""KL(reference || candidate) and top-1 agreement of two top-N next-token distributions, and
their totals per phase.

A server returns only its N most likely tokens, so the full KL cannot be formed. What is
formed is the KL of the coarse-grained distributions over the reference's top-N tokens plus
one "tail" bucket holding the rest of each side's mass (1 - the listed mass). Merging
outcomes never raises a KL (the log-sum inequality), so on exact inputs this estimate is a
lower bound of the true KL, and equals it when the tail carries nothing. A reference token
missing from the candidate's list is given the candidate's smallest listed probability (the
largest it can have) and counted as `imputed`; a tail the imputation drove to <= 0 is
floored at TAIL_FLOOR.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

TAIL_FLOOR = 1e-12


@dataclass
class PositionScore:
    kl: float
    top1_agrees: bool
    imputed: int


def score_position(ref: dict[int, float], cand: dict[int, float],
                   cand_floor: float | None = None) -> PositionScore:
    """ref, cand: token id -> logprob (natural log) of each side's listed tokens; cand_floor:
    the candidate's N-th largest logprob (its list may carry extra, lower entries, such as
    the prompt token vLLM adds to prompt_logprobs), default its smallest listed one."""
    if not ref or not cand:
        raise ValueError("a position without listed logprobs cannot be scored")
    floor_lp = min(cand.values()) if cand_floor is None else cand_floor
    kl, imputed, p_listed, q_listed = 0.0, 0, 0.0, 0.0
    for token, lp in ref.items():
        lq = cand.get(token)
        if lq is None:
            lq, imputed = floor_lp, imputed + 1
        p = math.exp(lp)
        kl += p * (lp - lq)
        p_listed += p
        q_listed += math.exp(lq)
    p_tail = max(1.0 - p_listed, 0.0)
    q_tail = max(1.0 - q_listed, TAIL_FLOOR)
    if p_tail > 0.0:
        kl += p_tail * math.log(p_tail / q_tail)
    top_ref = max(ref, key=ref.__getitem__)
    top_cand = max(cand, key=cand.__getitem__)
    return PositionScore(kl=max(kl, 0.0), top1_agrees=top_ref == top_cand, imputed=imputed)


@dataclass
class Totals:
    positions: int = 0
    kl_sum: float = 0.0
    kl_max: float = 0.0
    agree: int = 0
    imputed: int = 0

    def add(self, score: PositionScore) -> None:
        self.positions += 1
        self.kl_sum += score.kl
        self.kl_max = max(self.kl_max, score.kl)
        self.agree += score.top1_agrees
        self.imputed += score.imputed

    def to_json(self) -> dict:
        n = self.positions
        return {"positions": n, "kl_mean": self.kl_sum / n if n else None,
                "kl_max": self.kl_max if n else None,
                "top1_agreement": self.agree / n if n else None, "imputed": self.imputed}
