"""Agreement between a judge and the oracle, from a table of verdicts: pairwise rows (:func:`pairwise_summary`:
accuracy, flat rate, AUC, position and attempt effects), slate rows (:func:`slate_summary`: Co-ReAct's council and
evaluator, ARBOR's RaR rating; pairwise accuracy and AUC within a view, Kendall's tau-b and Spearman's rho against
the oracle's keys, position and attempt effects) and answer rows (:func:`answer_summary`), each with its failure
rate. Intervals are 95% percentile bootstrap intervals (``scipy.stats.bootstrap``, a fixed seed) over the rows the
point estimate is taken over (for AUC, rows resampled with their labels).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from scipy import stats

from components.evaluation import intervals

CONFIDENCE = 0.95
RESAMPLES = 2000


def bootstrap_interval(values: Sequence[float], statistic: Callable[[np.ndarray], float] = np.mean,
                       seed: int = 0, n_resamples: int = RESAMPLES) -> tuple[float, float] | None:
    """The 95% percentile bootstrap interval of ``statistic`` over ``values`` (None for fewer than 2 values);
    a constant sample gives its value at both ends."""
    return intervals.bootstrap_interval(values, statistic, confidence=CONFIDENCE, n_resamples=n_resamples, seed=seed)


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
    """Accuracy (with interval), flat rate, AUC, position effect and failure rate of pairwise rows.

    A row is one judgment of one pair in one order: ``pair``, ``order`` (``"AB"``: the pair's first trajectory
    shown as A; ``"BA"``), ``preferred`` (the oracle's choice in the shown positions, or None), ``winner`` (``"A"``,
    ``"B"``, ``"TIE"``, None when the judgment failed) and ``expected`` (the verdict's worth to the trajectory shown
    as A). Accuracy and the flat rate (``TIE``) are over judged rows where the oracle prefers one; AUC takes
    ``expected`` as the score of "A is preferred" (ties half); the position effect is the share of pairs judged in
    both orders whose verdicts name the same position (always-A: 1.0), the attempt effect the share naming the
    same trajectory; the failure rate is over all rows."""
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
    tracks = [float({w["AB"], w["BA"]} == {"A", "B"}) for w in both]
    out["position_effect"] = float(np.mean(follows)) if follows else None
    out["attempt_effect"] = float(np.mean(tracks)) if tracks else None
    out["position_effect_n"] = len(follows)
    ties = [r for r in judged if r["preferred"] is None]
    out["no_preference_rows"] = len(ties)
    out["tie_when_oracle_ties"] = (sum(r["winner"] == "TIE" for r in ties) / len(ties)) if ties else None
    return out


def answer_summary(rows: Sequence[dict[str, Any]], seed: int = 0) -> dict[str, Any]:
    """Accuracy (with interval), AUC and failure rate of answer-judge rows. A row has ``label`` (the answer is
    right) and ``verdict`` (True / False, a probability of correct, or None when failed): accuracy reads a
    probability as correct at 0.5 or more, AUC uses it as it is."""
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


def oracle_key(labels: dict[str, Any]) -> float:
    """The oracle's order of one question's trajectories as a number: more hops found first, then a correct
    answer (the order of :func:`components.judges.bench.trajectories.preference`)."""
    return 2.0 * labels["hops_found"] + float(labels["em"])


def _views(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows of each (slate, view) merged: scores, oracle keys and positions by variant."""
    views: dict[tuple, dict[str, Any]] = {}
    for r in rows:
        v = views.setdefault((r["slate"], r.get("view", 0)), {"slate": r["slate"], "scores": {}, "oracle": {},
                                                             "positions": {}})
        v["scores"].update(r["scores"])
        v["oracle"].update(r["oracle"])
        v["positions"].update(r.get("positions") or {})
    return list(views.values())


def _rank_corr(scores: dict[str, float], oracle: dict[str, float]) -> tuple[float, float] | None:
    """(Kendall tau-b, Spearman rho) of one view, None when it has under 3 scored trajectories or the oracle
    ties them all; a judge that scores all alike gets 0."""
    names = [n for n, s in scores.items() if s is not None]
    if len(names) < 3 or len({oracle[n] for n in names}) < 2:
        return None
    x, y = [scores[n] for n in names], [oracle[n] for n in names]
    if len(set(x)) < 2:
        return 0.0, 0.0
    return float(stats.kendalltau(x, y).statistic), float(stats.spearmanr(x, y).statistic)


def _spread(views: Sequence[dict[str, Any]], by: str) -> float | None:
    """Mean over slates of the spread of the mean score by ``by`` ("positions" or "variant"), over the slate's
    score range; None without positions."""
    per_slate: dict[str, list[dict[str, Any]]] = {}
    for v in views:
        if v["positions"]:
            per_slate.setdefault(v["slate"], []).append(v)
    spreads = []
    for vs in per_slate.values():
        groups: dict[Any, list[float]] = {}
        values = []
        for v in vs:
            for name, score in v["scores"].items():
                if score is None:
                    continue
                key = v["positions"][name] if by == "positions" else name
                groups.setdefault(key, []).append(score)
                values.append(score)
        if len(groups) < 2:
            continue
        span = max(values) - min(values)
        means = [float(np.mean(g)) for g in groups.values()]
        spreads.append((max(means) - min(means)) / span if span > 0 else 0.0)
    return float(np.mean(spreads)) if spreads else None


def slate_pairs(rows: Sequence[dict[str, Any]], variant: str | None = None) -> list[float]:
    """1 / 0.5 / 0 for each pair of one view that the oracle orders: the judge orders it the same way / scores
    it equal / the other way; with ``variant``, only the pairs of ``gold`` against that variant."""
    out = []
    for v in _views(rows):
        names = sorted(n for n, s in v["scores"].items() if s is not None)
        for i, a in enumerate(names):
            for b in names[i + 1:]:
                if variant is not None and {a, b} != {"gold", variant}:
                    continue
                oa, ob = v["oracle"][a], v["oracle"][b]
                if oa == ob:
                    continue
                sa, sb = v["scores"][a], v["scores"][b]
                out.append(0.5 if sa == sb else float((sa > sb) == (oa > ob)))
    return out


def slate_summary(rows: Sequence[dict[str, Any]], seed: int = 0) -> dict[str, Any]:
    """Accuracy, AUC, flat rate, rank correlations, position and attempt effects and failure rate of slate rows.

    A row is one judgment over one question's trajectories: ``slate``, ``view`` (a shown order for the council, 0
    for a judge that sees one at a time), ``scores`` (variant -> score, None when failed), ``oracle`` (variant ->
    :func:`oracle_key`) and, shown several at once, ``positions``. Accuracy, flat rate and AUC (concordant 1,
    equal 0.5, discordant 0) are over the pairs of one view that the oracle orders; tau-b and rho are per view (a
    judge that scores all alike counts 0), averaged, the interval over views; the position and attempt effects
    are, per slate, the spread of the mean score by shown position and by trajectory over the slate's score
    range, averaged over slates."""
    failed = [r for r in rows if any(s is None for s in r["scores"].values())]
    out: dict[str, Any] = {"rows": len(rows), "failure_rate": len(failed) / len(rows) if rows else None}
    pairs = slate_pairs(rows)
    out.update(_with_interval("accuracy", [float(p == 1.0) for p in pairs], seed))
    out["auc"] = float(np.mean(pairs)) if pairs else None
    out["auc_ci"] = bootstrap_interval(pairs, seed=seed)
    out["flat_rate"] = (sum(p == 0.5 for p in pairs) / len(pairs)) if pairs else None
    views = _views(rows)
    corr = [c for c in (_rank_corr(v["scores"], v["oracle"]) for v in views) if c is not None]
    taus = [c[0] for c in corr]
    out.update(kendall=float(np.mean(taus)) if taus else None, kendall_ci=bootstrap_interval(taus, seed=seed),
               kendall_n=len(taus), spearman=float(np.mean([c[1] for c in corr])) if corr else None)
    out["position_effect"] = _spread(views, "positions")
    out["attempt_effect"] = _spread(views, "variant") if out["position_effect"] is not None else None
    return out


def slate_per_variant(rows: Sequence[dict[str, Any]]) -> dict[str, str]:
    """Per perturbation: how often the judge puts gold above it (ties half), over the views."""
    variants = sorted({n for r in rows for n in r["scores"] if n != "gold"})
    out = {}
    for v in variants:
        pairs = slate_pairs(rows, v)
        flat = sum(p == 0.5 for p in pairs)
        out[v] = (f"gold above {np.mean(pairs):.2f}, equal {flat / len(pairs):.2f} (n={len(pairs)})" if pairs
                  else "no oracle preference")
    return out


def pairwise_per_variant(rows: Sequence[dict[str, Any]]) -> dict[str, str]:
    """Per perturbation: accuracy over both orders and the TIE share."""
    out = {}
    for v in dict.fromkeys(r["variant"] for r in rows):
        judged = [r for r in rows if r["variant"] == v and r["winner"] is not None]
        decided = [r for r in judged if r["preferred"] is not None]
        ties = sum(r["winner"] == "TIE" for r in judged)
        acc = f"acc {sum(r['winner'] == r['preferred'] for r in decided) / len(decided):.2f}, " if decided \
            else "no oracle preference, "
        out[v] = f"{acc}TIE {ties / len(judged):.2f} (n={len(judged)})" if judged else "-"
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
