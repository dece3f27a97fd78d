"""Sparse retrieval: a BM25 (Okapi, via rank-bm25) index over titled paragraphs.

Each document is indexed as its title tokens repeated ``title_weight`` times followed by its text
tokens, so a query naming an entity ranks that entity's own paragraph above paragraphs that only
mention it. Ties in score keep corpus order, so results are deterministic.

    index = BM25Index(docs, snippet_chars=300)
    hits = index.search("Nightfall Harbor director", k=3)     # list[SearchHit], best first

Saving and loading go through ``components.retrieval.store`` (``build_index`` / ``load_index``); a
BM25 index keeps no binary state on disk and is rebuilt from the stored documents when loaded.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from rank_bm25 import BM25Okapi

from components.retrieval.text import make_snippet, tokenize
from components.schemas import Document, SearchHit


def top_indices(scores: np.ndarray, k: int) -> list[int]:
    """Indices of the ``k`` highest scores, best first; equal scores keep index order."""
    order = np.lexsort((np.arange(len(scores)), -np.asarray(scores, dtype=np.float64)))
    return [int(i) for i in order[:k]]


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
        self.docs = list(docs)
        self.snippet_chars = snippet_chars
        self.options = {"title_weight": title_weight, "k1": k1, "b": b}
        corpus = [tokenize(d.title) * title_weight + tokenize(d.text) for d in self.docs]
        # rank-bm25 divides by the average length; an all-empty corpus would divide by zero
        corpus = [toks or ["\x00"] for toks in corpus]
        self._bm25 = BM25Okapi(corpus, k1=k1, b=b)
        self._doc_len = np.asarray(self._bm25.doc_len, dtype=np.float64)

    def __len__(self) -> int:
        return len(self.docs)

    def scores(self, query: str) -> np.ndarray:
        """BM25 score of every document for ``query`` (zeros when the query has no tokens)."""
        tokens = tokenize(query)
        if not tokens:
            return np.zeros(len(self.docs))
        return np.asarray(self._bm25.get_scores(tokens), dtype=np.float64)

    def ranked(self, query: str, k: int) -> list[tuple[int, float]]:
        """(document position, score) of the top ``k`` documents with a positive score."""
        scores = self.scores(query)
        return [(i, float(scores[i])) for i in top_indices(scores, k) if scores[i] > 0]

    def ranked_among(self, query: str, k: int, positions: Sequence[int]) -> list[tuple[int, float]]:
        """``ranked`` restricted to the documents at ``positions``: the same scores (corpus-wide IDF and
        average length), computed for those documents only."""
        tokens = tokenize(query)
        if not tokens or not positions:
            return []
        # rank-bm25's get_batch_scores, without its conversion of every document length per call
        bm, pos = self._bm25, list(positions)
        norm = bm.k1 * (1 - bm.b + bm.b * self._doc_len[pos] / bm.avgdl)
        scores = np.zeros(len(pos))
        for token in tokens:
            tf = np.array([bm.doc_freqs[i].get(token, 0) for i in pos], dtype=np.float64)
            scores += (bm.idf.get(token) or 0) * (tf * (bm.k1 + 1) / (tf + norm))
        return [(pos[j], float(scores[j])) for j in top_indices(scores, k) if scores[j] > 0]

    def search(self, query: str, k: int, snippet_chars: int | None = None) -> list[SearchHit]:
        n = self.snippet_chars if snippet_chars is None else snippet_chars
        return [hit(self.docs[i], s, n) for i, s in self.ranked(query, k)]


def hit(doc: Document, score: float, snippet_chars: int) -> SearchHit:
    snippet = make_snippet(doc.text, snippet_chars)
    return SearchHit(doc_id=doc.id, title=doc.title, snippet=snippet, score=score)
