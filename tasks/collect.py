"""Stage `collect` (Co-ReAct 3.1): branching points with candidate pools, MMR slates, per-judge rankings
and Borda consensus, from the training questions.

    python -m tasks.collect                         # all questions
    python -m tasks.collect --shard 0 --num-shards 4   # one of four shards (run them anywhere)
    python -m tasks.collect --relabel --set collect.judge_reference=true   # same points, the current council

A shard's questions run concurrently on one event loop, as many at once as the candidate policies' and
judges' backends have slots (``LLMPool.slots``); each keeps the seed of its index in the question list, so
nothing depends on which finishes first. Resumable: when a question finishes, its points are appended to
outputs/collect/shard-<i>-of-<n>/points.jsonl and the question to done.jsonl; a re-run skips finished
questions and discards any points of unfinished ones. When every shard is done, the kept points are merged into
outputs/collect/branching_points.parquet and outputs/collect/metrics.json (kept/dropped by reason, judge
validity per judge, mean pairwise Kendall tau, slate diversity, label distributions), and timings.json: ``wall_s``,
the seconds the shards' runs took (summed over shards and resumed runs; each shard keeps its own in
elapsed.json), and ``question_s``, the sum of every question's own time, which overlap.

``--relabel`` asks the current council (judges, ``judge_reference``) to rank again every slate a finished
shard already holds, with the seeds ``collect`` used, and merges as usual. Candidate pools, slates and
prefixes are kept, so the costly sampling is not redone; prefixes still follow the old council's winners.
It appends to relabelled.jsonl (resumable) and, once every point is done, moves the old points to
points.before_relabel.jsonl and the new ones into points.jsonl.
"""

from __future__ import annotations

import asyncio
import shutil
import time
from collections.abc import Callable
from pathlib import Path

from prefect import task
from pydantic import BaseModel
from tqdm import tqdm

from components.agents.react import ReActAgent
from components.io import JsonlAppender, read_json, read_jsonl, write_json, write_jsonl, write_parquet
from components.llm.factory import LLMPool
from components.methods.coreact.collect import BranchingCollector, QuestionResult, question_seed
from components.methods.coreact.collect_metrics import summarize
from components.params import Params
from components.params_cli import params_from_args, stage_argparser
from components.run_files import keep_record, out_path, record_path
from components.schemas import BranchingPoint, Question
from tasks.runtime import resolve, run_toolbox, tracking


class CollectResult(BaseModel):
    shard_dir: str
    complete: bool
    dataset: str | None
    metrics: dict[str, float]


class DoneRecord(BaseModel):
    question_id: str
    stop: str
    samples: int
    unparseable: int
    failed_calls: int
    wall_s: float


ELAPSED = "elapsed.json"
"""In a shard's folder: the seconds its runs took, resumed ones added (the stage's ``wall_s``: the shards' sum)."""


def add_elapsed(folder: Path, seconds: float) -> None:
    before = read_json(folder / ELAPSED)["wall_s"] if (folder / ELAPSED).exists() else 0.0
    write_json(folder / ELAPSED, {"wall_s": before + seconds})


def shard_dir(params: Params, shard: int, num_shards: int) -> Path:
    return out_path(params.run, "collect", f"shard-{shard}-of-{num_shards}", "points.jsonl").parent


def _resume(folder: Path) -> set[str]:
    done_path, points_path = folder / "done.jsonl", folder / "points.jsonl"
    done = {r.question_id for r in read_jsonl(done_path, DoneRecord, skip_torn_tail=True)} if done_path.exists() else set()
    if points_path.exists():
        points = read_jsonl(points_path, BranchingPoint, skip_torn_tail=True)
        write_jsonl(points_path, [p for p in points if p.question_id in done])  # drop half-expanded questions
    return done


def merge(params: Params, num_shards: int) -> tuple[bool, str | None, dict[str, float]]:
    folders = [shard_dir(params, i, num_shards) for i in range(num_shards)]
    questions = _questions(params)
    done, points, records = set(), [], []
    for f in folders:
        if (f / "done.jsonl").exists():
            recs = read_jsonl(f / "done.jsonl", DoneRecord)
            records += recs
            done |= {r.question_id for r in recs}
        if (f / "points.jsonl").exists():
            points += read_jsonl(f / "points.jsonl", BranchingPoint)
    if not {q.id for q in questions} <= done:
        return False, None, {}
    # questions finish in any order; sorting makes the merged files independent of it
    points.sort(key=lambda p: (p.question_id, p.depth))
    records.sort(key=lambda r: r.question_id)
    metrics = summarize(points)
    samples = sum(r.samples for r in records)
    metrics.update({"questions": float(len(records)), "pool_samples": float(samples),
                    "pool_unparseable_rate": round(sum(r.unparseable for r in records) / max(samples, 1), 6),
                    "pool_failed_calls": float(sum(r.failed_calls for r in records))})
    dataset = out_path(params.run, "collect", "branching_points.parquet")
    write_parquet(dataset, [p for p in points if p.kept])
    write_json(out_path(params.run, "collect", "metrics.json"), metrics)
    question_s = sum(r.wall_s for r in records)  # questions run concurrently: this is not the stage's wall time
    wall = sum(read_json(f / ELAPSED)["wall_s"] for f in folders if (f / ELAPSED).exists())
    write_json(out_path(params.run, "collect", "timings.json"),
               {"wall_s": wall, "question_s": question_s, "s_per_point": question_s / max(len(points), 1)})
    return True, str(dataset), metrics


async def _relabel_all(collector: BranchingCollector, todo: list[BranchingPoint], questions: list[Question],
                       base_seed: int, in_flight: int, finished: Callable[[BranchingPoint], None]) -> None:
    slots = asyncio.Semaphore(in_flight)
    by_id = {q.id: (i, q) for i, q in enumerate(questions)}

    async def one(point: BranchingPoint) -> None:
        i, question = by_id[point.question_id]
        async with slots:
            finished(await collector.relabel(point, question, question_seed(base_seed, i)))

    await asyncio.gather(*(one(p) for p in todo))


def relabel_shard(params: Params, collector: BranchingCollector, in_flight: int, shard: int, num_shards: int) -> None:
    """Judge a finished shard's points again with ``collector``'s council (see the module docstring)."""
    folder = shard_dir(params, shard, num_shards)
    questions = _questions(params)
    mine = {q.id for i, q in enumerate(questions) if i % num_shards == shard}
    done = _resume(folder)
    if not mine <= done:
        raise ValueError(f"{folder}: relabel needs a finished shard; {len(mine - done)} of its questions are not "
                         f"in done.jsonl (run collect first)")
    points = read_jsonl(folder / "points.jsonl", BranchingPoint)
    out_file = folder / "relabelled.jsonl"
    key = lambda p: (p.question_id, p.depth)
    have = {key(p) for p in read_jsonl(out_file, BranchingPoint, skip_torn_tail=True)} if out_file.exists() else set()
    todo = [p for p in points if key(p) not in have]
    with JsonlAppender(out_file) as out, tqdm(total=len(todo), desc=f"relabel shard {shard}/{num_shards}") as bar:
        def finished(point: BranchingPoint) -> None:
            out.append(point)
            bar.update()

        asyncio.run(_relabel_all(collector, todo, questions, params.seed, in_flight, finished))
    relabelled = {key(p): p for p in read_jsonl(out_file, BranchingPoint, skip_torn_tail=True)}
    if set(relabelled) != {key(p) for p in points}:
        raise RuntimeError(f"{out_file}: relabelled points do not match {folder / 'points.jsonl'}")
    shutil.copyfile(folder / "points.jsonl", folder / "points.before_relabel.jsonl")
    write_jsonl(folder / "points.jsonl", [relabelled[key(p)] for p in points])  # in the order collect wrote them
    out_file.unlink()


def _questions(params: Params) -> list[Question]:
    return read_jsonl(out_path(params.run, "data", "train.jsonl"), Question)[: params.collect.n_questions]


async def _expand_all(collector: BranchingCollector, todo: list[tuple[int, Question]], base_seed: int,
                      in_flight: int, finished: Callable[[Question, QuestionResult, float], None]) -> None:
    """Expand ``todo`` (index, question) pairs, ``in_flight`` at a time; ``finished`` records each one as it ends."""
    slots = asyncio.Semaphore(in_flight)

    async def one(i: int, question: Question) -> None:
        async with slots:
            start = time.perf_counter()
            result = await collector.expand(question, question_seed(base_seed, i))
            finished(question, result, time.perf_counter() - start)

    tasks = [asyncio.ensure_future(one(i, q)) for i, q in todo]
    try:
        await asyncio.gather(*tasks)
    finally:  # one question's error stops the shard; finished questions are already on disk
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


@task(name="collect")
def collect(params: Params | None = None, shard: int = 0, num_shards: int = 1, parent_run_id: str | None = None,
            pool: LLMPool | None = None, relabel: bool = False) -> CollectResult:
    params = resolve(params)
    started = time.perf_counter()
    if not 0 <= shard < num_shards:
        raise ValueError(f"shard {shard} is not in [0, {num_shards})")
    questions = _questions(params)
    mine = [(i, q) for i, q in enumerate(questions) if i % num_shards == shard]
    folder = shard_dir(params, shard, num_shards)
    done = _resume(folder)
    own_pool = pool is None
    stage = "collect" if num_shards == 1 else f"collect@shard_{shard}_of_{num_shards}"
    pool = pool or LLMPool(params, record_path=record_path(params.run, stage))
    try:
        toolbox = run_toolbox(params)
        agent = ReActAgent(pool.role("policy"), toolbox, params.agent)
        collector = BranchingCollector(agent, pool.roles("candidate_policies"), pool.roles("council_judges"),
                                       params.collect, seed=params.seed)
        if relabel:
            relabel_shard(params, collector, pool.slots("council_judges"), shard, num_shards)
        todo = [] if relabel else [(i, q) for i, q in mine if q.id not in done]
        with JsonlAppender(folder / "points.jsonl") as points_out, JsonlAppender(folder / "done.jsonl") as done_out, \
                tqdm(total=len(todo), desc=f"collect shard {shard}/{num_shards}") as progress:

            def finished(q: Question, result: QuestionResult, wall_s: float) -> None:
                for point in result.points:
                    points_out.append(point)
                done_out.append(DoneRecord(question_id=q.id, stop=result.stop, samples=result.pool.samples,
                                           unparseable=result.pool.unparseable,
                                           failed_calls=result.pool.failed_calls, wall_s=wall_s))
                progress.update()

            in_flight = pool.slots("candidate_policies", "council_judges")
            asyncio.run(_expand_all(collector, todo, params.seed, in_flight, finished))
        llm_metrics = pool.accounting.metrics()
        keep_record(params.run, stage)
    finally:
        if own_pool:
            pool.close()
        add_elapsed(folder, time.perf_counter() - started)  # a crashed run's time was spent too
    complete, dataset, metrics = merge(params, num_shards)
    if complete:
        with tracking(params, "collect", parent_run_id) as tracker:
            tracker.log_params({"collect": params.collect.model_dump(), "roles": {
                r: params.llm.roles[r] for r in ("policy", "candidate_policies", "council_judges")}})
            tracker.log_metrics({**metrics, **read_json(out_path(params.run, "collect", "timings.json")), **llm_metrics})
            tracker.log_artifact(dataset)
    return CollectResult(shard_dir=str(folder), complete=complete, dataset=dataset, metrics=metrics)


def main() -> None:
    parser = stage_argparser(__doc__)
    parser.add_argument("--shard", type=int, default=0)
    parser.add_argument("--num-shards", type=int, default=1)
    parser.add_argument("--relabel", action="store_true", help="rank the shard's existing slates again")
    args = parser.parse_args()
    result = collect.fn(params_from_args(args), shard=args.shard, num_shards=args.num_shards, relabel=args.relabel)
    print(result.model_dump_json(indent=2))


if __name__ == "__main__":
    from tasks.runtime import run_stage

    run_stage(main)
