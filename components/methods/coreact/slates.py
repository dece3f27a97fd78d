"""Slate selection for a branching point (Co-ReAct 3.1): drop exact duplicates (:func:`normalise_action`), then pick
``k`` diverse candidate actions by Maximal Marginal Relevance (:func:`mmr`) over BM25 relevance to the point's
context (:func:`relevance`) and BM25 similarity between actions (:func:`similarity_matrix`), all over the pool's
own tiny corpus (:class:`PoolBM25`). Tokens are ``components.retrieval.text.tokenize``'s (lowercase alphanumeric
runs: ``search[Nightfall Harbor]`` is ``search nightfall harbor``).

    sel = select_slate([c.action for c in pool], k=4, lam=0.5, context=slate_context(question, last_obs))
    if not sel.enough:      # fewer than k distinct actions: Co-ReAct drops the branching point
        ...
    slate = [pool[i] for i in sel.indices]
"""

from __future__ import annotations

import math
import string
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from components.retrieval.text import tokenize
from components.schemas import Candidate

_EDGE = string.punctuation + string.whitespace


def normalise_action(action: str) -> str:
    """Duplicate key: lowercase, whitespace collapsed, punctuation (``string.punctuation``) and whitespace stripped
    at both ends, inner punctuation kept (``"Search[Foo] "`` and ``"search[foo]."`` are one action)."""
    return " ".join(action.lower().split()).strip(_EDGE)


def dedupe(actions: Sequence[str]) -> list[int]:
    """Pool indices of the first occurrence of each distinct normalised action, in pool order."""
    seen: set[str] = set()
    keep = []
    for i, action in enumerate(actions):
        key = normalise_action(action)
        if key not in seen:
            seen.add(key)
            keep.append(i)
    return keep


def slate_context(question: str, last_observation: str = "") -> str:
    """The relevance query of a branching point: the question plus the latest observation."""
    return f"{question}\n{last_observation}".strip()


class PoolBM25:
    """BM25 with a non-negative idf over a small list of tokenized strings: the Okapi term weight with k1=1.5,
    b=0.75 and idf ``ln(1 + (N - df + 0.5) / (df + 0.5))``. The classic Okapi idf (rank-bm25's) is zero for a term
    in half the pool and negative above, which on a 4-item pool would erase most of the overlap MMR is meant to see."""

    def __init__(self, docs: Sequence[list[str]], k1: float = 1.5, b: float = 0.75):
        self.k1, self.b = k1, b
        self.tfs = [Counter(d) for d in docs]
        self.lengths = [len(d) for d in docs]
        self.avgdl = (sum(self.lengths) / len(docs)) if docs and sum(self.lengths) else 1.0
        n = len(docs)
        df = Counter(t for d in docs for t in set(d))
        self.idf = {t: math.log(1.0 + (n - c + 0.5) / (c + 0.5)) for t, c in df.items()}

    def score(self, query: Sequence[str], j: int) -> float:
        tf, norm = self.tfs[j], self.k1 * (1 - self.b + self.b * self.lengths[j] / self.avgdl)
        total = 0.0
        for t in query:
            f = tf.get(t, 0)
            if f:
                total += self.idf[t] * f * (self.k1 + 1) / (f + norm)
        return total


def relevance(bm25: PoolBM25, tokens: Sequence[list[str]], context: str) -> list[float]:
    """BM25 of each action for the context, divided by the pool maximum (all 0 without overlap)."""
    query = tokenize(context)
    raw = [bm25.score(query, j) for j in range(len(tokens))]
    top = max(raw, default=0.0)
    return [r / top if top > 0 else 0.0 for r in raw]


def similarity_matrix(bm25: PoolBM25, tokens: Sequence[list[str]]) -> list[list[float]]:
    """Symmetric ``sim`` in [0, 1] between every pair of actions: ``d(a, b) = min(1, bm25(query=a, doc=b) /
    bm25(query=a, doc=a))`` (0 when ``a`` has no tokens), how much of ``a``'s self-match ``b`` reaches, and
    ``sim(a, b) = (d(a, b) + d(b, a)) / 2``: 1 for identical token lists, 0 for actions sharing no token."""
    n = len(tokens)
    raw = [[bm25.score(tokens[a], b) for b in range(n)] for a in range(n)]
    directed = [[min(1.0, raw[a][b] / raw[a][a]) if raw[a][a] > 0 else 0.0 for b in range(n)]
                for a in range(n)]
    return [[1.0 if a == b else (directed[a][b] + directed[b][a]) / 2 for b in range(n)] for a in range(n)]


def mmr(
    rel: Sequence[float], sim: Sequence[Sequence[float]], k: int, lam: float
) -> tuple[list[int], list[float]]:
    """MMR order of up to ``k`` items (positions into ``rel``) and the MMR score each had when picked: repeatedly
    the remaining item maximising ``lambda * rel(c) - (1 - lambda) * max_{s in selected} sim(c, s)`` (0 for the
    first pick), ties to the earliest in pool order."""
    selected: list[int] = []
    picked_scores: list[float] = []
    remaining = list(range(len(rel)))
    while remaining and len(selected) < k:
        best, best_score = None, -math.inf
        for c in remaining:  # pool order: a later item must beat the best strictly to win a tie
            penalty = max((sim[c][s] for s in selected), default=0.0)
            score = lam * rel[c] - (1 - lam) * penalty
            if score > best_score + 1e-12:
                best, best_score = c, score
        selected.append(best)
        picked_scores.append(best_score)
        remaining.remove(best)
    return selected, picked_scores


@dataclass
class SlateSelection:
    """The chosen slate. ``enough`` is False when fewer than ``k`` distinct actions exist: the slate
    then holds all of them in MMR order and Co-ReAct discards the branching point."""

    indices: list[int]
    n_distinct: int
    k: int
    distinct: list[int] = field(default_factory=list)
    mmr_scores: list[float] = field(default_factory=list)
    relevance: list[float] = field(default_factory=list)

    @property
    def enough(self) -> bool:
        return self.n_distinct >= self.k


def select_slate(
    pool: Sequence[str | Candidate], k: int = 4, lam: float = 0.5, context: str = "",
    k1: float = 1.5, b: float = 0.75,
) -> SlateSelection:
    """Dedupe ``pool`` (action strings or Candidates) and pick ``k`` actions by MMR.

    Returns indices into the original ``pool``; ``relevance`` is given per distinct action.
    """
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    if not 0.0 <= lam <= 1.0:
        raise ValueError(f"lam (MMR lambda) must be in [0, 1], got {lam}")
    actions = [c.action if isinstance(c, Candidate) else str(c) for c in pool]
    distinct = dedupe(actions)
    tokens = [tokenize(actions[i]) for i in distinct]
    bm25 = PoolBM25(tokens, k1=k1, b=b)
    rel = relevance(bm25, tokens, context)
    order, scores = mmr(rel, similarity_matrix(bm25, tokens), k, lam)
    return SlateSelection(indices=[distinct[p] for p in order], n_distinct=len(distinct), k=k,
                          distinct=distinct, mmr_scores=scores, relevance=rel)
