"""Retrieval over a titled-paragraph corpus: BM25, dense (faiss) and hybrid (RRF) indexes, saved and
loaded with a manifest that detects stale indexes, and the agent's ``search`` / ``browse`` tools.

    from components.retrieval import build_index, load_index, Toolbox, SearchTool, BrowseTool
    index = build_index("bm25", docs, "data/index")
    tools = Toolbox(SearchTool(index, top_k=3, snippet_chars=300), BrowseTool({d.id: d for d in docs}))
    call = tools.call("search", "Nightfall Harbor")            # schemas.ToolCall, never raises
    tools.for_question(question)   # retrieval.scope=question: only the question's paragraphs (``scope``)

Names are imported lazily, so ``components.retrieval.text`` (used by ``components.methods.coreact.slates``) does not
pull in faiss or scipy.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "BM25Index": "bm25", "DenseIndex": "dense", "resolve_embedder": "dense", "HybridIndex": "hybrid",
    "rrf_fuse": "hybrid", "build_index": "store", "load_index": "store", "make_index": "store",
    "IndexLoadError": "store", "StaleIndexError": "store", "corpus_sha256": "text", "make_snippet": "text",
    "tokenize": "text", "SearchTool": "tools", "BrowseTool": "tools", "Toolbox": "tools", "make_toolbox": "tools",
    "ScopedIndex": "scope", "ScopeError": "scope", "question_paragraphs": "scope",
    "world_question_paragraphs": "scope",
}
__all__ = list(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"components.retrieval.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module 'components.retrieval' has no attribute {name!r}")
