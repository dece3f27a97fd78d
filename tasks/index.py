"""Stage `index`: build the retrieval index over the corpus once; later stages load it.

    python -m tasks.index

Reads outputs/data/corpus.jsonl; writes outputs/index/ (BM25 always, the dense faiss index too when
``retrieval.method`` is dense or hybrid).
"""

from __future__ import annotations

import time

from prefect import task
from pydantic import BaseModel

from components.io import read_jsonl
from components.params import Params
from components.retrieval import build_index
from components.schemas import Document
from tasks.runtime import out_path, params_from_args, resolve, stage_argparser, tracking


class IndexResult(BaseModel):
    index_dir: str
    documents: int
    method: str


def make_embedder(params: Params):
    if params.retrieval.method == "bm25":
        return None
    from components.embedded.models import load_embedder

    return load_embedder()


def build_from_params(params: Params, docs: list[Document], index_dir, embedder=None):
    """Build and save the ``retrieval`` section's index over ``docs`` (also used for sft_data's worlds)."""
    r = params.retrieval
    opts = {"snippet_chars": r.snippet_chars}
    if r.method != "bm25":
        opts.update(embedder=embedder or make_embedder(params), embedder_name=r.embedder)
    if r.method == "hybrid":
        opts["rrf_k"] = r.rrf_k
    return build_index(r.method, docs, index_dir, **opts)


@task(name="index")
def index(params: Params | None = None, parent_run_id: str | None = None) -> IndexResult:
    params = resolve(params)
    docs = read_jsonl(out_path(params, "data", "corpus.jsonl"), Document)
    index_dir = out_path(params, "index", "manifest.json").parent
    start = time.perf_counter()
    build_from_params(params, docs, index_dir)
    elapsed = time.perf_counter() - start
    with tracking(params, "index", parent_run_id) as tracker:
        tracker.log_params({"retrieval": params.retrieval.model_dump()})
        tracker.log_metrics({"documents": len(docs), "index_build_s": elapsed})
    return IndexResult(index_dir=str(index_dir), documents=len(docs), method=params.retrieval.method)


def main() -> None:
    args = stage_argparser(__doc__).parse_args()
    print(index.fn(params_from_args(args)).model_dump_json(indent=2))


if __name__ == "__main__":
    from tasks.runtime import run_stage

    run_stage(main)
