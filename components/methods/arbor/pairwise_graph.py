"""ARBOR's sparse comparison graph over a query-group (paper 3.4) and the scores read off its judged edges.

The K trajectories are sorted by base reward (highest first; equal rewards keep group order) into positions
``o[0..K-1]``. Two kinds of edges:

- neighbour edges ``(o[k], o[k+1])`` for k = 0..K-2: close comparisons between similarly ranked attempts;
- diameter edges ``(o[k], o[k+h])`` with ``h = ceil(K/2)``, for k = 0..floor(K/2)-1: each attempt in the top
  half meets the one half a circle away, the high-contrast pairs.

The graph is connected (the neighbour edges alone form a path) and every trajectory is on an edge (K >= 2).
Edge count, exactly: ``|E| = (K - 1) + floor(K/2)`` for K >= 3, 1 for K = 2 (its one diameter edge is its
neighbour edge), 0 for K <= 1; so |E| <= 1.5 K, against K(K-1)/2 for a round robin (K=8: 11 vs 28).

A judged edge gives its two ends 1/0 (win/loss) or 0.5/0.5 (tie); a trajectory's score is the mean over its
judged edges. A failed edge is removed; a trajectory left with no judged edge has no score (``None``),
never 0.

    edges = sparse_graph([1.0, 0.0, 0.5, 0.0])
    scores = edge_scores(4, {(0, 2): 1.0, (2, 1): 0.5, (0, 1): None, ...})   # value: score of the first end
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

__all__ = ["edge_count", "edge_scores", "sort_order", "sparse_graph"]

Edge = tuple[int, int]


def sort_order(base: Sequence[float]) -> list[int]:
    """Group indices by base reward, highest first; ties keep group order."""
    return sorted(range(len(base)), key=lambda i: (-base[i], i))


def sparse_graph(base: Sequence[float]) -> list[Edge]:
    """The neighbour and diameter edges, as (higher-ranked, lower-ranked) pairs of group indices."""
    order = sort_order(base)
    k = len(order)
    edges = [(order[i], order[i + 1]) for i in range(k - 1)]
    half = k - k // 2
    for i in range(k // 2):
        edge = (order[i], order[i + half])
        if edge not in edges:
            edges.append(edge)
    return edges


def edge_count(k: int) -> int:
    """The exact number of edges :func:`sparse_graph` builds for a group of ``k``."""
    if k <= 1:
        return 0
    return 1 if k == 2 else (k - 1) + k // 2


def edge_scores(k: int, outcomes: Mapping[Edge, float | None]) -> list[float | None]:
    """Mean score over each trajectory's judged edges; ``outcomes[(i, j)]`` is i's result against j
    (1, 0.5 or 0, or between them when read from the judge's probabilities; ``None`` for a failed edge, which
    counts for neither end)."""
    sums, counts = [0.0] * k, [0] * k
    for (i, j), value in outcomes.items():
        if value is None:
            continue
        if not 0.0 <= value <= 1.0:
            raise ValueError(f"edge ({i}, {j}): outcome {value!r} is not between 0 and 1")
        sums[i] += value
        sums[j] += 1.0 - value
        counts[i] += 1
        counts[j] += 1
    return [sums[i] / counts[i] if counts[i] else None for i in range(k)]
