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
from components.params_cli import params_from_args, stage_argparser
from components.retrieval.run_index import build_from_params
from components.run_files import out_path
from components.schemas import Document
from tasks.runtime import resolve, tracking


class IndexResult(BaseModel):
    index_dir: str
    documents: int
    method: str


@task(name="index")
def index(params: Params | None = None, parent_run_id: str | None = None) -> IndexResult:
    params = resolve(params)
    docs = read_jsonl(out_path(params.run, "data", "corpus.jsonl"), Document)
    index_dir = out_path(params.run, "index", "manifest.json").parent
    start = time.perf_counter()
    build_from_params(params.retrieval, docs, index_dir)
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
