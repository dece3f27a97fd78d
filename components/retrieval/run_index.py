"""A run's index as its ``retrieval`` params section describes it: build one over a corpus (the ``index``
stage's, and each of sft_data's training worlds'), and load the built one as the agent's toolbox.

    build_from_params(params, docs, "outputs/index")        # BM25, dense or hybrid, as retrieval.method says
    toolbox = load_toolbox(params)                          # the prepared corpus and built index of the run
    tools = toolbox.for_question(question)                  # retrieval.scope=question: its paragraphs only
"""

from __future__ import annotations

from components.io import read_jsonl
from components.params import Params
from components.run_files import out_path
from components.schemas import Document


def make_embedder(params: Params):
    """The embedder of a dense or hybrid ``retrieval.method``; None for bm25 (nothing is loaded)."""
    if params.retrieval.method == "bm25":
        return None
    from components.embedded.models import load_embedder

    return load_embedder()


def build_from_params(params: Params, docs: list[Document], index_dir, embedder=None):
    """Build and save the ``retrieval`` section's index over ``docs`` (also used for sft_data's worlds)."""
    from components.retrieval.store import build_index  # faiss: imported when an index is built, not before

    r = params.retrieval
    opts = {"snippet_chars": r.snippet_chars}
    if r.method != "bm25":
        opts.update(embedder=embedder or make_embedder(params), embedder_name=r.embedder)
    if r.method == "hybrid":
        opts["rrf_k"] = r.rrf_k
    return build_index(r.method, docs, index_dir, **opts)


def load_toolbox(params: Params):
    """The agent toolbox over the prepared corpus and the built index (stale indexes are refused), in the
    ``retrieval.scope`` of params: an episode uses ``toolbox.for_question(question)``."""
    from components.retrieval.store import load_index
    from components.retrieval.tools import make_toolbox

    docs = read_jsonl(out_path(params.run, "data", "corpus.jsonl"), Document)
    index = load_index(out_path(params.run, "index", "manifest.json").parent, docs=docs)
    return make_toolbox(index, docs, top_k=params.retrieval.top_k, snippet_chars=params.retrieval.snippet_chars,
                        browse_chars=params.agent.observation_max_chars, scope=params.retrieval.scope)
