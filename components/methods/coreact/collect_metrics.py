"""Summary statistics of collected branching points: kept/dropped by reason, judge validity per judge,
inter-judge agreement (mean pairwise Kendall tau), slate diversity, and position-bias counts.

Position bias: every judge sees its own random permutation, so a judge that prefers a label (say the
first, X) spreads that preference evenly over the real candidates. ``top_label.*`` is the judges' raw
label preference (far from uniform = a position-biased judge); ``winner_label.*`` is the label under
which each judge was shown the Borda winner, which stays close to uniform when the permutations control
the bias. Each comes with a chi-square p-value against the uniform distribution. With
``collect.judge_orders`` > 1 the label counts are per vote (order), the inter-judge tau compares each judge's
Borda scores over its orders, and ``mean_self_kendall_tau`` compares a judge's orders with each other.
"""

from __future__ import annotations

import itertools
from collections import Counter

from scipy.stats import chisquare

from components.methods.coreact.slates import PoolBM25, similarity_matrix
from components.methods.coreact.council import agreement
from components.retrieval.text import tokenize
from components.schemas import BranchingPoint


def slate_diversity(actions: list[str]) -> float:
    """Mean pairwise (1 - BM25 similarity) over a slate: 0 for copies, 1 for no shared tokens."""
    tokens = [tokenize(a) for a in actions]
    sim = similarity_matrix(PoolBM25(tokens), tokens)
    pairs = list(itertools.combinations(range(len(actions)), 2))
    return sum(1 - sim[a][b] for a, b in pairs) / len(pairs) if pairs else 0.0


def summarize(points: list[BranchingPoint]) -> dict[str, float]:
    m: dict[str, float] = {"points": float(len(points)), "kept": float(sum(p.kept for p in points))}
    for reason, count in Counter(p.drop_reason for p in points if not p.kept).items():
        m[f"dropped.{reason}"] = float(count)
    votes_by_judge: dict[str, list[bool]] = {}
    taus, self_taus, diversities = [], [], []
    top_labels: Counter = Counter()
    winner_labels: Counter = Counter()
    for p in points:
        for v in p.votes:
            votes_by_judge.setdefault(v.judge, []).append(v.valid)
        if p.slate:
            diversities.append(slate_diversity([p.candidates[i].action for i in p.slate]))
        if p.kept:
            ag = agreement(p.votes, p.borda_scores)
            if ag.mean_tau is not None:
                taus.append(ag.mean_tau)
            if ag.mean_self_tau is not None:
                self_taus.append(ag.mean_self_tau)
            top_labels.update(ag.top_labels)
            winner_labels.update(ag.winner_labels)
    for judge, valid in sorted(votes_by_judge.items()):
        m[f"judge_validity.{judge}"] = sum(valid) / len(valid)
    m["mean_kendall_tau"] = sum(taus) / len(taus) if taus else float("nan")
    if self_taus:  # judges ranked in several orders (collect.judge_orders)
        m["mean_self_kendall_tau"] = sum(self_taus) / len(self_taus)
    m["slate_diversity"] = sum(diversities) / len(diversities) if diversities else float("nan")
    k = max((len(p.slate) for p in points), default=0)
    m.update(label_distribution("top_label", top_labels, k))
    m.update(label_distribution("winner_label", winner_labels, k))
    m["candidates_per_point"] = sum(len(p.candidates) for p in points) / len(points) if points else 0.0
    m["distinct_per_point"] = sum(p.n_distinct for p in points) / len(points) if points else 0.0
    return {k_: round(v, 6) for k_, v in m.items()}


def label_distribution(prefix: str, counts: Counter, k: int) -> dict[str, float]:
    """Shares of each neutral label plus a chi-square p-value against uniform over the k labels."""
    from components.methods.coreact.council import neutral_labels

    total = sum(counts.values())
    if not total or not k:
        return {}
    labels = neutral_labels(k)
    observed = [counts.get(label, 0) for label in labels]
    out = {f"{prefix}.{label}": c / total for label, c in zip(labels, observed)}
    out[f"{prefix}_chi2_p"] = float(chisquare(observed).pvalue)
    out[f"{prefix}_n"] = float(total)
    return out
