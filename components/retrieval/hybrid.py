"""Hybrid retrieval: reciprocal rank fusion (RRF) of a BM25 and a dense ranking.

Each retriever ranks its top ``depth`` documents; a document's fused score is the sum over retrievers
of ``1 / (rrf_k + rank)`` with 1-based ranks (a document a retriever did not return adds nothing).
Equal fused scores keep corpus order.

    index = HybridIndex(BM25Index(docs), DenseIndex(docs, embedder), rrf_k=60)
    hits = index.search("Nightfall Harbor director", k=3)     # SearchHit.score is the fused score
"""

from __future__ import annotations

from collections.abc import Sequence

from components.retrieval.bm25 import BM25Index, hit
from components.retrieval.dense import DenseIndex
from components.schemas import SearchHit


def rrf_fuse(rankings: Sequence[Sequence[int]], rrf_k: int = 60) -> list[tuple[int, float]]:
    """Fuse rankings of document positions (best first) into (position, score), best first."""
    if rrf_k < 1:
        raise ValueError(f"rrf_k must be >= 1, got {rrf_k}")
    fused: dict[int, float] = {}
    for ranking in rankings:
        for rank, doc in enumerate(ranking, start=1):
            fused[doc] = fused.get(doc, 0.0) + 1.0 / (rrf_k + rank)
    return sorted(fused.items(), key=lambda item: (-item[1], item[0]))


class HybridIndex:
    """BM25 and dense retrievers over the same documents, fused by RRF."""

    method = "hybrid"

    def __init__(self, bm25: BM25Index, dense: DenseIndex, *, rrf_k: int = 60, depth: int = 50):
        if [d.id for d in bm25.docs] != [d.id for d in dense.docs]:
            raise ValueError("the BM25 and dense indexes must cover the same documents in the same order")
        self.bm25, self.dense = bm25, dense
        self.docs = bm25.docs
        self.snippet_chars = bm25.snippet_chars
        self.rrf_k, self.depth = rrf_k, depth
        self.options = {"rrf_k": rrf_k, "depth": depth, "bm25": bm25.options, "dense": dense.options}

    def __len__(self) -> int:
        return len(self.docs)

    def ranked(self, query: str, k: int) -> list[tuple[int, float]]:
        depth = max(k, self.depth)
        rankings = [[i for i, _ in r.ranked(query, depth)] for r in (self.bm25, self.dense)]
        return rrf_fuse(rankings, self.rrf_k)[:k]

    def ranked_among(self, query: str, k: int, positions: Sequence[int]) -> list[tuple[int, float]]:
        """``ranked`` restricted to the documents at ``positions``: both retrievers rank only those."""
        depth = max(k, self.depth)
        rankings = [[i for i, _ in r.ranked_among(query, depth, positions)] for r in (self.bm25, self.dense)]
        return rrf_fuse(rankings, self.rrf_k)[:k]

    def search(self, query: str, k: int, snippet_chars: int | None = None) -> list[SearchHit]:
        n = self.snippet_chars if snippet_chars is None else snippet_chars
        return [hit(self.docs[i], s, n) for i, s in self.ranked(query, k)]
