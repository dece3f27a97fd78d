"""Agreement between a judge and the oracle, from a table of verdicts.

A pairwise row is one judgment of one pair in one order: ``pair`` (the pair's id), ``order`` (``"AB"``: the
pair's first trajectory shown as A; ``"BA"``: swapped), ``preferred`` (the oracle's choice in the shown
positions, ``"A"``, ``"B"`` or None when the oracle has none), ``winner`` (the judge's label, ``"A"``, ``"B"``,
``"TIE"``, or None when the judgment failed) and ``expected`` (what the verdict is worth to the trajectory shown
as A: 1 / 0 / 0.5 from the text, or the probability-weighted value).

- accuracy: among judged rows where the oracle prefers one, the share whose winner is the preferred one;
- flat rate: among those rows, the share judged ``TIE``;
- AUC: ``expected`` as a score for "A is the preferred one" over those rows (ties count half);
- position effect: among pairs judged in both orders, the share whose two verdicts name the same position
  (A then A, or B then B), i.e. follow the position rather than the trajectory; a judge that always says A
  scores 1.0, a judge that tracks the trajectories 0.0;
- failure rate: failed rows over all rows.

An answer row has ``label`` (the answer is right) and ``verdict`` (True / False, a probability of correct, or
None when the judgment failed): accuracy reads a probability as correct at 0.5 or more, AUC uses it as it is.

Intervals are 95% percentile bootstrap intervals (``scipy.stats.bootstrap``, a fixed seed) over the rows the
point estimate is taken over (for AUC, resampling rows together with their labels).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from scipy import stats

CONFIDENCE = 0.95
RESAMPLES = 2000


def bootstrap_interval(values: Sequence[float], statistic: Callable[[np.ndarray], float] = np.mean,
                       seed: int = 0, n_resamples: int = RESAMPLES) -> tuple[float, float] | None:
    """The 95% percentile bootstrap interval of ``statistic`` over ``values`` (None for fewer than 2 values);
    a constant sample gives its value at both ends."""
    data = np.asarray(values, dtype=float)
    if len(data) < 2:
        return None
    if np.all(data == data[0]):
        value = float(statistic(data))
        return value, value
    res = stats.bootstrap((data,), statistic, confidence_level=CONFIDENCE, n_resamples=n_resamples,
                          method="percentile", vectorized=False, random_state=np.random.default_rng(seed))
    low, high = float(res.confidence_interval.low), float(res.confidence_interval.high)
    return (None if np.isnan(low) or np.isnan(high) else (low, high))


def auc(scores: Sequence[float], labels: Sequence[bool]) -> float:
    """The probability that a positive outscores a negative (ties count half); NaN without both classes."""
    s, y = np.asarray(scores, dtype=float), np.asarray(labels, dtype=bool)
    pos, neg = s[y], s[~y]
    if not len(pos) or not len(neg):
        return float("nan")
    diff = pos[:, None] - neg[None, :]
    return float(((diff > 0).sum() + 0.5 * (diff == 0).sum()) / diff.size)


def auc_interval(scores: Sequence[float], labels: Sequence[bool], seed: int = 0) -> tuple[float, float] | None:
    """Bootstrap interval of :func:`auc` over rows (a resample with one class only is left out)."""
    s, y = np.asarray(scores, dtype=float), np.asarray(labels, dtype=bool)
    if len(s) < 2 or y.all() or not y.any():
        return None
    rng = np.random.default_rng(seed)
    draws = []
    for _ in range(RESAMPLES):
        idx = rng.integers(0, len(s), len(s))
        if y[idx].any() and not y[idx].all():
            draws.append(auc(s[idx], y[idx]))
    if not draws:
        return None
    tail = (1 - CONFIDENCE) / 2 * 100
    return float(np.percentile(draws, tail)), float(np.percentile(draws, 100 - tail))


def _with_interval(name: str, values: Sequence[float], seed: int) -> dict[str, Any]:
    return {name: float(np.mean(values)) if len(values) else None,
            f"{name}_ci": bootstrap_interval(values, seed=seed), f"{name}_n": len(values)}


def pairwise_summary(rows: Sequence[dict[str, Any]], seed: int = 0) -> dict[str, Any]:
    """Accuracy (with interval), flat rate, AUC, position effect and failure rate of pairwise rows."""
    judged = [r for r in rows if r["winner"] is not None]
    decided = [r for r in judged if r["preferred"] is not None]
    out: dict[str, Any] = {"rows": len(rows), "failure_rate": (len(rows) - len(judged)) / len(rows) if rows else None}
    out.update(_with_interval("accuracy", [float(r["winner"] == r["preferred"]) for r in decided], seed))
    out["flat_rate"] = (sum(r["winner"] == "TIE" for r in decided) / len(decided)) if decided else None
    scores = [r["expected"] for r in decided]
    positives = [r["preferred"] == "A" for r in decided]
    value = auc(scores, positives) if decided else float("nan")
    out["auc"] = None if np.isnan(value) else value
    out["auc_ci"] = auc_interval(scores, positives, seed)
    by_pair: dict[Any, dict[str, str]] = {}
    for r in judged:
        by_pair.setdefault(r["pair"], {})[r["order"]] = r["winner"]
    both = [w for w in by_pair.values() if len(w) == 2]
    follows = [float(w["AB"] == w["BA"] and w["AB"] != "TIE") for w in both]
    out["position_effect"] = float(np.mean(follows)) if follows else None
    out["position_effect_n"] = len(follows)
    ties = [r for r in judged if r["preferred"] is None]
    out["no_preference_rows"] = len(ties)
    out["tie_when_oracle_ties"] = (sum(r["winner"] == "TIE" for r in ties) / len(ties)) if ties else None
    return out


def answer_summary(rows: Sequence[dict[str, Any]], seed: int = 0) -> dict[str, Any]:
    """Accuracy (with interval), AUC and failure rate of answer-judge rows."""
    judged = [r for r in rows if r["verdict"] is not None]
    out: dict[str, Any] = {"rows": len(rows), "failure_rate": (len(rows) - len(judged)) / len(rows) if rows else None}
    out.update(_with_interval("accuracy", [float((float(r["verdict"]) >= 0.5) == bool(r["label"])) for r in judged],
                              seed))
    scores, labels = [float(r["verdict"]) for r in judged], [bool(r["label"]) for r in judged]
    value = auc(scores, labels) if judged else float("nan")
    out["auc"] = None if np.isnan(value) else value
    out["auc_ci"] = auc_interval(scores, labels, seed)
    out["flat_rate"] = None
    out["position_effect"] = None
    return out


def cost_summary(rows: Sequence[dict[str, Any]]) -> dict[str, float | None]:
    """Calls, tokens and seconds per judgment (rows carry ``calls``, ``prompt_tokens``, ``completion_tokens``,
    ``seconds``, and ``asked_first`` when the judgment was asked before the same prompt in another mode:
    ``seconds_per_judgment_cold`` is over those)."""
    n = len(rows)
    cold = [r for r in rows if r.get("asked_first", True)]
    if not n:
        return {"calls_per_judgment": None, "tokens_per_judgment": None, "seconds_per_judgment": None,
                "seconds_per_judgment_cold": None}
    return {"calls_per_judgment": sum(r["calls"] for r in rows) / n,
            "prompt_tokens_per_judgment": sum(r["prompt_tokens"] for r in rows) / n,
            "completion_tokens_per_judgment": sum(r["completion_tokens"] for r in rows) / n,
            "tokens_per_judgment": sum(r["prompt_tokens"] + r["completion_tokens"] for r in rows) / n,
            "seconds_per_judgment": sum(r["seconds"] for r in rows) / n,
            "seconds_per_judgment_cold": (sum(r["seconds"] for r in cold) / len(cold)) if cold else None}
