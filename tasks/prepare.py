"""Stage `prepare`: questions (train/dev/test) and the retrieval corpus for ``data.source``.

    python -m tasks.prepare [--set data.source=hotpotqa]

The embedded world is generated from ``seed`` and the ``world`` section. A benchmark is read from
``data.benchmarks_dir`` (never copied into the project): its questions are shuffled with the seed and cut
into test, dev and train; the corpus pools every loaded question's paragraphs, so each question competes
with the others' paragraphs as distractors. Every question records its own paragraphs in
``metadata["paragraph_ids"]`` for ``retrieval.scope: question`` (a benchmark example's context paragraphs;
for the world, see ``components.retrieval.scope``).
Writes outputs/data/{train,dev,test}.jsonl, outputs/data/corpus.jsonl and outputs/data/summary.json.
"""

from __future__ import annotations

import logging
import random

from prefect import task
from pydantic import BaseModel

from components.io import write_json, write_jsonl
from components.params import Params
from components.params_cli import params_from_args, stage_argparser
from components.run_files import out_path
from components.schemas import Document, Question
from tasks.runtime import resolve, tracking

logger = logging.getLogger(__name__)


class PrepareResult(BaseModel):
    corpus: str
    splits: dict[str, str]
    counts: dict[str, int]


def build_dataset(params: Params) -> tuple[dict[str, list[Question]], list[Document]]:
    d = params.data
    sizes = {"test": d.n_test, "dev": d.n_dev, "train": d.n_train}
    if d.source == "world":
        from components.retrieval.scope import world_question_paragraphs
        from components.world import generate_world

        w = params.world
        world = generate_world(
            seed=params.seed, n_people=w.n_people, n_films=w.n_films, n_cities=w.n_cities,
            n_companies=w.n_companies, distractors_per_entity=w.distractors_per_entity,
            question_mix=w.question_mix, n_questions=sum(sizes.values()),
        )
        splits = world.split(train=d.n_train, dev=d.n_dev, test=d.n_test)
        scoped = {q.id: q for q in world_question_paragraphs(world, [q for qs in splits.values() for q in qs])}
        return {name: [scoped[q.id].model_copy(update={"split": name}) for q in splits[name]]
                for name in sizes}, world.documents
    from components.datasets import bamboogle_corpus, load_benchmark

    questions, corpus = load_benchmark(d.source, d.benchmarks_dir)
    if d.source == "bamboogle":
        corpus = bamboogle_corpus(d.bamboogle_corpus, d.benchmarks_dir)
    random.Random(params.seed).shuffle(questions)
    splits, start = {}, 0
    for name, size in sizes.items():
        splits[name] = [q.model_copy(update={"split": name}) for q in questions[start : start + size]]
        start += size
    return splits, corpus


@task(name="prepare")
def prepare(params: Params | None = None, parent_run_id: str | None = None) -> PrepareResult:
    params = resolve(params)
    splits, corpus = build_dataset(params)
    paths = {name: str(out_path(params.run, "data", f"{name}.jsonl")) for name in splits}
    for name, qs in splits.items():
        write_jsonl(paths[name], qs)
    corpus_path = out_path(params.run, "data", "corpus.jsonl")
    write_jsonl(corpus_path, corpus)
    counts = {**{f"questions_{k}": len(v) for k, v in splits.items()}, "documents": len(corpus)}
    requested = {"test": params.data.n_test, "dev": params.data.n_dev, "train": params.data.n_train}
    short = {name: f"{len(splits[name])} of {n}" for name, n in requested.items() if len(splits[name]) < n}
    if short:  # a benchmark file holds fewer questions than the sizes ask for: the later splits come out short
        logger.warning("prepare: %s holds fewer questions than data.n_* ask for; splits cut in the order test, dev, "
                       "train got %s", params.data.source, ", ".join(f"{k} {v}" for k, v in short.items()))
    types: dict[str, int] = {}
    for q in splits["test"]:
        types[q.type] = types.get(q.type, 0) + 1
    write_json(out_path(params.run, "data", "summary.json"), {"source": params.data.source, **counts, "short": short,
                                                          "test_types": types})
    with tracking(params, "prepare", parent_run_id) as tracker:
        tracker.log_params({"data": params.data.model_dump(), "world": params.world.model_dump(), "seed": params.seed})
        tracker.log_metrics(counts)
    return PrepareResult(corpus=str(corpus_path), splits=paths, counts=counts)


def main() -> None:
    args = stage_argparser(__doc__).parse_args()
    result = prepare.fn(params_from_args(args))
    print(result.model_dump_json(indent=2))


if __name__ == "__main__":
    from tasks.runtime import run_stage

    run_stage(main)
