"""Stage `evaluate@<method>`: run a method's agent on the test questions; score EM, F1, LLM-judge accuracy
and search behaviour; log everything to MLflow.

    python -m tasks.evaluate --method react [--set evaluation.n_questions=10]

The method is an entry of ``params.methods``: an agent from the agent registry
(``components.agents.react.AGENTS``) and the role rebindings it runs with (e.g. the policy served with an
SFT adapter). It may also be a training variant (``--method arbor``): the final policy of
``train_policy@<variant>`` run as its warm start's method with the RL adapter added to the served policy
(:mod:`components.trained_policy`), so trained and inference-time methods share questions, prompts, budgets and
judge.

Reads outputs/data/test.jsonl, outputs/data/corpus.jsonl and outputs/index/. Writes, under
outputs/eval/<method>/: trajectories.jsonl (appended one episode at a time, so a crash loses nothing and
a re-run resumes; a run with different params starts afresh), per_question.csv, metrics.json
(deterministic: identical params give an identical file) and timings.json (wall times, not a DVC metric).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter

import pandas as pd
from prefect import task
from pydantic import BaseModel
from tqdm import tqdm

from components.agents.react import agent_options, build_agent
from components.evaluation.behaviour import behaviour_stats
from components.evaluation.metrics import exact_match, f1_score
from components.io import JsonlAppender, read_jsonl, write_json
from components.judges.answer import judge_answers
from components.judges.call import FAILURE_KINDS, Tally
from components.llm.factory import LLMPool
from components.methods.coreact.guided_metrics import accounting_per_question, guided_metrics
from components.params import Params, for_method
from components.params_cli import params_from_args, stage_argparser
from components.run_files import keep_record, keyed_folder, out_path, record_path, write_trajectories
from components.schemas import Question, Trajectory
from components.trained_policy import with_trained_policy
from tasks.runtime import resolve, run_toolbox, tracking


class EvalResult(BaseModel):
    method: str
    metrics: dict[str, float]
    trajectories: str
    per_question: str


def served_adapters(params: Params) -> dict[str, list[str | None]]:
    """Content digests of the LoRA adapters the bound backends serve, and of a whole model a backend loads from a
    folder (a fully fine-tuned policy, the lab's): a retrained policy at the same path is a different model, so its
    evaluation must not resume the old one's trajectories."""
    from components.adapters import adapter_digest, whole_model_digest

    bound = {b for v in params.llm.roles.values() for b in ([v] if isinstance(v, str) else v)}
    served = {}
    for name in sorted(bound):
        backend = params.llm.backends.get(name)
        adapters = backend.adapters if backend is not None else []
        if adapters:
            served[name] = [adapter_digest(a) for a in adapters]
        elif backend is not None and backend.model and (digest := whole_model_digest(backend.model)):
            served[name] = [digest]
    return served


def run_settings(params: Params, method: str) -> dict:
    """What an evaluation of ``method`` is: its trajectories are resumed only under the same settings and the
    same served adapters (:func:`components.run_files.keyed_folder`). The number of questions is not part of it:
    the run takes the first ``evaluation.n_questions`` of the test split, each seeded by its position, so a run
    extended from 20 questions to 50 keeps the 20 episodes it has and runs the other 30."""
    relevant = {"method": method, "spec": params.methods[method].model_dump(), "seed": params.seed,
                "data": params.data.model_dump(),
                "world": params.world.model_dump(), "retrieval": params.retrieval.model_dump(),
                "agent": params.agent.model_dump(), "llm": params.llm.model_dump()}
    relevant["adapters"] = served_adapters(params)
    options = agent_options(params, params.methods[method])
    if options != params.methods[method].options:  # defaults from params.coreact / rubric_generator
        relevant["options"] = options
    return relevant


def score(questions: list[Question], trajs: list[Trajectory], verdicts: list[bool | None]) -> tuple[pd.DataFrame, dict]:
    rows = []
    for q, t, v in zip(questions, trajs, verdicts):
        pred = t.final_answer or ""
        rows.append({"question_id": q.id, "type": q.type, "prediction": pred, "gold": q.answers[0],
                     "em": exact_match(pred, q.answers), "f1": f1_score(pred, q.answers), "judge": v,
                     "finish_reason": t.finish_reason, **behaviour_stats(t, q)})
    table = pd.DataFrame(rows)
    judged = table["judge"].dropna()
    metrics = {
        "n": float(len(table)), "em": float(table["em"].mean()), "f1": float(table["f1"].mean()),
        "judge_accuracy": float(judged.astype(float).mean()) if len(judged) else float("nan"),
        "judged": float(len(judged)), "judge_failures": float(table["judge"].isna().sum()),
        "tool_calls_per_question": float(table["tool_calls"].mean()),
        "unique_docs_retrieved": float(table["unique_docs_retrieved"].mean()),
        "unique_docs_cited": float(table["unique_docs_cited"].mean()),
        "gold_recall": float(table["gold_recall"].dropna().mean()) if table["gold_recall"].notna().any() else float("nan"),
        "answered_rate": float(table["answered"].mean()),
        "parse_errors_per_question": float(table["parse_errors"].mean()),
    }
    for reason, count in Counter(table["finish_reason"]).items():
        metrics[f"finish.{reason}"] = float(count)
    for qtype, group in table.groupby("type"):
        metrics[f"em.{qtype}"] = float(group["em"].mean())
        metrics[f"f1.{qtype}"] = float(group["f1"].mean())
    return table, {k: round(v, 6) for k, v in metrics.items()}


@task(name="evaluate")
def evaluate(params: Params | None = None, method: str = "react", parent_run_id: str | None = None,
             pool: LLMPool | None = None) -> EvalResult:
    params, spec = for_method(with_trained_policy(resolve(params), method), method)
    questions = read_jsonl(out_path(params.run, "data", "test.jsonl"), Question)[: params.evaluation.n_questions]
    toolbox = run_toolbox(params)
    folder = out_path(params.run, "eval", method, "metrics.json").parent
    traj_path = folder / "trajectories.jsonl"
    settings = run_settings(params, method)

    own_pool = pool is None
    pool = pool or LLMPool(params, record_path=record_path(params.run, f"evaluate@{method}"))
    started = time.perf_counter()
    try:
        agent = build_agent(spec.agent, pool.role, toolbox, params.agent, agent_options(params, spec))
        agent.name = params.llm.roles["policy"]
        # only once the policy's model loaded: a missing or corrupt one must not empty an earlier run's folder
        resumed = keyed_folder(folder, settings)
        done = ({t.question_id: t for t in read_jsonl(traj_path, Trajectory, skip_torn_tail=True)}
                if resumed and traj_path.exists() else {})
        todo = [(i, q) for i, q in enumerate(questions) if q.id not in done]  # i seeds q, resumed or not
        with JsonlAppender(traj_path) as out, tqdm(total=len(questions), initial=len(done), desc=f"evaluate {method}") as bar:
            async def run_all():
                episodes = asyncio.Semaphore(params.evaluation.episode_concurrency or pool.slots("policy"))

                async def one(i: int, q: Question):
                    async with episodes:
                        t = await agent.run(q, seed=params.seed + i)
                    out.append(t)  # written as soon as it exists: a crash keeps finished episodes
                    done[q.id] = t
                    bar.update(1)
                await asyncio.gather(*(one(i, q) for i, q in todo))
            asyncio.run(run_all())
        agent_s = time.perf_counter() - started
        trajs = [done[q.id] for q in questions]
        write_trajectories(traj_path, trajs)  # in question order, whatever order the episodes finished in
        judge_tally = Tally() if params.evaluation.llm_judge else None
        if judge_tally is not None:
            verdicts = asyncio.run(judge_answers(pool.role("answer_judge"), questions, [t.final_answer for t in trajs],
                                                 judge_tally))
        else:
            verdicts = [None] * len(questions)
        llm_metrics = pool.accounting.metrics()
    finally:
        if own_pool:
            pool.close()

    table, metrics = score(questions, trajs, verdicts)
    if judge_tally is not None:  # a failed judgment is counted by its kind: the call failed, or its reply was unreadable
        counts = {"call_failed": judge_tally.failures, "unparsed": judge_tally.unparsed}
        metrics.update({f"judge_failures.{kind}": float(counts[kind]) for kind in FAILURE_KINDS})
    metrics.update(guided_metrics(table, trajs))  # utilisation, verification (retry) rate, cost per role
    table.to_csv(folder / "per_question.csv", index=False)
    write_json(folder / "metrics.json", metrics)
    timings = {"wall_s": time.perf_counter() - started, "agent_s": agent_s,
               "s_per_question": agent_s / max(len(todo), 1), "resumed": len(questions) - len(todo)}
    write_json(folder / "timings.json", timings)
    keep_record(params.run, f"evaluate@{method}")
    with tracking(params, f"evaluate@{method}", parent_run_id, tags={"method": method}) as tracker:
        tracker.log_params({"method": method, "agent_name": spec.agent, "data": params.data.model_dump(), "agent": params.agent.model_dump(),
                            "retrieval": params.retrieval.model_dump(), "policy": params.llm.roles["policy"]})
        tracker.log_metrics({**metrics, **timings, **llm_metrics, **accounting_per_question(llm_metrics, len(todo))})
        tracker.log_artifact(traj_path)
        tracker.log_table(table, "per_question.json")
    return EvalResult(method=method, metrics=metrics, trajectories=str(traj_path), per_question=str(folder / "per_question.csv"))


def main() -> None:
    parser = stage_argparser(__doc__)
    parser.add_argument("--method", default="react",
                        help="a params.methods entry, or a training variant (its train_policy adapter)")
    args = parser.parse_args()
    result = evaluate.fn(params_from_args(args), method=args.method)
    print(json.dumps(result.metrics, indent=2))


if __name__ == "__main__":
    from tasks.runtime import run_stage

    run_stage(main)
