"""The sparse comparison graph: connected, every trajectory on an edge, |E| = (K-1) + floor(K/2) for K >= 3."""

import pytest

from components.methods.arbor.pairwise_graph import edge_count, edge_scores, sparse_graph


def connected(k, edges):
    seen, frontier = {0}, [0]
    while frontier:
        node = frontier.pop()
        for i, j in edges:
            for a, b in ((i, j), (j, i)):
                if a == node and b not in seen:
                    seen.add(b)
                    frontier.append(b)
    return len(seen) == k


@pytest.mark.parametrize("k", range(1, 17))
def test_graph_is_connected_sparse_and_covers_every_trajectory(k):
    base = [((i * 7) % 5) / 4 for i in range(k)]  # ties included
    edges = sparse_graph(base)
    assert len(edges) == edge_count(k) == (0 if k == 1 else 1 if k == 2 else (k - 1) + k // 2)
    assert len(set(edges)) == len(edges) and all(i != j for i, j in edges)
    assert len({frozenset(e) for e in edges}) == len(edges)  # no pair judged twice in two orders
    assert len(edges) <= 1.5 * k
    if k >= 2:
        assert connected(k, edges)
        assert {n for e in edges for n in e} == set(range(k))


def test_edges_follow_the_base_reward_order():
    # order by base reward, ties by index: [1, 2, 0, 3]; neighbours then diameters (h = 2)
    assert sparse_graph([0.0, 1.0, 0.5, 0.0]) == [(1, 2), (2, 0), (0, 3), (1, 0), (2, 3)]
    edges = sparse_graph([7, 6, 5, 4, 3, 2, 1, 0])
    assert edges[7:] == [(0, 4), (1, 5), (2, 6), (3, 7)] and len(edges) == 11  # K=8: 11 calls, not 28


def test_scores_are_the_mean_over_judged_edges_and_none_without_one():
    # 0 beats 1, 1 ties 2, edge (0, 2) failed, 3's only edge failed
    scores = edge_scores(4, {(0, 1): 1.0, (1, 2): 0.5, (0, 2): None, (2, 3): None})
    assert scores == [1.0, 0.25, 0.5, None]
    with pytest.raises(ValueError, match=r"edge \(0, 1\)"):
        edge_scores(2, {(0, 1): 1.5})
    assert edge_scores(2, {(0, 1): 0.7}) == pytest.approx([0.7, 0.3])  # an outcome read from probabilities
