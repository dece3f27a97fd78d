"""A run's index as its ``retrieval`` params section describes it: build one over a corpus (the ``index``
stage's, and each of sft_data's training worlds'), and load the built one as the agent's toolbox.

    build_from_params(params.retrieval, docs, "outputs/index")   # BM25, dense or hybrid, as retrieval.method says
    toolbox = run_toolbox(params)                                 # in a task (tasks/runtime.py): the run's built index
    tools = toolbox.for_question(question)                  # retrieval.scope=question: its paragraphs only
"""

from __future__ import annotations

from components.io import read_jsonl
from components.params import RunParams
from components.retrieval.params import RetrievalParams
from components.run_files import out_path
from components.schemas import Document


def make_embedder(retrieval: RetrievalParams):
    """The embedder of a dense or hybrid ``retrieval.method``; None for bm25 (nothing is loaded)."""
    if retrieval.method == "bm25":
        return None
    from components.embedded.models import load_embedder

    return load_embedder()


def build_from_params(r: RetrievalParams, docs: list[Document], index_dir, embedder=None):
    """Build and save the ``retrieval`` section's index over ``docs`` (also used for sft_data's worlds)."""
    from components.retrieval.store import build_index  # faiss: imported when an index is built, not before

    opts = {"snippet_chars": r.snippet_chars}
    if r.method != "bm25":
        opts.update(embedder=embedder or make_embedder(r), embedder_name=r.embedder)
    if r.method == "hybrid":
        opts["rrf_k"] = r.rrf_k
    return build_index(r.method, docs, index_dir, **opts)


def toolbox_options(retrieval: RetrievalParams, browse_chars: int) -> dict:
    """The ``make_toolbox`` options of the ``retrieval`` section, a browsed page cut at ``browse_chars``."""
    return {"top_k": retrieval.top_k, "snippet_chars": retrieval.snippet_chars, "browse_chars": browse_chars,
            "scope": retrieval.scope}


def load_toolbox(run: RunParams, retrieval: RetrievalParams, browse_chars: int):
    """The agent toolbox over ``run``'s prepared corpus and built index (stale indexes are refused), in
    ``retrieval.scope``, a browsed page cut at ``browse_chars`` (``agent.observation_max_chars``): an episode uses
    ``toolbox.for_question(question)``."""
    from components.retrieval.store import load_index
    from components.retrieval.tools import make_toolbox

    docs = read_jsonl(out_path(run, "data", "corpus.jsonl"), Document)
    index = load_index(out_path(run, "index", "manifest.json").parent, docs=docs)
    return make_toolbox(index, docs, **toolbox_options(retrieval, browse_chars))
