"""ARCO's credit probe: several rubric models mu score the *same* fixed trajectories, so their step-level credit
can be compared without the confound of each run's own on-policy samples (ARCO's claim under test: the
decomposition constraint and co-evolution give step rewards that track step quality).

For each mu (e.g. the warmed-up one of ``arco_frozen`` and the co-evolved one of ``arco``), every step of every
trajectory gets mu's criteria and step reward (:meth:`ArcoState.score_episodes`, the training-time path), and
the step rewards are compared with the embedded world's oracle step quality (1 for a step that retrieves the
next gold paragraph, or answers once all are retrieved). Reported per mu: ``oracle_corr`` (Pearson r over all
scored steps) with a bootstrap 95% interval over trajectories, ``oracle_corr_within`` (after removing each
trajectory's means: credit *between* a trajectory's steps), ``var_within`` (is credit non-uniform?),
``decomp_gap`` (|sum of step rewards - terminal reward|), and criteria diversity.

    metrics = probe(state, trajectories, questions, seed=0)     # state: a loaded ArcoState
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from components.methods.arco.decomposition import oracle_step_quality, step_diagnostics
from components.schemas import Question, Trajectory
from components.training.grpo.episodes import Episode

__all__ = ["distinct_trajectories", "probe"]


def distinct_trajectories(trajectories: Sequence[Trajectory]) -> list[Trajectory]:
    """The trajectories without repeats (same question, same actions, same answer), in first-seen order."""
    seen, out = set(), []
    for t in trajectories:
        key = (t.question_id, tuple(s.action for s in t.steps), t.final_answer)
        if key not in seen:
            seen.add(key)
            out.append(t)
    return out


def _corr_interval(rewards: list[list[float | None]], qualities: list[list[float] | None], seed: int,
                   resamples: int) -> tuple[float, float] | None:
    """Percentile bootstrap 95% interval of oracle_corr, resampling whole trajectories (their steps are not
    independent). Resamples whose correlation is undefined (constant rewards or qualities) are left out, which
    scipy.stats.bootstrap cannot do; None when fewer than half of them are defined."""
    usable = [i for i, q in enumerate(qualities) if q is not None and any(r is not None for r in rewards[i])]
    if len(usable) < 3:
        return None
    rng = np.random.default_rng(seed)
    values = []
    for _ in range(resamples):
        pick = [usable[int(i)] for i in rng.integers(0, len(usable), len(usable))]
        value = step_diagnostics([rewards[i] for i in pick], [0.0] * len(pick), [qualities[i] for i in pick])
        if "oracle_corr" in value:
            values.append(value["oracle_corr"])
    if len(values) < resamples / 2:
        return None
    low, high = np.percentile(values, [2.5, 97.5])
    return float(low), float(high)


def probe(state: Any, trajectories: Sequence[Trajectory], questions: Mapping[str, Question], *, seed: int = 0,
          resamples: int = 1000) -> dict[str, float]:
    """mu's step credit on fixed ``trajectories`` (of questions with gold chains); ``state`` is a loaded ArcoState.
    mu samples its criteria under ``seed``, so two mus are probed under the same random stream."""
    episodes = [Episode(prompt=questions[t.question_id], group=i, rows=[], info={"trajectory": t})
                for i, t in enumerate(trajectories) if t.question_id in questions]
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        metrics = {k.removeprefix("arco/"): v for k, v in state.score_episodes(episodes).items()}
    rewards = [list(e.info["arco"].rewards) for e in episodes]
    qualities = [oracle_step_quality(e.prompt, e.info["arco"].steps) for e in episodes]
    interval = _corr_interval(rewards, qualities, seed, resamples)
    if interval is not None:
        metrics["oracle_corr_ci_low"], metrics["oracle_corr_ci_high"] = interval
    metrics["trajectories"] = float(len(episodes))
    return metrics
