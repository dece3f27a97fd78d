"""Sparse retrieval: a BM25 (Okapi) index over titled paragraphs, scored from a term-document matrix.

Each document is indexed as its title tokens repeated ``title_weight`` times followed by its text
tokens, so a query naming an entity ranks that entity's own paragraph above paragraphs that only
mention it. Ties in score keep corpus order, so results are deterministic.

    index = BM25Index(docs, snippet_chars=300)
    hits = index.search("Nightfall Harbor director", k=3)     # list[SearchHit], best first

The scores are exactly (bit for bit) those of ``rank_bm25.BM25Okapi`` (0.2.2), which this module replaced
(issue 49.6): the same IDF, ``log(N - df + 0.5) - log(df + 0.5)`` with a negative IDF raised to
``epsilon * mean IDF``, the same per-(term, document) arithmetic, and a query's terms added one after the
other in query order (a repeated term counts again). The weight of every (term, document) pair is computed
once, at build time, into a CSR matrix (a row per term), so a query adds a few sparse rows instead of looping
over every document. ``tests/retrieval/test_bm25_sparse.py`` checks the equality against rank-bm25.

Saving and loading go through ``components.retrieval.store`` (``build_index`` / ``load_index``); a
BM25 index keeps no binary state on disk and is rebuilt from the stored documents when loaded.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from scipy import sparse

from components.retrieval.text import make_snippet, tokenize
from components.schemas import Document, SearchHit

EPSILON = 0.25  # rank-bm25's BM25Okapi default: the floor for a negative IDF is EPSILON * the mean IDF


def top_indices(scores: np.ndarray, k: int) -> list[int]:
    """Indices of the ``k`` highest scores, best first; equal scores keep index order."""
    order = np.lexsort((np.arange(len(scores)), -np.asarray(scores, dtype=np.float64)))
    return [int(i) for i in order[:k]]


def top_positive(scores: np.ndarray, k: int) -> list[int]:
    """``[i for i in top_indices(scores, k) if scores[i] > 0]``, sorting only the candidates that can be in it."""
    if k <= 0:
        return []
    cand = np.flatnonzero(scores > 0)
    if len(cand) > k:
        vals = scores[cand]
        kth = np.partition(vals, len(cand) - k)[len(cand) - k]  # the k-th highest; all equal to it stay
        cand = cand[vals >= kth]
    order = np.lexsort((cand, -scores[cand]))
    return [int(i) for i in cand[order[:k]]]


class BM25Index:
    """BM25Okapi over title-weighted document tokens."""

    method = "bm25"

    def __init__(
        self, docs: Sequence[Document], *, snippet_chars: int = 300, title_weight: int = 2,
        k1: float = 1.5, b: float = 0.75,
    ):
        if not docs:
            raise ValueError("BM25Index needs at least one document")
        if title_weight < 0:
            raise ValueError(f"title_weight must be >= 0, got {title_weight}")
        if not k1 > 0:  # k1 = 0 divides 0 by 0 for every document without the term
            raise ValueError(f"k1 must be > 0, got {k1}")
        if not 0 <= b <= 1:
            raise ValueError(f"b must be in [0, 1], got {b}")
        self.docs = list(docs)
        self.snippet_chars = snippet_chars
        self.options = {"title_weight": title_weight, "k1": k1, "b": b}

        # term ids in order of first occurrence, the order rank-bm25 sums IDFs in for the mean
        vocab: dict[str, int] = {}
        term_ids: list[int] = []
        doc_len = np.empty(len(self.docs), dtype=np.int64)
        for j, d in enumerate(self.docs):
            toks = tokenize(d.title) * title_weight + tokenize(d.text)
            # rank-bm25 divides by the average length; an all-empty corpus would divide by zero
            toks = toks or ["\x00"]
            doc_len[j] = len(toks)
            term_ids.extend(vocab.setdefault(t, len(vocab)) for t in toks)
        n_docs, n_terms = len(self.docs), len(vocab)
        doc_of = np.repeat(np.arange(n_docs), doc_len)
        tf = sparse.csr_array((np.ones(len(term_ids), dtype=np.int64), (np.asarray(term_ids), doc_of)),
                              shape=(n_terms, n_docs))  # duplicates summed: term frequencies
        tf.sum_duplicates()
        tf.sort_indices()
        df = np.diff(tf.indptr)

        idf = [math.log(n_docs - f + 0.5) - math.log(f + 0.5) for f in df.tolist()]
        average_idf = sum(idf) / n_terms  # summed left to right, as rank-bm25 does
        floor = EPSILON * average_idf
        idf = np.array([x if x >= 0 else floor for x in idf], dtype=np.float64)

        avgdl = int(doc_len.sum()) / n_docs
        freq = tf.data.astype(np.float64)
        dl = doc_len[tf.indices]
        # rank-bm25's expression, term by term, so every weight is the same float
        norm = k1 * (1 - b + b * dl / avgdl)
        weight = np.repeat(idf, df) * (freq * (k1 + 1) / (freq + norm))
        self._vocab = vocab
        self._indptr, self._doc_ids, self._weight = tf.indptr, tf.indices, weight
        self.idf, self.avgdl, self.doc_len = idf, avgdl, doc_len

    def __len__(self) -> int:
        return len(self.docs)

    def scores(self, query: str) -> np.ndarray:
        """BM25 score of every document for ``query`` (zeros when the query has no known tokens)."""
        scores = np.zeros(len(self.docs))
        for token in tokenize(query):
            t = self._vocab.get(token)
            if t is not None:
                lo, hi = self._indptr[t], self._indptr[t + 1]
                scores[self._doc_ids[lo:hi]] += self._weight[lo:hi]  # a term's documents are distinct
        return scores

    def ranked(self, query: str, k: int) -> list[tuple[int, float]]:
        """(document position, score) of the top ``k`` documents with a positive score."""
        scores = self.scores(query)
        return [(i, float(scores[i])) for i in top_positive(scores, k)]

    def ranked_among(self, query: str, k: int, positions: Sequence[int]) -> list[tuple[int, float]]:
        """``ranked`` restricted to the documents at ``positions``: the same scores (corpus-wide IDF and
        average length); equal scores keep the order of ``positions``."""
        pos = list(positions)
        if not pos:
            return []
        scores = self.scores(query)[pos]
        return [(pos[j], float(scores[j])) for j in top_positive(scores, k)]

    def search(self, query: str, k: int, snippet_chars: int | None = None) -> list[SearchHit]:
        n = self.snippet_chars if snippet_chars is None else snippet_chars
        return [hit(self.docs[i], s, n) for i, s in self.ranked(query, k)]


def hit(doc: Document, score: float, snippet_chars: int) -> SearchHit:
    snippet = make_snippet(doc.text, snippet_chars)
    return SearchHit(doc_id=doc.id, title=doc.title, snippet=snippet, score=score)
