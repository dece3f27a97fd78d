"""A warning sign of reward hacking: the judge's reward rising over training while the policy's dev accuracy
(exact match, token F1) falls. A judge that the policy learned to please (a verdict slipped into an answer, a
rubric copied back, a format the judge likes) gives that picture; an honest improvement raises both.

:func:`gaming_check` is a pure function of a run's metric history: rows in step order, each with the keys it has
(the trainer's ``reward/mean`` every step; ``em`` / ``f1`` wherever the dev set was evaluated, at least before
the first update and after the last). It returns metrics to log with the run and says whether to warn.

    check = gaming_check(rows)                      # rows: [{"step": 0, "em": 0.31, "f1": 0.42}, {"step": 1,
    metrics.update(check.metrics)                   #   "reward/mean": 0.40}, ..., {"step": 50, "em": 0.27, ...}]
    if check.suspected:
        log.warning(check.message)

The reward's trend is the mean of its last ``window`` values minus the mean of its first ``window`` (a third of
the steps by default, so one noisy step decides nothing); the dev changes are last minus first evaluation. Where
the rows also carry the outcome reward of the same episodes (``reward/outcome``, the exact answer check), the trend
that counts is the reward's part beyond it (reward minus outcome): a judge can be gamed only through what it adds,
and an outcome-only run (its reward is the outcome) is never suspected of pleasing a judge it does not have. The
run is suspected when that trend rose by more than ``min_rise`` while EM or F1 fell by more than ``min_drop``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

__all__ = ["GamingCheck", "gaming_check"]


@dataclass(frozen=True)
class GamingCheck:
    """The check's verdict and its numbers (``metrics``: ``gaming.reward_trend``, ``gaming.beyond_outcome_trend``,
    ``gaming.dev_em_change``, ``gaming.dev_f1_change``, ``gaming.suspected``; a change that cannot be measured is
    NaN)."""

    suspected: bool
    metrics: dict[str, float] = field(default_factory=dict)
    message: str = ""


def _number(row: Mapping[str, float], key: str) -> float | None:
    """The row's value of ``key``; None when absent, None or NaN (a row that did not measure it)."""
    value = row.get(key)
    return None if value is None or math.isnan(float(value)) else float(value)


def _values(rows: Sequence[Mapping[str, float]], key: str) -> list[float]:
    return [v for v in (_number(r, key) for r in rows) if v is not None]


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values)


def _trend(values: Sequence[float], window: int | None) -> float:
    if len(values) < 2:
        return math.nan
    w = window or max(1, len(values) // 3)
    w = min(w, len(values) // 2) or 1
    return _mean(values[-w:]) - _mean(values[:w])


def gaming_check(rows: Sequence[Mapping[str, float]], *, reward_key: str = "reward/mean",
                 outcome_key: str = "reward/outcome", dev_keys: Sequence[str] = ("em", "f1"),
                 window: int | None = None, min_rise: float = 0.05, min_drop: float = 0.02) -> GamingCheck:
    """Whether the judge's reward (beyond the outcome, where ``outcome_key`` is logged with every reward) rose while
    dev accuracy fell over ``rows`` (see the module doc)."""
    rewards = _values(rows, reward_key)
    trend = _trend(rewards, window)
    pairs = [(_number(r, reward_key), _number(r, outcome_key)) for r in rows]
    beyond = [reward - outcome for reward, outcome in pairs if reward is not None and outcome is not None]
    beyond_trend = _trend(beyond, window) if len(beyond) == len(rewards) else math.nan
    judged = trend if math.isnan(beyond_trend) else beyond_trend
    changes = {}
    for key in dev_keys:
        dev = _values(rows, key)
        changes[key] = dev[-1] - dev[0] if len(dev) >= 2 else math.nan
    fell = [k for k, c in changes.items() if c < -min_drop]
    suspected = judged > min_rise and bool(fell)
    metrics = {"gaming.reward_trend": trend, "gaming.beyond_outcome_trend": beyond_trend,
               **{f"gaming.dev_{k}_change": c for k, c in changes.items()}, "gaming.suspected": float(suspected)}
    message = ""
    if suspected:
        falls = ", ".join(f"dev {k} {changes[k]:+.3f}" for k in fell)
        what = reward_key if math.isnan(beyond_trend) else f"{reward_key} beyond {outcome_key}"
        message = (f"possible reward hacking: the judge's {what} rose {judged:+.3f} over training while {falls}; "
                   "read the judged trajectories before trusting this run")
    return GamingCheck(suspected, metrics, message)
