"""Build an index into a folder and load it back, refusing stale or altered indexes.

A folder holds ``docs.jsonl`` (the indexed documents, in index order), ``dense.faiss`` for dense and
hybrid indexes, and ``manifest.json``, written last: method, document count, the corpus fingerprint
(sha256 over every document's id, title and text, see ``corpus_sha256``), the sha256 of each file
and the build options. BM25 keeps no binary state: it is rebuilt from ``docs.jsonl`` on load (no
pickles). ``load_index`` raises ``StaleIndexError`` when the folder was built from a different
corpus than the one given, or when a file changed after the build.

    index = build_index("hybrid", docs, "data/index", embedder=load_embedder(), rrf_k=60)
    index = load_index("data/index", docs=docs)             # or docs="data/corpus.jsonl"
    index.search("Nightfall Harbor", k=3)
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import faiss

from components.io import read_json, read_jsonl, write_json, write_jsonl
from components.retrieval.bm25 import BM25Index
from components.retrieval.dense import EMBEDDED_MINILM, DenseIndex, Embedder, resolve_embedder
from components.retrieval.hybrid import HybridIndex
from components.retrieval.text import corpus_sha256, file_sha256
from components.schemas import Document

FORMAT = 1
MANIFEST, DOCS, FAISS = "manifest.json", "docs.jsonl", "dense.faiss"
METHODS = ("bm25", "dense", "hybrid")
Index = BM25Index | DenseIndex | HybridIndex


class IndexLoadError(RuntimeError):
    """The folder holds no usable index (missing manifest, unknown format or method)."""


class StaleIndexError(IndexLoadError):
    """The index does not match the corpus it is used with, or its files changed after the build."""


def make_index(
    method: str, docs: Sequence[Document], *, snippet_chars: int = 300, title_weight: int = 2,
    k1: float = 1.5, b: float = 0.75, embedder: Embedder | None = None, embedder_name: str = EMBEDDED_MINILM,
    rrf_k: int = 60, depth: int = 50, faiss_index: faiss.Index | None = None,
) -> Index:
    """An in-memory index of ``method`` ('bm25', 'dense', 'hybrid'); nothing is written."""
    if method not in METHODS:
        raise ValueError(f"unknown retrieval method {method!r}; expected one of {', '.join(METHODS)}")
    if method == "bm25":
        return BM25Index(docs, snippet_chars=snippet_chars, title_weight=title_weight, k1=k1, b=b)
    embedder = embedder if embedder is not None else resolve_embedder(embedder_name)
    dense = DenseIndex(docs, embedder, snippet_chars=snippet_chars, embedder_name=embedder_name,
                       faiss_index=faiss_index)
    if method == "dense":
        return dense
    bm25 = BM25Index(docs, snippet_chars=snippet_chars, title_weight=title_weight, k1=k1, b=b)
    return HybridIndex(bm25, dense, rrf_k=rrf_k, depth=depth)


def build_index(method: str, docs: Sequence[Document], out_dir: str | Path, **opts) -> Index:
    """Build an index of ``method`` over ``docs``, save it into ``out_dir`` and return it.

    ``opts``: snippet_chars, title_weight, k1, b (BM25); embedder, embedder_name (dense); rrf_k, depth
    (hybrid). Unknown options are a TypeError.
    """
    docs = list(docs)
    ids = [d.id for d in docs]
    if len(set(ids)) != len(ids):
        dup = next(i for i in ids if ids.count(i) > 1)
        raise ValueError(f"duplicate document id {dup!r}: ids must be unique")
    index = make_index(method, docs, **opts)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / MANIFEST).unlink(missing_ok=True)  # a crash mid-build leaves a folder that load_index refuses
    write_jsonl(out / DOCS, docs)
    files = [DOCS]
    if method in ("dense", "hybrid"):
        dense = index if isinstance(index, DenseIndex) else index.dense
        tmp = out / f".{FAISS}.tmp"
        faiss.write_index(dense.index, str(tmp))
        os.replace(tmp, out / FAISS)
        files.append(FAISS)
    else:
        (out / FAISS).unlink(missing_ok=True)
    write_json(out / MANIFEST, {
        "format": FORMAT, "method": method, "n_docs": len(docs), "corpus_sha256": corpus_sha256(docs),
        "files": {name: file_sha256(out / name) for name in files}, "options": effective_options(index),
    })
    return index


def effective_options(index: Index) -> dict:
    """The build options in force (defaults included), so a load rebuilds exactly the same index."""
    opts: dict = {"snippet_chars": index.snippet_chars}
    if isinstance(index, (BM25Index, HybridIndex)):
        bm25 = index if isinstance(index, BM25Index) else index.bm25
        opts.update(bm25.options)
    if isinstance(index, (DenseIndex, HybridIndex)):
        dense = index if isinstance(index, DenseIndex) else index.dense
        opts["embedder_name"] = dense.embedder_name
    if isinstance(index, HybridIndex):
        opts.update(rrf_k=index.rrf_k, depth=index.depth)
    return opts


def read_manifest(out_dir: str | Path) -> dict:
    path = Path(out_dir) / MANIFEST
    if not path.is_file():
        raise IndexLoadError(f"no index at {out_dir}: {MANIFEST} is missing (build it with build_index)")
    manifest = read_json(path)
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        found = manifest.get("format") if isinstance(manifest, dict) else None
        raise IndexLoadError(f"{path}: unsupported index format {found!r}; rebuild the index")
    if manifest.get("method") not in METHODS:
        raise IndexLoadError(f"{path}: unknown method {manifest.get('method')!r}")
    return manifest


def load_index(
    out_dir: str | Path, docs: Sequence[Document] | str | Path | None = None, *,
    embedder: Embedder | None = None,
) -> Index:
    """Load the index saved in ``out_dir``.

    ``docs`` (documents or a corpus JSONL path) is the corpus the caller will use the index with; when
    given, an index built from any other corpus is refused with ``StaleIndexError``. ``embedder``
    replaces the one named in the manifest (dense and hybrid only).
    """
    out = Path(out_dir)
    manifest = read_manifest(out)
    for name, expected in manifest["files"].items():
        path = out / name
        if not path.is_file():
            raise StaleIndexError(f"{path} is missing; rebuild the index")
        if file_sha256(path) != expected:
            raise StaleIndexError(f"{path} changed after the index was built (sha256 mismatch); rebuild it")
    stored = read_jsonl(out / DOCS, Document)
    if len(stored) != manifest["n_docs"] or corpus_sha256(stored) != manifest["corpus_sha256"]:
        raise StaleIndexError(f"{out / DOCS} does not match {out / MANIFEST}; rebuild the index")
    if docs is not None:
        current = read_jsonl(docs, Document) if isinstance(docs, (str, Path)) else list(docs)
        sha = corpus_sha256(current)
        if sha != manifest["corpus_sha256"]:
            raise StaleIndexError(
                f"stale index at {out}: built from a corpus of {manifest['n_docs']} documents with sha256 "
                f"{manifest['corpus_sha256'][:12]}..., but the corpus given has {len(current)} documents "
                f"with sha256 {sha[:12]}...; rebuild it (build_index / `dvc repro index`)"
            )
    opts = dict(manifest.get("options", {}))
    faiss_index = faiss.read_index(str(out / FAISS)) if manifest["method"] != "bm25" else None
    if faiss_index is not None:
        opts["faiss_index"] = faiss_index
    return make_index(manifest["method"], stored, embedder=embedder, **opts)
