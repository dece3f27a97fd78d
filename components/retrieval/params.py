"""The ``retrieval`` section of params.yaml: the retriever behind the agents' ``search`` tool and what it shows
(components.retrieval). A pydantic leaf (it imports only ``params_section``), composed in
``components.params.Params``."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from components.params_section import Section


class RetrievalParams(Section):
    method: Literal["bm25", "dense", "hybrid"] = Field(default="bm25", description="Retriever behind `search`.")
    top_k: int = Field(default=3, ge=1, description="Hits returned per search call.")
    snippet_chars: int = Field(default=300, ge=20, description="Characters of each hit shown.")
    rrf_k: int = Field(default=60, ge=1, description="Reciprocal-rank-fusion constant for hybrid.")
    embedder: str = Field(default="embedded-minilm", description="Sentence embedder for dense retrieval.")
    scope: Literal["corpus", "question"] = Field(
        default="corpus",
        description="What a question searches: the pooled corpus, or only its own paragraphs "
        "(metadata.paragraph_ids: a benchmark example's context, a world question's gold paragraphs, their "
        "look-alikes and BM25 neighbours; the distractor setting of ARCO's HotpotQA code).",
    )
