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
the steps by default, so one noisy step decides nothing); the dev changes are last minus first evaluation. The
run is suspected when the reward rose by more than ``min_rise`` while EM or F1 fell by more than ``min_drop``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

__all__ = ["GamingCheck", "gaming_check"]


@dataclass(frozen=True)
class GamingCheck:
    """The check's verdict and its numbers (``metrics``: ``gaming.reward_trend``, ``gaming.dev_em_change``,
    ``gaming.dev_f1_change``, ``gaming.suspected``; a change that cannot be measured is NaN)."""

    suspected: bool
    metrics: dict[str, float] = field(default_factory=dict)
    message: str = ""


def _values(rows: Sequence[Mapping[str, float]], key: str) -> list[float]:
    return [float(r[key]) for r in rows if key in r and r[key] is not None and not math.isnan(float(r[key]))]


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values)


def gaming_check(rows: Sequence[Mapping[str, float]], *, reward_key: str = "reward/mean",
                 dev_keys: Sequence[str] = ("em", "f1"), window: int | None = None, min_rise: float = 0.05,
                 min_drop: float = 0.02) -> GamingCheck:
    """Whether the judge's reward rose while dev accuracy fell over ``rows`` (see the module doc)."""
    rewards = _values(rows, reward_key)
    trend = math.nan
    if len(rewards) >= 2:
        w = window or max(1, len(rewards) // 3)
        w = min(w, len(rewards) // 2) or 1
        trend = _mean(rewards[-w:]) - _mean(rewards[:w])
    changes = {}
    for key in dev_keys:
        dev = _values(rows, key)
        changes[key] = dev[-1] - dev[0] if len(dev) >= 2 else math.nan
    fell = [k for k, c in changes.items() if c < -min_drop]
    suspected = trend > min_rise and bool(fell)
    metrics = {"gaming.reward_trend": trend, **{f"gaming.dev_{k}_change": c for k, c in changes.items()},
               "gaming.suspected": float(suspected)}
    message = ""
    if suspected:
        falls = ", ".join(f"dev {k} {changes[k]:+.3f}" for k in fell)
        message = (f"possible reward hacking: the judge's {reward_key} rose {trend:+.3f} over training while {falls}; "
                   "read the judged trajectories before trusting this run")
    return GamingCheck(suspected, metrics, message)
