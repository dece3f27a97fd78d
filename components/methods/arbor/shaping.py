"""ARBOR's reward shaping (paper 3.4, Eq. 3-4) for one query-group, and the reward-homogeneity report of the
paper's Table 2. Pure functions over plain lists; the judging that produces rubric scores is elsewhere.

For each rubric scored on the group (a list of per-trajectory scores in [0, 1], ``None`` where a trajectory
has no judged edge):

1. variance filter: a rubric whose within-group variance (population, over its scored trajectories) is
   below ``delta_v`` is dropped for this group;
2. composite s_i = mean over the kept rubrics that scored trajectory i (``None`` if none did);
3. centring over the group's scored trajectories: s~_i = s_i - mean_j s_j;
4. attenuation: s~_i < 0 becomes ``alpha * s~_i``;
5. R_total_i = R_base_i + lambda * s~_i; a format-invalid trajectory keeps R_base (its rubric term is 0,
   so the format penalty stands); a trajectory with no composite score gets no rubric term, i.e. R_base,
   which equals imputing the group's mean rubric score - never a rubric score of 0.

    shaped = shape_group(base=[0, 0, 0, 0], valid=[True] * 4, rubric_scores=[[1, .5, .5, 0]],
                         lam=0.1, alpha=0.25, delta_v=0.05)
    shaped.total      # [0.05, 0.0, 0.0, -0.0125]: an all-wrong group that now has variance
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

__all__ = ["ShapedGroup", "homogeneity_metrics", "outcome_pattern", "shape_group"]

PATTERNS = ("all_correct", "all_wrong", "mixed_uniform")


@dataclass
class ShapedGroup:
    total: list[float]
    composite: list[float | None]
    term: list[float | None]  # lambda * attenuated centred score; 0 for format-invalid; None: no rubric term
    kept: list[int] = field(default_factory=list)  # indices of the rubrics that passed the variance filter
    unscored: int = 0  # trajectories left without a rubric term while some rubric was kept


def _variance(values: Sequence[float | None]) -> float | None:
    xs = [v for v in values if v is not None]
    return float(np.var(xs)) if len(xs) >= 2 else None


def shape_group(base: Sequence[float], valid: Sequence[bool], rubric_scores: Sequence[Sequence[float | None]], *,
                lam: float, alpha: float, delta_v: float) -> ShapedGroup:
    n = len(base)
    if len(valid) != n or any(len(s) != n for s in rubric_scores):
        raise ValueError(f"shape_group: base has {n} trajectories, valid {len(valid)}, rubric score lists "
                         f"{[len(s) for s in rubric_scores]}")
    kept = [k for k, s in enumerate(rubric_scores) if (v := _variance(s)) is not None and v >= delta_v]
    if not kept:
        return ShapedGroup(list(map(float, base)), [None] * n, [None] * n)
    composite: list[float | None] = []
    for i in range(n):
        xs = [rubric_scores[k][i] for k in kept if rubric_scores[k][i] is not None]
        composite.append(sum(xs) / len(xs) if xs else None)
    scored = [c for c in composite if c is not None]
    mean = sum(scored) / len(scored)
    term: list[float | None] = []
    for c, ok in zip(composite, valid, strict=True):
        if c is None:
            term.append(None)
        elif not ok:
            term.append(0.0)
        else:
            centred = c - mean
            term.append(lam * (centred if centred >= 0 else alpha * centred))
    total = [float(b) + (t or 0.0) for b, t in zip(base, term, strict=True)]
    return ShapedGroup(total, composite, term, kept, sum(c is None for c in composite))


def outcome_pattern(f1: Sequence[float], valid: Sequence[bool]) -> str:
    """Table 2's outcome pattern of a group (``f1``: format-gated F1): all_correct (F1 1 and format-valid
    everywhere), all_wrong (F1 0 everywhere, format-invalid ones included), mixed_uniform (one shared partial
    F1), or mixed."""
    if all(valid) and all(x == 1.0 for x in f1):
        return "all_correct"
    if all(x == 0.0 for x in f1):
        return "all_wrong"
    return "mixed_uniform" if len(set(f1)) == 1 else "mixed"


def _flat(values: Sequence[float]) -> bool:
    return max(values) - min(values) <= 1e-9


def homogeneity_metrics(groups: Sequence[tuple[Sequence[float], Sequence[bool], Sequence[float], Sequence[float]]],
                        ) -> dict[str, float]:
    """Fractions of groups with zero reward variance under R_base and under R_total, by outcome pattern,
    and the rescued fraction (zero variance under R_base but not under R_total, over zero-variance groups).
    Each group is (format-gated F1, format-valid, R_base, R_total)."""
    n = len(groups)
    counts = {f"zero_var/{r}/{p}": 0 for r in ("base", "total") for p in (*PATTERNS, "all")}
    rescued = 0
    for f1, valid, base, total in groups:
        pattern = outcome_pattern(f1, valid)
        flat_base, flat_total = _flat(base), _flat(total)
        for reward, flat in (("base", flat_base), ("total", flat_total)):
            if flat:
                counts[f"zero_var/{reward}/all"] += 1
                if pattern in PATTERNS:
                    counts[f"zero_var/{reward}/{pattern}"] += 1
        rescued += flat_base and not flat_total
    out = {k: v / n for k, v in counts.items()} if n else {}
    out["groups"] = float(n)
    if counts["zero_var/base/all"]:
        out["zero_var/rescued_fraction"] = rescued / counts["zero_var/base/all"]
    return out
