"""The sparse BM25 index (components.retrieval.bm25) against rank-bm25's BM25Okapi, the library it replaced:
the same scores (to 1e-9 relative, and in fact bit for bit) and the same top-k, ties in corpus order included,
on the embedded world corpus, on benchmark subsets (skipped when ../shared/data/benchmarks is absent), on a
corpus with duplicated paragraphs (ties by construction) and through a save/load round trip.

    .venv/bin/python -m pytest -q tests/retrieval/test_bm25_sparse.py

rank-bm25 is a dev dependency (the reference only); these tests skip without it.
"""

from __future__ import annotations

import random
from collections import Counter

import numpy as np
import pytest

from components.params_load import load_params
from components.retrieval.bm25 import BM25Index
from components.retrieval.store import build_index, load_index
from components.retrieval.text import tokenize
from components.schemas import Document
from components.world import generate_world

rank_bm25 = pytest.importorskip("rank_bm25")

K = 3


def reference(docs, title_weight=2, k1=1.5, b=0.75):
    """What BM25Index built before issue 49.6: BM25Okapi over the same title-weighted tokens."""
    corpus = [tokenize(d.title) * title_weight + tokenize(d.text) for d in docs]
    return rank_bm25.BM25Okapi([t or ["\x00"] for t in corpus], k1=k1, b=b)


def reference_scores(ref, query: str) -> np.ndarray:
    tokens = tokenize(query)
    return np.asarray(ref.get_scores(tokens), dtype=np.float64) if tokens else np.zeros(ref.corpus_size)


def reference_ranked(scores: np.ndarray, k: int, order=None) -> list[tuple[int, float]]:
    """Best first, equal scores in index order; positive scores only."""
    best = sorted(range(len(scores)), key=lambda i: (-scores[i], i))[:k]
    return [(i if order is None else order[i], float(scores[i])) for i in best if scores[i] > 0]


def queries_for(docs, questions=(), n_random=150, seed=0) -> list[str]:
    """Questions, titles, and random bags of corpus words (repeats, very common words, unknown words)."""
    rng = random.Random(seed)
    words = sorted({w for d in docs for w in tokenize(d.text)})
    common = [w for w, _ in Counter(w for d in docs for w in set(tokenize(d.text))).most_common(10)]
    out = [q.question for q in questions] + [d.title for d in docs[:: max(1, len(docs) // 60)]]
    for i in range(n_random):
        bag = rng.choices(words, k=rng.randint(1, 8)) + rng.choices(common, k=rng.randint(0, 3))
        if i % 10 == 0:
            bag.append("zzqxunknown")
        if i % 7 == 0:
            bag += bag[:2]  # a repeated term counts again
        rng.shuffle(bag)
        out.append(" ".join(bag))
    return out + ["", "!!!", "zzqxunknown"]


def assert_same(index: BM25Index, ref, queries, k=K) -> int:
    """Every query's scores and top-k equal the reference's; returns how many top-k lists hold a tie."""
    ties = 0
    for q in queries:
        want, got = reference_scores(ref, q), index.scores(q)
        np.testing.assert_allclose(got, want, rtol=1e-9, atol=0, err_msg=q)
        assert np.array_equal(got, want), f"not bit-identical for {q!r}"
        expected = reference_ranked(want, k)
        assert index.ranked(q, k) == expected, q
        positive = np.sort(want[want > 0])[::-1]
        ties += (len(positive) > k and positive[k - 1] == positive[k]) or len({s for _, s in expected}) < len(expected)
    return ties


def floored_terms(ref) -> int:
    """Terms in more than half of the documents, whose negative IDF rank-bm25 raises to epsilon * mean IDF."""
    df = Counter(w for freqs in ref.doc_freqs for w in freqs)
    return sum(1 for f in df.values() if ref.corpus_size - f + 0.5 < f + 0.5)


@pytest.fixture(scope="module")
def world():
    p = load_params("params.yaml").world
    return generate_world(seed=1234, n_people=p.n_people, n_films=p.n_films, n_cities=p.n_cities,
                          n_companies=p.n_companies, distractors_per_entity=p.distractors_per_entity,
                          question_mix=p.question_mix, n_questions=100)


def test_world_corpus_scores_and_top_k_equal_rank_bm25(world):
    docs = world.documents
    ref, index = reference(docs), BM25Index(docs)
    queries = queries_for(docs, world.questions)
    assert len(queries) > 300
    assert floored_terms(ref) > 0  # the epsilon floor is exercised
    assert_same(index, ref, queries, k=K)
    assert_same(index, ref, queries[:80], k=50)  # deep lists: many documents share a score


def test_non_default_options_equal_rank_bm25(world):
    docs = world.documents[:120]
    ref, index = reference(docs, title_weight=0, k1=0.9, b=0.3), BM25Index(docs, title_weight=0, k1=0.9, b=0.3)
    assert_same(index, ref, queries_for(docs, world.questions[:30], n_random=60, seed=1))


def test_ties_keep_corpus_order(world):
    # every paragraph twice, under another id: each score is shared by at least two documents
    docs = world.documents[:80]
    dup = docs + [Document(id=f"{d.id}-copy", title=d.title, text=d.text) for d in docs]
    ref, index = reference(dup), BM25Index(dup)
    queries = queries_for(dup, world.questions[:40], n_random=60, seed=2)
    assert assert_same(index, ref, queries, k=4) > len(queries) // 2
    top = index.ranked(docs[5].title, 2)
    assert [i for i, _ in top] == [5, 85] and top[0][1] == top[1][1]


def test_ranked_among_equals_rank_bm25_on_the_subset(world):
    docs = world.documents
    ref, index = reference(docs), BM25Index(docs)
    rng = random.Random(3)
    for q in queries_for(docs, world.questions[:40], n_random=40, seed=3):
        pos = rng.sample(range(len(docs)), 30)  # not sorted: ties keep this order
        sub = np.asarray(ref.get_batch_scores(tokenize(q), pos)) if tokenize(q) else np.zeros(len(pos))
        assert index.ranked_among(q, K, pos) == reference_ranked(sub, K, order=pos), q
    assert index.ranked_among("film", K, []) == []


@pytest.mark.parametrize("name", ["hotpotqa", "2wikimultihopqa", "musique"])
def test_benchmark_subset_equals_rank_bm25(benchmarks_dir, name):
    from components.datasets import load_benchmark

    questions, docs = load_benchmark(name, benchmarks_dir, limit=60)
    ref, index = reference(docs), BM25Index(docs)
    queries = queries_for(docs, questions, n_random=80, seed=4)
    assert_same(index, ref, queries)


def test_saved_and_loaded_index_ranks_like_rank_bm25(world, tmp_path):
    docs = world.documents[:100]
    build_index("bm25", docs, tmp_path / "bm25", title_weight=1, k1=1.2, b=0.5)
    loaded = load_index(tmp_path / "bm25", docs)
    assert loaded.options == {"title_weight": 1, "k1": 1.2, "b": 0.5}
    ref = reference(docs, title_weight=1, k1=1.2, b=0.5)
    assert_same(loaded, ref, queries_for(docs, world.questions[:20], n_random=30, seed=5))


@pytest.mark.parametrize("opts, field", [({"k1": 0.0}, "k1"), ({"b": 1.5}, "b"), ({"title_weight": -1}, "title_weight")])
def test_bad_options_are_named(world, opts, field):
    with pytest.raises(ValueError, match=field):
        BM25Index(world.documents[:5], **opts)
