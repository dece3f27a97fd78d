"""SS-GRPO's stage rewards and returns (RubricEM 3.3, Algorithm 1 lines 20-23).

Each episode gets K = 4 stage scores ``R_{i,k}`` in [0, 1] from the stagewise judge
(:class:`StagewiseReward`). Returns mix in the stages a stage enables through the causal matrix Lambda
(``lambda_{k,j} = 0`` for ``j < k``, ``lambda_{k,k} = 1``): ``G_{i,k} = sum_j lambda_{k,j} R_{i,j}``, i.e.
``G = R @ Lambda.T``. Advantages normalise each stage's returns within the group
(:func:`components.training.grpo.advantages.group_advantages`), and the trainer gives every token of stage k
the value ``A_{i,k}`` (the scaffold agent tags stage k's tokens with segment id k).

A missing score is never a 0: ``G_{i,k}`` is missing (NaN) when any score it weighs (``lambda_{k,j} != 0``)
is missing, so that stage's tokens leave the loss and its value leaves the group's mean and std. When the
judge's scoring call failed only the answer stage keeps a score (its reference F1), so such an episode trains
its answer tokens only.

    advantage_fn = StageReturns(params.rubricem.stage_lambda)
    GRPOTrainer(..., reward_fn=StagewiseReward(judge), advantage_fn=advantage_fn)
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from components.methods.rubricem.stagewise_judge import StagewiseJudge
from components.training.grpo.advantages import group_advantages
from components.training.grpo.episodes import Episode, RewardOutput, StepContext

__all__ = ["StageReturns", "StagewiseReward", "check_lambda", "stage_returns"]


def check_lambda(matrix: Sequence[Sequence[float]]) -> torch.Tensor:
    """Lambda as a ``[K, K]`` tensor, or a ValueError naming the entry that breaks causality."""
    lam = torch.as_tensor([list(map(float, row)) for row in matrix], dtype=torch.float32)
    if lam.ndim != 2 or lam.shape[0] != lam.shape[1]:
        raise ValueError(f"stage_lambda must be a square matrix, got shape {tuple(lam.shape)}")
    for k in range(lam.shape[0]):
        if lam[k, k] != 1.0:
            raise ValueError(f"stage_lambda[{k}][{k}] must be 1 (a stage keeps its own score), got {float(lam[k, k])}")
        for j in range(k):
            if lam[k, j] != 0.0:
                raise ValueError(f"stage_lambda[{k}][{j}] must be 0 (a stage takes no credit from earlier stages), "
                                 f"got {float(lam[k, j])}")
    return lam


def stage_returns(scores: torch.Tensor, lam: torch.Tensor) -> torch.Tensor:
    """``G = R @ Lambda.T`` for ``R`` ``[n, K]``; NaN where a weighed score is NaN."""
    if scores.ndim != 2 or scores.shape[1] != lam.shape[0]:
        raise ValueError(f"scores {tuple(scores.shape)} do not fit a {lam.shape[0]}-stage Lambda")
    missing = torch.isnan(scores)
    returns = torch.where(missing, torch.zeros_like(scores), scores) @ lam.T
    uses_missing = (missing.float() @ (lam != 0).float().T) > 0
    return torch.where(uses_missing, torch.full_like(returns, float("nan")), returns)


class StageReturns:
    """The SS-GRPO ``advantage_fn``: stage returns, then per-stage group normalisation."""

    def __init__(self, matrix: Sequence[Sequence[float]], *, normalize_std: bool = True, eps: float = 1e-6):
        self.lam, self.normalize_std, self.eps = check_lambda(matrix), normalize_std, eps

    def __call__(self, episodes: list[Episode], scores: torch.Tensor, ctx: StepContext | None = None) -> torch.Tensor:
        returns = stage_returns(scores.float(), self.lam)
        return group_advantages(returns, [e.group for e in episodes], normalize_std=self.normalize_std, eps=self.eps)


class StagewiseReward:
    """Per-stage scores from the stagewise judge for every episode of a step (async; calls run concurrently).
    Each episode's :class:`~components.methods.rubricem.stagewise_judge.JudgeResult` is left in ``info["stagewise"]`` for the
    reflection judge."""

    def __init__(self, judge: StagewiseJudge):
        self.judge = judge

    async def __call__(self, episodes: list[Episode], ctx: StepContext) -> RewardOutput:
        members: dict[int, list[int]] = {}
        for i, e in enumerate(episodes):
            members.setdefault(e.group, []).append(i)
        groups = [(episodes[idx[0]].prompt, [episodes[i].info["trajectory"] for i in idx]) for idx in members.values()]
        results, metrics = await self.judge.judge_groups(groups, step=ctx.step)
        scores: list = [None] * len(episodes)
        for idx, group in zip(members.values(), results):
            for i, result in zip(idx, group):
                episodes[i].info["stagewise"] = result
                scores[i] = result.scores if any(s is not None for s in result.scores) else None
        return RewardOutput(scores, metrics)
