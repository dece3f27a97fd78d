"""The whole pipeline as a Prefect flow, the same DAG as `dvc.yaml`, both derived from the method specs
(components/dag.py; tests/test_dag.py holds them equal):
prepare -> index -> evaluate@<method>, collect -> train_rubric_generator@{listwise,pairwise}, and the warm
start sft_data -> sft -> train_policy@<variant> (RubricEM's variants: sft_data_scaffold -> sft_scaffold) ->
evaluate@<variant> (the trained policy on the test harness), and head_to_head over every evaluation. Like
`dvc repro <targets>`, it runs the given stages and everything they depend on, once each, in dependency order;
the default targets are the main job (evaluate@react, evaluate@sft, and the warm start), which ends with head_to_head over
the evaluations it ran (the table `dvc repro -s head_to_head` writes from what exists).

    python -m flows.pipeline                          # the main job on the embedded default, offline, CPU
    python -m flows.pipeline --targets train_policy@arbor evaluate@coreact
    python -m flows.pipeline --targets train_policy   # a stage group: every variant, as dvc repro takes it
    python -m flows.pipeline --targets evaluate@arbor # train_policy@arbor, then its policy on the test questions
    python -m flows.pipeline --targets head_to_head   # every stage, then one table of every method
    python -m flows.pipeline --set data.source=hotpotqa --set run.out_dir=outputs/hotpotqa

The flow calls the same @task functions that `dvc repro` runs as `python -m tasks.<stage>`; one MLflow
parent run groups the stage runs. Prefect runs in ephemeral mode (no server needed). ``STAGES`` below is
the DAG, named as DVC names stages: each stage waits on the stages it depends on.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from graphlib import TopologicalSorter
from typing import Any

from prefect import flow

from components import dag
from components.params import Params
from tasks.collect import collect
from tasks.evaluate import evaluate
from tasks.head_to_head import head_to_head
from tasks.index import index
from tasks.prepare import prepare
from tasks.runtime import params_from_args, resolve, run_stage, stage_argparser, tracking
from tasks.sft import sft
from tasks.sft_data import sft_data
from tasks.train_policy import train_policy
from tasks.train_rubric_generator import train_rubric_generator

_RESOLVED = dag.resolve(dag.pipeline_stages())

METHODS: list[str] = dag.evaluated_methods()
"""The params.methods entries `evaluate@<method>` runs: react, sft, then each method spec's evaluations."""

VARIANTS: list[str] = dag.training_variants()
"""`train_policy@<variant>`: the shared variants (grpo, dapo), then each method spec's variants and matched
baselines (grpo_arbor, dapo_arbor, scaffold_grpo, grpo_arco among them)."""

SCAFFOLD_VARIANTS = {v for v in VARIANTS if dag.variant_warm_start(v) == "sft_scaffold"}
"""Variants that roll out RubricEM's scaffold agent, so start from its warm start (``train_policy.warm_start``)."""

DEFAULT_TARGETS = ["evaluate@react", "evaluate@sft"]
"""The main job: what `python -m flows.pipeline` runs without --targets: the warm start and the untrained policy on the
test harness, then their head-to-head table. ``collect`` (Co-ReAct's branching points, 18 minutes on 2 cores) is not
in it: only train_rubric_generator reads it, so `--targets evaluate@coreact` runs it."""

STAGES: dict[str, list[str]] = dag.edges(_RESOLVED)
"""Stage -> the stages whose outputs it reads, derived as DVC derives its edges from dvc.yaml's deps and outs
(components/dag.py: the same stages dvc.yaml is written from)."""

UNREPORTED = {name for name, stage in _RESOLVED.items() if stage.task in ("prepare", "index", "sft_data", "sft",
                                                                           "head_to_head")}
"""Stages whose metrics stay in their own MLflow runs only (the flow's result never carried them; head_to_head's
table is in its own run, with a child run per method)."""


def select(targets: Iterable[str] | None = None) -> list[str]:
    """The stages ``targets`` need, in the order the flow runs them: the targets and all their upstream stages,
    each once. A target is a stage name or, as for `dvc repro`, a `foreach` group (``train_policy``: every
    variant). Raises ValueError naming the known stages for a target that is neither."""
    wanted: list[str] = []
    unknown: list[str] = []
    for target in DEFAULT_TARGETS if targets is None else targets:
        group = [name for name in STAGES if name.startswith(f"{target}@")]
        if target in STAGES:
            wanted.append(target)
        elif group:
            wanted.extend(group)
        else:
            unknown.append(target)
    if unknown:
        raise ValueError(f"unknown stage(s) {', '.join(map(repr, unknown))}; known stages: {', '.join(STAGES)} "
                         f"(or a group: {', '.join(sorted({n.split('@')[0] for n in STAGES if '@' in n}))})")
    needed: set[str] = set()
    todo = list(wanted)
    while todo:
        name = todo.pop()
        if name not in needed:
            needed.add(name)
            todo.extend(STAGES[name])
    # a subgraph in STAGES' own order, so the main job runs in the order it always has
    return list(TopologicalSorter({n: STAGES[n] for n in STAGES if n in needed}).static_order())


def metric_prefix(stage: str) -> str | None:
    """The prefix of a stage's metrics in the flow's result: the method for evaluate@<method> (``react.f1``),
    else the stage name (``collect.kept``, ``train_policy@arbor.reward``); None for ``UNREPORTED`` stages."""
    if stage in UNREPORTED:
        return None
    return stage.removeprefix("evaluate@")


def _runners(params: Params, parent_run_id: str | None) -> dict[str, Callable[[list[Any]], Any]]:
    """Stage name -> a call of its task (``python -m tasks.<task> --<arg> <value>``: the task with those keyword
    arguments) that waits for the given upstream results."""
    tasks = {"prepare": prepare, "index": index, "evaluate": evaluate, "collect": collect, "sft_data": sft_data,
             "sft": sft, "train_rubric_generator": train_rubric_generator, "train_policy": train_policy,
             "head_to_head": head_to_head}
    return {name: lambda wait, stage=stage: tasks[stage.task](params, **stage.args, parent_run_id=parent_run_id,
                                                               wait_for=wait)
            for name, stage in _RESOLVED.items()}


@flow(name="rubricflow-pipeline", log_prints=True)
def pipeline(params: Params | None = None, targets: list[str] | None = None) -> dict[str, float]:
    """Run ``targets`` (default ``DEFAULT_TARGETS``) and every stage they depend on, once each; returns their
    metrics, prefixed as ``metric_prefix`` says (``react.f1``, ``collect.kept``, ``train_policy@arbor.reward``)."""
    order = select(targets)
    params = resolve(params)
    metrics: dict[str, float] = {}
    with tracking(params, "pipeline") as parent:
        runners = _runners(params, parent.run_id)
        results: dict[str, Any] = {}
        for name in order:
            results[name] = runners[name]([results[d] for d in STAGES[name]])
        if targets is None and "head_to_head" not in results:  # the main job ends with the table of what it evaluated
            results["head_to_head"] = runners["head_to_head"]([results[n] for n in order if n.startswith("evaluate@")])
        for name in order:
            if (prefix := metric_prefix(name)) is not None:
                metrics.update({f"{prefix}.{k}": v for k, v in results[name].metrics.items()})
        parent.log_metrics(metrics)
    return metrics


def main() -> None:
    parser = stage_argparser(__doc__)
    parser.add_argument("--targets", nargs="+", default=None, metavar="STAGE",
                        help=f"stages to run with their upstream stages (default: {' '.join(DEFAULT_TARGETS)})")
    args = parser.parse_args()
    try:
        select(args.targets)
    except ValueError as exc:
        parser.error(str(exc))
    print(json.dumps(pipeline(params_from_args(args), targets=args.targets), indent=2))


if __name__ == "__main__":
    run_stage(main)
