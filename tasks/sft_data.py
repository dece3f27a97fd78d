"""Stage `sft_data`: warm-start trajectories in the agent's own format, from the world oracle and from the teacher
role, rejection-sampled (RubricEM B.2; the warm start of every method). ``--method`` names the warm start (a
``params.methods`` entry, default ``sft``), whose agent sets the format (ReAct, or RubricEM's scaffold with its
own rejection checks); what it reads and writes: :func:`sft_data`.

    python -m tasks.sft_data [--set sft.n_oracle=50 --set sft.n_teacher_questions=4]
    python -m tasks.sft_data --method sft_scaffold     # RubricEM's scaffold format -> outputs/sft_data_scaffold/
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import Counter

from prefect import task
from pydantic import BaseModel
from tqdm import tqdm

from components.io import read_jsonl, write_json, write_jsonl
from components.llm.factory import LLMPool
from components.method_registry import agent_method, method_section
from components.methods.rubricem.warmstart_reflections import (
    REFLECTION_REASONS,
    REFLECTIONS_FILE,
    ReflectionRejection,
    ReflectionRow,
    teacher_reflections,
)
from components.params import Params, with_method_settings
from components.params_cli import params_from_args, stage_argparser
from components.retrieval.run_index import build_from_params, make_embedder, toolbox_options
from components.run_files import (
    SFT_METHOD,
    keep_record,
    out_path,
    record_path,
    write_trajectories,
)
from components.run_spec import run_spec
from components.schemas import Document, Question, Trajectory
from components.warmstart import (
    REASONS,
    build_training_world,
    oracle_episodes,
    select,
    teacher_episodes,
    training_seeds,
)
from tasks.runtime import resolve, run_toolbox, tracking


class SFTDataResult(BaseModel):
    trajectories: str
    rejections: str
    metrics: dict[str, float]


def _summary(kept: list[Trajectory], rejections, oracle_failures: Counter, worlds, n_oracle_tried: int,
             teacher_items: int, teacher_episodes_run: int) -> dict[str, float]:
    by_source = Counter(t.metadata["source"] for t in kept)
    metrics: dict[str, float] = {
        "kept": len(kept), "kept.oracle": by_source["oracle"], "kept.teacher": by_source["teacher"],
        "rejected": len(rejections), "worlds": len(worlds),
        "world_questions_dropped_overlap": sum(w.dropped_overlap for w in worlds),
        "oracle.questions_tried": n_oracle_tried, "oracle.failed": sum(oracle_failures.values()),
        "teacher.questions": teacher_items, "teacher.episodes": teacher_episodes_run,
        "teacher.accept_rate": by_source["teacher"] / teacher_episodes_run if teacher_episodes_run else 0.0,
    }
    for kind, n in sorted(oracle_failures.items()):
        metrics[f"oracle.failed.{kind}"] = n
    reasons = Counter(r.reason for r in rejections)
    for reason in REASONS:
        metrics[f"rejected.{reason}"] = reasons[reason]
    for (source, qtype), n in sorted(Counter((t.metadata["source"], t.metadata.get("question_type", "other"))
                                             for t in kept).items()):
        metrics[f"kept.{source}.{qtype}"] = n
    calls = [t.n_tool_calls for t in kept]
    browses = sum(1 for t in kept for s in t.steps if s.tool_call is not None and s.tool_call.name == "browse")
    metrics["kept.mean_tool_calls"] = sum(calls) / len(calls) if calls else 0.0
    metrics["kept.browse_share"] = browses / sum(calls) if sum(calls) else 0.0
    return {k: round(float(v), 6) for k, v in metrics.items()}


def _reflection_summary(asked: int, rows: list[ReflectionRow], rejected: list[ReflectionRejection]) -> dict[str, float]:
    reasons = Counter(r.reason for r in rejected)
    return {"reflections.asked": float(asked), "reflections.kept": float(len(rows)),
            "reflections.kept_on_failed_attempts": float(sum(not r.attempt_correct for r in rows)),
            **{f"reflections.rejected.{reason}": float(reasons[reason]) for reason in REFLECTION_REASONS}}


@task(name="sft_data")
def sft_data(params: Params | None = None, parent_run_id: str | None = None,
             pool: LLMPool | None = None, method: str = SFT_METHOD) -> SFTDataResult:
    """The warm start ``method``'s data. Its agent's options but the system prompt apply to the teacher (the teacher
    writes under the agent's full prompt; ``sft`` trains the student under the method's own).

    - Oracle: ``sft.n_worlds`` training worlds seeded ``seed+1 .. seed+n_worlds`` (never the evaluation world),
      each with its corpus and index under ``worlds/seed-N/``; ``sft.n_oracle`` of their questions become oracle
      episodes (the gold chain followed through the real tools, recorded by the agent).
    - Teacher: the ``teacher`` role runs the agent on ``sft.n_teacher_questions`` training questions (world: those
      the oracle did not take; benchmarks: outputs/data/train.jsonl with the prepared corpus and index),
      ``sft.samples_per_question`` samples each, kept by rejection sampling (:mod:`components.warmstart.rejection`).
      Both honour ``retrieval.scope``.
    - Reflections: for a warm start listed in ``sft.reflection_rows``, the teacher reflects on that many of the
      episodes (kept or not) in the reflection meta-policy's format, and the valid ones become SFT rows
      (:mod:`components.methods.rubricem.warmstart_reflections`).

    Writes outputs/sft_data/ (``sft_data_<name>/`` for ``sft_<name>``): ``trajectories.jsonl`` (kept;
    ``metadata.source`` oracle | teacher), ``rejections.jsonl`` (each with its reason), ``reflections.jsonl`` and
    ``reflection_rejections.jsonl`` (empty unless asked for), ``metrics.json`` (counts only) and ``timings.json``."""
    params = resolve(params)
    # the warm start of a method's own agent (RubricEM's scaffold) takes that method's sft/agent blocks
    params = with_method_settings(params, method_section(agent_method(params.methods[method].agent)))
    s = params.sft
    started = time.perf_counter()
    folder = run_spec(params).warm_start_folder("sft_data", method)
    folder.mkdir(parents=True, exist_ok=True)
    spec = params.methods[method]
    agent, options = spec.agent, {k: v for k, v in spec.options.items() if k != "system_prompt"}
    from_world = params.data.source == "world"
    teacher_from_worlds = s.n_teacher_questions if from_world else 0
    if (s.n_oracle or teacher_from_worlds) and s.n_worlds == 0:
        raise ValueError("sft.n_worlds is 0 but sft.n_oracle or (world source) sft.n_teacher_questions asks "
                         "for training-world questions; set sft.n_worlds >= 1")

    eval_titles = {d.title for d in read_jsonl(out_path(params.run, "data", "corpus.jsonl"), Document)}
    embedder = make_embedder(params.retrieval)
    per_world = math.ceil((s.n_oracle + teacher_from_worlds) / max(s.n_worlds, 1))
    world_tools = toolbox_options(params.retrieval, params.agent.observation_max_chars)
    worlds = [
        build_training_world(seed, params.world, per_world + per_world // 2 + 10, folder / "worlds" / f"seed-{seed}",
                             lambda docs, path: build_from_params(params.retrieval, docs, path, embedder), eval_titles,
                             world_tools)
        for seed in (training_seeds(params.seed, s.n_worlds) if per_world else [])
    ]

    oracle, oracle_failures = asyncio.run(oracle_episodes(worlds, s.n_oracle, params.agent, agent, options)) if s.n_oracle else ([], Counter())
    n_oracle_tried = len(oracle) + sum(oracle_failures.values())
    if from_world:
        used = {q.id for _, q in oracle}
        rest = [[(q, w.toolbox) for q in w.questions if q.id not in used] for w in worlds]
        items = [pair for row in zip(*rest) for pair in row][: s.n_teacher_questions] if rest else []
    else:
        train = read_jsonl(out_path(params.run, "data", "train.jsonl"), Question)[: s.n_teacher_questions]
        toolbox = run_toolbox(params) if train else None
        items = [(q, toolbox) for q in train]

    teacher: list[tuple[Trajectory, Question]] = []
    reflections: list[ReflectionRow] = []
    reflection_rejections: list[ReflectionRejection] = []
    n_reflections = s.reflection_rows.get(method, 0)
    llm_metrics: dict = {}
    if items or n_reflections:
        own_pool = pool is None
        pool = pool or LLMPool(params, record_path=record_path(params.run, run_spec(params).warm_start_folder("sft_data", method).name))
        try:
            if items:
                with tqdm(total=len(items) * s.samples_per_question, desc="sft_data teacher") as bar:
                    teacher = asyncio.run(teacher_episodes(
                        pool.role("teacher"), items, params.agent, samples=s.samples_per_question,
                        temperature=s.teacher_temperature, seed=params.seed, name=params.llm.roles["teacher"],
                        concurrency=params.llm.middleware.max_concurrency, progress=bar, agent=agent, options=options))
            for traj, q in teacher:
                traj.metadata.update(question_type=q.type, answers=q.answers,
                                     **({"world_seed": q.metadata["world_seed"]} if "world_seed" in q.metadata else {}))
            if n_reflections:
                attempts = [(t, q, "oracle") for t, q in oracle] + [(t, q, "teacher") for t, q in teacher]
                with tqdm(total=min(n_reflections, len(attempts)), desc="sft_data reflections") as bar:
                    reflections, reflection_rejections = asyncio.run(teacher_reflections(
                        pool.role("teacher"), attempts, n=n_reflections, samples=s.samples_per_question,
                        temperature=s.teacher_temperature, seed=params.seed,
                        max_tokens=params.rubricem.reflection_max_tokens,
                        observation_chars=params.rubricem.reflection_observation_chars, progress=bar))
            llm_metrics = pool.accounting.metrics()
        finally:
            if own_pool:
                pool.close()

    kept_oracle, rejected_oracle = select([(t, q, "oracle") for t, q in oracle], s.min_f1, agent=agent)
    kept_teacher, rejected_teacher = select([(t, q, "teacher") for t, q in teacher], s.min_f1, kept_before=kept_oracle,
                                            agent=agent)
    kept, rejections = kept_oracle + kept_teacher, rejected_oracle + rejected_teacher
    traj_path, rej_path = folder / "trajectories.jsonl", folder / "rejections.jsonl"
    write_trajectories(traj_path, kept)
    write_jsonl(rej_path, [r.model_copy(update={"trajectory": r.trajectory.without_timings()}) for r in rejections])
    write_jsonl(folder / REFLECTIONS_FILE, reflections)
    write_jsonl(folder / "reflection_rejections.jsonl", reflection_rejections)
    metrics = _summary(kept, rejections, oracle_failures, worlds, n_oracle_tried, len(items), len(teacher))
    metrics.update(_reflection_summary(n_reflections, reflections, reflection_rejections))
    write_json(folder / "metrics.json", metrics)
    timings = {"wall_s": time.perf_counter() - started,
               "teacher_s_per_episode": sum(t.wall_s for t, _ in teacher) / len(teacher) if teacher else 0.0}
    write_json(folder / "timings.json", timings)
    keep_record(params.run, folder.name)
    with tracking(params, folder.name, parent_run_id) as tracker:
        tracker.log_params({"sft": s.model_dump(), "retrieval": params.retrieval.model_dump(), "method": method,
                            "teacher": params.llm.roles.get("teacher"), "seed": params.seed})
        tracker.log_metrics({**metrics, **timings, **llm_metrics})
        tracker.log_artifact(traj_path)
        tracker.log_artifact(rej_path)
    return SFTDataResult(trajectories=str(traj_path), rejections=str(rej_path), metrics=metrics)


def main() -> None:
    parser = stage_argparser(__doc__)
    parser.add_argument("--method", default=SFT_METHOD, help="the warm start (params.methods entry): sft or sft_<name>")
    args = parser.parse_args()
    result = sft_data.fn(params_from_args(args), method=args.method)
    print(result.model_dump_json(indent=2))


if __name__ == "__main__":
    from tasks.runtime import run_stage

    run_stage(main)
