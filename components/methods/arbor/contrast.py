"""ARBOR's contrastive induction plan (paper 3.2 and appendix A.1): which trajectories of a query-group are
shown to the inducer, as which pairs, or why the group induces nothing.

Correctness is the strict-format-gated F1 (token F1 when the episode is format-valid, else 0), the value the
paper's induction and Table 2 reason about. Rules, in order:

1. fewer than two format-valid trajectories: skip (``too_few_valid``);
2. every F1 is 1: skip (``all_correct``); every F1 is 0: skip (``all_wrong``);
3. every F1 is the same intermediate value: no labels can be given, so all trajectories go to the inducer
   unlabelled (``uniform_partial``). A.1 also says a group with nothing below tau+ is skipped; that rule is
   read as covering the all-0 / all-1 cases above, since the homogeneous-group rule names this one;
4. otherwise the anchors: tau+ = highest F1, tau-worst = lowest F1, tau-hard = highest F1 strictly below
   tau+; every tie goes to the shortest response, then to the lower index. When tau-hard and tau-worst are the
   same trajectory (one trajectory below tau+, or all of those below share one F1 and length decides both),
   only the pair (tau+, tau-hard) is sent (``collapsed``), else both pairs (``contrast``).

    plan = plan_induction(f1=[1.0, 0.5, 0.0], lengths=[40, 30, 20], valid=[True, True, True])
    plan.pairs        # [(0, 2), (0, 1)]: (tau+, tau-worst), (tau+, tau-hard)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

__all__ = ["InductionPlan", "plan_induction"]

SkipReason = Literal["too_few_valid", "all_correct", "all_wrong"]


@dataclass(frozen=True)
class InductionPlan:
    kind: Literal["skip", "pairs", "unlabelled"]
    reason: Literal["too_few_valid", "all_correct", "all_wrong", "uniform_partial", "collapsed", "contrast"]
    positive: int | None = None
    worst: int | None = None
    hard: int | None = None
    pairs: list[tuple[int, int]] = field(default_factory=list)  # (higher, lower) indices into the group
    members: list[int] = field(default_factory=list)  # unlabelled: every trajectory, in group order


def _pick(candidates: list[int], f1: Sequence[float], lengths: Sequence[int], best: bool) -> int:
    sign = -1.0 if best else 1.0
    return min(candidates, key=lambda i: (sign * f1[i], lengths[i], i))


def plan_induction(f1: Sequence[float], lengths: Sequence[int], valid: Sequence[bool]) -> InductionPlan:
    """The plan for one group; ``f1`` is the format-gated F1 of each trajectory, ``lengths`` its response length."""
    if not len(f1) == len(lengths) == len(valid):
        raise ValueError(f"f1 ({len(f1)}), lengths ({len(lengths)}) and valid ({len(valid)}) differ in length")
    if sum(bool(v) for v in valid) < 2:
        return InductionPlan("skip", "too_few_valid")
    if all(x == 1.0 for x in f1):
        return InductionPlan("skip", "all_correct")
    if all(x == 0.0 for x in f1):
        return InductionPlan("skip", "all_wrong")
    everyone = list(range(len(f1)))
    if len(set(f1)) == 1:
        return InductionPlan("unlabelled", "uniform_partial", members=everyone)
    positive = _pick(everyone, f1, lengths, best=True)
    worst = _pick(everyone, f1, lengths, best=False)
    below = [i for i in everyone if f1[i] < f1[positive]]
    hard = _pick(below, f1, lengths, best=True)
    if hard == worst:
        return InductionPlan("pairs", "collapsed", positive, worst, hard, pairs=[(positive, hard)])
    return InductionPlan("pairs", "contrast", positive, worst, hard, pairs=[(positive, worst), (positive, hard)])
