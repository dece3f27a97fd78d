"""Dense retrieval: cosine similarity of sentence embeddings with an exact faiss index.

Documents are embedded as ``"<title>: <text>"``, L2-normalised and stored in ``faiss.IndexFlatIP``,
so inner product equals cosine similarity. The embedder is injected: anything with
``encode(list[str]) -> np.ndarray`` (the sentence-transformers interface). The embedded default is
all-MiniLM-L6-v2 (``components.embedded.models.load_embedder``); tests pass a small fake.

    from components.embedded.models import load_embedder
    index = DenseIndex(docs, load_embedder(), snippet_chars=300)
    hits = index.search("who directed the harbour film", k=3)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import faiss
import numpy as np

from components.retrieval.bm25 import hit
from components.schemas import Document, SearchHit

EMBEDDED_MINILM = "embedded-minilm"


class Embedder(Protocol):
    def encode(self, sentences: list[str]) -> Any: ...


def resolve_embedder(name: str) -> Embedder:
    """The embedder a params name stands for; only the embedded MiniLM is known by name."""
    if name == EMBEDDED_MINILM:
        from components.embedded.models import load_embedder

        return load_embedder()
    raise ValueError(f"unknown embedder {name!r}: pass embedder=... explicitly (known: {EMBEDDED_MINILM!r})")


def embed(embedder: Embedder, texts: list[str]) -> np.ndarray:
    """Embeddings as a C-contiguous float32 matrix with unit rows (zero rows stay zero)."""
    vecs = np.asarray(embedder.encode(list(texts)), dtype=np.float32)
    if vecs.ndim != 2 or vecs.shape[0] != len(texts):
        raise ValueError(f"embedder returned shape {vecs.shape} for {len(texts)} texts; expected (n, dim)")
    norms = np.linalg.norm(vecs, axis=1, keepdims=True)
    return np.ascontiguousarray(vecs / np.where(norms > 0, norms, 1.0))


def doc_text(doc: Document) -> str:
    return f"{doc.title}: {doc.text}"


class DenseIndex:
    """Exact inner-product search over normalised document embeddings."""

    method = "dense"

    def __init__(
        self, docs: Sequence[Document], embedder: Embedder, *, snippet_chars: int = 300,
        embedder_name: str = EMBEDDED_MINILM, faiss_index: faiss.Index | None = None,
    ):
        if not docs:
            raise ValueError("DenseIndex needs at least one document")
        self.docs = list(docs)
        self.embedder = embedder
        self.embedder_name = embedder_name
        self.snippet_chars = snippet_chars
        if faiss_index is None:
            vecs = embed(embedder, [doc_text(d) for d in self.docs])
            faiss_index = faiss.IndexFlatIP(vecs.shape[1])
            faiss_index.add(vecs)
        if faiss_index.ntotal != len(self.docs):
            raise ValueError(f"faiss index holds {faiss_index.ntotal} vectors for {len(self.docs)} documents")
        self.index = faiss_index
        self.options = {"embedder": embedder_name, "dim": int(faiss_index.d)}

    def __len__(self) -> int:
        return len(self.docs)

    def ranked(self, query: str, k: int) -> list[tuple[int, float]]:
        """(document position, cosine) of the ``k`` nearest documents, best first."""
        if not query.strip():
            return []
        q = embed(self.embedder, [query])
        if q.shape[1] != self.index.d:
            raise ValueError(
                f"embedder gives {q.shape[1]}-d vectors but the index holds {self.index.d}-d ones "
                f"(built with {self.embedder_name!r})"
            )
        scores, ids = self.index.search(q, min(k, len(self.docs)))
        return [(int(i), float(s)) for i, s in zip(ids[0], scores[0], strict=True) if i >= 0]

    def ranked_among(self, query: str, k: int, positions: Sequence[int]) -> list[tuple[int, float]]:
        """``ranked`` restricted to the documents at ``positions`` (their stored vectors, no re-embedding);
        equal scores keep the order of ``positions``."""
        if not query.strip() or not positions:
            return []
        q = embed(self.embedder, [query])[0]
        vecs = np.vstack([self.index.reconstruct(int(i)) for i in positions])
        if vecs.shape[1] != q.shape[0]:
            raise ValueError(f"embedder gives {q.shape[0]}-d vectors but the index holds {vecs.shape[1]}-d ones")
        scores = vecs @ q
        order = np.lexsort((np.arange(len(scores)), -scores.astype(np.float64)))[:k]
        return [(positions[int(j)], float(scores[j])) for j in order]

    def search(self, query: str, k: int, snippet_chars: int | None = None) -> list[SearchHit]:
        n = self.snippet_chars if snippet_chars is None else snippet_chars
        return [hit(self.docs[i], s, n) for i, s in self.ranked(query, k)]
