"""ARCO's step-level credit: the decomposition constraint that trains mu's score head without step labels (a
trajectory's step rewards should sum to its terminal reward: :func:`decomposition_loss`, weighted by
:func:`class_balanced_weights` as the released code does; the ablation :func:`per_step_outcome_loss`), the dense
step advantages the policy receives (reward-to-go minus a baseline: :func:`position_bucket_advantages`, the released
code's, or :func:`step_advantages`; a step without a readable reward has no reward-to-go, nor has any step before
it: a missing value is never a 0), and the diagnostics that say whether the credit is step-level at all
(:func:`oracle_step_quality`, :func:`step_diagnostics`, :func:`criteria_diversity`).

    loss = decomposition_loss([r_traj0, r_traj1], outcomes, weights=class_balanced_weights(outcomes))
    adv = position_bucket_advantages(rewards, [3, 2], [step_buckets(s) for s in steps], scale=0.5)  # [n, K]
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch

from components.evaluation.metrics import exact_match, f1_score
from components.methods.arco.criteria import ArcoStep
from components.schemas import Question, Trajectory
from components.world.oracle import OracleError, gold_next_query, gold_search_queries, hop_titles

__all__ = [
    "LOSSES",
    "class_balanced_weights",
    "criteria_diversity",
    "decomposition_loss",
    "oracle_step_quality",
    "per_step_outcome_loss",
    "position_bucket_advantages",
    "reward_to_go",
    "step_advantages",
    "step_buckets",
    "step_diagnostics",
    "terminal_reward",
]


def terminal_reward(trajectory: Trajectory, question: Question, metric: str = "f1") -> float:
    """EM or token F1 of the final answer (0 without one): the value a trajectory's step rewards sum to."""
    fn = f1_score if metric == "f1" else exact_match
    return float(fn(trajectory.final_answer, question.answers))


def class_balanced_weights(outcomes: Sequence[float] | torch.Tensor, threshold: float = 0.5) -> torch.Tensor:
    """The released code's minority-class weights of a batch of trajectories: ``n / (2 n_pos)`` for a terminal
    reward above ``threshold``, ``n / (2 n_neg)`` for the others (each count at least 1), so both classes weigh
    ``n / 2`` in all."""
    outcomes = torch.as_tensor(outcomes, dtype=torch.float32)
    positive = outcomes > threshold
    n, n_pos = len(outcomes), int(positive.sum())
    return torch.where(positive, n / (2.0 * max(n_pos, 1)), n / (2.0 * max(n - n_pos, 1)))


def _checked(step_rewards: Sequence[torch.Tensor], outcomes: torch.Tensor, weights: torch.Tensor | None) -> None:
    if len(step_rewards) != len(outcomes):
        raise ValueError(f"{len(step_rewards)} trajectories but {len(outcomes)} outcomes")
    if weights is not None and len(weights) != len(outcomes):
        raise ValueError(f"{len(weights)} weights for {len(outcomes)} trajectories")


def decomposition_loss(step_rewards: Sequence[torch.Tensor], outcomes: torch.Tensor,
                       denominator: float | None = None, weights: torch.Tensor | None = None) -> torch.Tensor:
    """``sum_i w_i (sum_t r_it - R_i)^2 / denominator`` (default: the number of trajectories, so micro-batches add up
    to the batch mean; weights 1), with ``R_i`` the trajectory's terminal reward (EM or F1 of its answer)."""
    _checked(step_rewards, outcomes, weights)
    sums = torch.stack([r.sum() for r in step_rewards])
    per = (sums - outcomes.to(sums)) ** 2
    per = per if weights is None else per * weights.to(per)
    return per.sum() / (denominator or len(step_rewards))


def per_step_outcome_loss(step_rewards: Sequence[torch.Tensor], outcomes: torch.Tensor,
                          denominator: float | None = None, weights: torch.Tensor | None = None) -> torch.Tensor:
    """The ablation: ``sum_i w_i mean_t (r_it - R_i)^2 / denominator``; every step regressed to the outcome."""
    _checked(step_rewards, outcomes, weights)
    per = torch.stack([((r - outcomes[i].to(r)) ** 2).mean() for i, r in enumerate(step_rewards)])
    per = per if weights is None else per * weights.to(per)
    return per.sum() / (denominator or len(step_rewards))


LOSSES = {"decomposition": decomposition_loss, "per_step_outcome": per_step_outcome_loss}


def reward_to_go(rewards: torch.Tensor, lengths: Sequence[int], gamma: float = 1.0) -> torch.Tensor:
    """``[n, K]`` reward-to-go over each trajectory's first ``lengths[i]`` steps; NaN beyond them, at a missing
    reward and at every step before one."""
    rewards = torch.as_tensor(rewards, dtype=torch.float32)
    out = torch.full_like(rewards, math.nan)
    for i, length in enumerate(lengths):
        if length > rewards.shape[1]:
            raise ValueError(f"trajectory {i} has {length} steps but the reward matrix only {rewards.shape[1]}")
        acc = 0.0
        for t in range(length - 1, -1, -1):
            acc = rewards[i, t] + gamma * acc  # NaN propagates to every earlier step
            out[i, t] = acc
    return out


def step_buckets(steps: Sequence[ArcoStep]) -> list[str]:
    """The released code's bucket of each step: ``search_k`` for a trajectory's k-th search (a step with a tool
    call), ``terminal`` for the answering step, the last step and a step with neither."""
    out, searches = [], 0
    for i, step in enumerate(steps):
        if i == len(steps) - 1 or step.finish or step.query is None:
            out.append("terminal")
        else:
            searches += 1
            out.append(f"search_{searches}")
    return out


def position_bucket_advantages(rewards: torch.Tensor, lengths: Sequence[int], buckets: Sequence[Sequence[str]], *,
                               gamma: float = 1.0, scale: float = 1.0, normalize_std: bool = False,
                               eps: float = 1e-6) -> torch.Tensor:
    """Reward-to-go ``G_it = sum_{t' >= t} gamma^(t'-t) r_it'`` minus the batch-wide mean of its bucket
    (:func:`step_buckets`: ``search_k`` for the k-th search, ``terminal`` for the answering, last or unreadable step;
    ``buckets[i][t]`` for step ``t`` of trajectory
    ``i``; a bucket of one value: the batch mean), over the batch's std when ``normalize_std``, times ``scale``;
    ``[n, K]``, NaN where there is no reward-to-go."""
    g = reward_to_go(rewards, lengths, gamma)
    out = torch.full_like(g, math.nan)
    cells = [(i, t, buckets[i][t]) for i, n in enumerate(lengths) for t in range(n) if not math.isnan(g[i, t])]
    if not cells:
        return out
    values = torch.stack([g[i, t] for i, t, _ in cells])
    overall = values.mean()
    sums: dict[str, torch.Tensor] = {}
    counts: dict[str, int] = {}
    for (_, _, label), v in zip(cells, values):
        sums[label] = sums.get(label, 0.0) + v
        counts[label] = counts.get(label, 0) + 1
    for i, t, label in cells:
        out[i, t] = g[i, t] - (overall if counts[label] == 1 else sums[label] / counts[label])
    if normalize_std:
        std = values.std(unbiased=False)
        out = out / ((std if std > 0 else torch.ones_like(std)) + eps)
    return out * scale


def step_advantages(rewards: torch.Tensor, lengths: Sequence[int], groups: Sequence[int], *, gamma: float = 1.0,
                    normalize_std: bool = True, eps: float = 1e-6, scale: float = 1.0) -> torch.Tensor:
    """Reward-to-go minus a per-step-index group baseline, times ``scale``; ``[n, K]``, NaN where there is no
    reward-to-go. The baseline ``b_gt`` is the mean of ``G_jt`` over the group's trajectories that have step ``t``
    when at least two do, else the mean of every ``G`` of the group; ``normalize_std`` divides by the group's std of
    ``G``. A group with a single reward-to-go value gets 0 there."""
    g = reward_to_go(rewards, lengths, gamma)
    out = torch.full_like(g, math.nan)
    groups_t = torch.as_tensor(list(groups), dtype=torch.long)
    for grp in torch.unique(groups_t):
        rows = groups_t == grp
        block = g[rows]
        valid = ~torch.isnan(block)
        if int(valid.sum()) < 2:
            out[rows] = torch.where(valid, torch.zeros_like(block), block)
            continue
        pooled = block[valid].mean()
        count = valid.sum(dim=0)
        col_mean = torch.where(valid, block, torch.zeros_like(block)).sum(dim=0) / count.clamp(min=1)
        baseline = torch.where(count >= 2, col_mean, pooled)
        centred = block - baseline
        if normalize_std:
            std = block[valid].std(unbiased=False)
            centred = centred / ((std if std > 0 else torch.ones_like(std)) + eps)
        out[rows] = torch.where(valid, centred, block)
    return out * scale


# ------------------------------------------------------------------------------------------ diagnostics


def oracle_step_quality(question: Question, steps: Sequence[ArcoStep]) -> list[float] | None:
    """1.0 for a step that retrieves the next gold paragraph (or answers once every gold paragraph was
    retrieved), else 0.0; None for a question without a world gold chain. A paragraph counts as retrieved
    when its gold doc id was among a tool's results (or, without doc ids, when the query was its title)."""
    try:
        titles = gold_search_queries(question)
        doc_of = {title: hop.doc_id for title, hop in zip(hop_titles(question), question.gold_chain)}
    except OracleError:
        return None
    if not titles:
        return None
    found: list[str] = []
    quality = []
    for step in steps:
        target = gold_next_query(question, found)
        if step.finish:
            quality.append(float(target is None))
            continue
        hit = [t for t in titles if t not in found and (
            doc_of.get(t) in step.doc_ids if doc_of.get(t) else (step.query or "").strip().casefold() == t.casefold())]
        quality.append(float(target is not None and target in hit))
        found.extend(hit)
    return quality


def _pearson(x: Sequence[float], y: Sequence[float]) -> float | None:
    if len(x) < 2 or np.std(x) == 0 or np.std(y) == 0:
        return None
    return float(np.corrcoef(x, y)[0, 1])


def step_diagnostics(step_rewards: Sequence[Sequence[float | None]], outcomes: Sequence[float],
                     qualities: Sequence[Sequence[float] | None]) -> dict[str, float]:
    """Per-step statistics of one training step's trajectories; a statistic that cannot be computed (no
    trajectory with two scored steps, constant values) is left out rather than reported as 0.

    ``var_within``: mean over trajectories with >= 2 scored steps of the population variance of their step
    rewards (0 means uniform credit); ``oracle_corr``: Pearson r of step reward and oracle quality over every
    scored step; ``oracle_corr_within``: the same after subtracting each trajectory's mean of both (credit
    between the steps of one trajectory); ``decomp_gap``: mean |sum of step rewards - terminal reward| over
    fully scored trajectories."""
    out: dict[str, float] = {}
    scored = [[r for r in rs if r is not None] for rs in step_rewards]
    flat = [r for rs in scored for r in rs]
    if flat:
        out["step_reward_mean"] = float(np.mean(flat))
    multi = [rs for rs in scored if len(rs) >= 2]
    if multi:
        out["var_within"] = float(np.mean([np.var(rs) for rs in multi]))
    full = [(sum(rs), o) for rs, raw, o in zip(scored, step_rewards, outcomes) if rs and len(rs) == len(raw)]
    if full:
        out["decomp_gap"] = float(np.mean([abs(s - o) for s, o in full]))
    xs, ys, xw, yw = [], [], [], []
    for rs, qs in zip(step_rewards, qualities):
        if qs is None:
            continue
        pairs = [(r, q) for r, q in zip(rs, qs) if r is not None]
        xs += [r for r, _ in pairs]
        ys += [q for _, q in pairs]
        if len(pairs) >= 2:
            mr, mq = np.mean([r for r, _ in pairs]), np.mean([q for _, q in pairs])
            xw += [r - mr for r, _ in pairs]
            yw += [q - mq for _, q in pairs]
    for key, value in (("oracle_corr", _pearson(xs, ys)), ("oracle_corr_within", _pearson(xw, yw))):
        if value is not None:
            out[key] = value
    if ys:
        out["oracle_good_fraction"] = float(np.mean(ys))
    return out


def criteria_diversity(criteria: Sequence[Sequence[str]]) -> dict[str, float]:
    """Over steps with >= 2 criteria: ``criteria_distinct`` (distinct criteria after lowercasing and collapsing
    spaces, over K) and ``criteria_spread`` (1 - mean pairwise Jaccard similarity of their word sets)."""
    distinct, spread = [], []
    for cs in criteria:
        if len(cs) < 2:
            continue
        norm = [" ".join(c.lower().split()) for c in cs]
        distinct.append(len(set(norm)) / len(norm))
        words = [set(n.split()) for n in norm]
        sims = [len(a & b) / len(a | b) if a | b else 1.0 for i, a in enumerate(words) for b in words[i + 1:]]
        spread.append(1.0 - float(np.mean(sims)))
    if not distinct:
        return {}
    return {"criteria_distinct": float(np.mean(distinct)), "criteria_spread": float(np.mean(spread))}
