"""Slate selection: duplicate removal, BM25 relevance / similarity, MMR picks derived by hand."""

from __future__ import annotations

import math

import pytest

from components.retrieval.text import tokenize
from components.schemas import Candidate
from components.methods.coreact.slates import (
    PoolBM25,
    dedupe,
    normalise_action,
    select_slate,
    similarity_matrix,
    slate_context,
)

# Token sets chosen so overlaps are obvious: 0 and 1 share {alpha, beta}; 0, 1 and 3 share {alpha};
# 2 ("delta") and 4 ("epsilon zeta") share nothing with anyone.
POOL = ["alpha beta", "alpha beta gamma", "delta", "alpha", "epsilon zeta"]


def test_normalise_action():
    assert normalise_action("  Search[Nightfall   Harbor]. ") == "search[nightfall harbor"
    assert normalise_action("search[nightfall harbor]") == "search[nightfall harbor"
    assert normalise_action("search[a.b]") == "search[a.b"  # inner punctuation is kept


def test_exact_duplicates_after_normalisation_are_removed():
    pool = ["search[Foo]", "Search[foo] ", "search[foo].", "search[Foo Bar]", "SEARCH[foo  bar]",
            "browse[d1]"]
    assert dedupe(pool) == [0, 3, 5]
    sel = select_slate(pool, k=3, lam=0.5, context="foo")
    assert sorted(sel.indices) == [0, 3, 5] and sel.n_distinct == 3 and sel.enough


def test_fewer_than_k_distinct_actions_is_signalled():
    sel = select_slate(["search[a]", "search[A]", "search[b]", "search[c]."], k=4)
    assert not sel.enough and sel.n_distinct == 3
    assert sorted(sel.indices) == [0, 2, 3]  # every distinct action, in MMR order
    assert not select_slate([], k=4).enough


def test_lambda_one_picks_by_relevance():
    # context terms: alpha (in 0, 1, 3) and gamma (only in 1).
    # 1 matches both terms -> most relevant; 3 and 0 match alpha only, and BM25's length
    # normalisation favours the shorter 3 ("alpha", 1 token) over 0 (2 tokens); 2 and 4 match
    # nothing (relevance 0) and tie, so pool order puts 2 first.
    sel = select_slate(POOL, k=4, lam=1.0, context="alpha gamma")
    assert sel.indices == [1, 3, 0, 2]
    assert sel.relevance[1] == 1.0 and sel.relevance[2] == sel.relevance[4] == 0.0


def test_lambda_zero_picks_maximal_diversity():
    # No relevance term: the first pick is a tie at 0 -> pool order gives 0. Then the candidates with
    # zero similarity to everything picked so far come next, in pool order: 2, then 4. Last come 3 and 1,
    # the ones overlapping 0: sim(0, 3) < sim(0, 1) (see the next test), so 3 before 1.
    assert select_slate(POOL, k=3, lam=0.0, context="alpha gamma").indices == [0, 2, 4]
    assert select_slate(POOL, k=5, lam=0.0, context="alpha gamma").indices == [0, 2, 4, 3, 1]


def test_similarity_matches_the_bm25_formula_by_hand():
    k1, b, n = 1.5, 0.75, 5
    avgdl = (2 + 3 + 1 + 1 + 2) / n

    def idf(df):
        return math.log(1 + (n - df + 0.5) / (df + 0.5))

    def term(dl):  # one occurrence of a term in a document of length dl
        return (k1 + 1) / (1 + k1 * (1 - b + b * dl / avgdl))

    ia, ib = idf(3), idf(2)  # alpha occurs in 3 actions, beta in 2
    d_0_to_3 = (ia * term(1)) / (ia * term(2) + ib * term(2))   # "alpha beta" as query on "alpha"
    d_3_to_0 = (ia * term(2)) / (ia * term(1))                  # "alpha" as query on "alpha beta"
    expected = (min(1, d_0_to_3) + min(1, d_3_to_0)) / 2

    toks = [tokenize(a) for a in POOL]
    sim = similarity_matrix(PoolBM25(toks), toks)
    assert sim[0][3] == pytest.approx(expected) and sim[3][0] == pytest.approx(expected)
    assert sim[0][1] > sim[0][3] > 0
    assert sim[2][0] == sim[4][1] == 0.0 and all(sim[i][i] == 1.0 for i in range(5))
    assert all(0.0 <= x <= 1.0 for row in sim for x in row)


def test_mmr_trades_relevance_for_diversity():
    pool = ["search[Nightfall Harbor director]", "search[Nightfall Harbor director name]",
            "search[Harbor]", "browse[doc-7]"]
    context = slate_context("Who is the Nightfall Harbor director?", "")
    assert select_slate(pool, k=2, lam=1.0, context=context).indices == [0, 1]   # the near-duplicate
    assert select_slate(pool, k=2, lam=0.3, context=context).indices == [0, 3]   # something different


def test_candidates_are_accepted_and_ties_are_deterministic():
    cands = [Candidate(action=a, model="m", temperature=0.4) for a in POOL]
    assert select_slate(cands, k=4, lam=0.5, context="alpha").indices == \
        select_slate(POOL, k=4, lam=0.5, context="alpha").indices
    same = ["x one", "y two", "z three", "w four"]
    assert select_slate(same, k=4, lam=0.5, context="").indices == [0, 1, 2, 3]


def test_bad_arguments():
    with pytest.raises(ValueError):
        select_slate(POOL, k=0)
    with pytest.raises(ValueError):
        select_slate(POOL, lam=1.5)
