"""The whole pipeline as a Prefect flow: prepare -> index -> evaluate@react, collect (Co-ReAct's
branching points), and the warm start sft_data -> sft -> evaluate@sft, the same DAG as `dvc.yaml` (tests/test_dag.py
holds them equal).

    python -m flows.pipeline                          # the embedded default, offline, CPU
    python -m flows.pipeline --set data.source=hotpotqa --set run.out_dir=outputs/hotpotqa

The flow calls the same @task functions that `dvc repro` runs as `python -m tasks.<stage>`; one MLflow
parent run groups the stage runs. Prefect runs in ephemeral mode (no server needed). ``STAGES`` below is
the DAG, named as DVC names stages: the flow runs its stages in that dependency order, each waiting on
the stages it depends on.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from graphlib import TopologicalSorter
from typing import Any

from prefect import flow

from components.params import Params
from tasks.collect import collect
from tasks.evaluate import evaluate
from tasks.index import index
from tasks.prepare import prepare
from tasks.runtime import params_from_args, resolve, run_stage, stage_argparser, tracking
from tasks.sft import sft
from tasks.sft_data import sft_data

METHODS = ["react", "sft"]
"""Agents evaluated by `evaluate@<method>` (dvc.yaml's `foreach` lists the same names)."""

STAGES: dict[str, list[str]] = {
    "prepare": [],
    "index": ["prepare"],
    "evaluate@react": ["prepare", "index"],
    "collect": ["prepare", "index"],
    "sft_data": ["prepare", "index"],
    "sft": ["sft_data"],
    "evaluate@sft": ["prepare", "index", "sft"],
}
"""Stage -> the stages whose outputs it reads (the edges DVC derives from dvc.yaml's deps and outs)."""


def _runners(params: Params, parent_run_id: str | None) -> dict[str, Callable[[list[Any]], Any]]:
    """Stage name -> a call of its task that waits for the given upstream results."""
    runners: dict[str, Callable[[list[Any]], Any]] = {
        "prepare": lambda wait: prepare(params, parent_run_id=parent_run_id, wait_for=wait),
        "index": lambda wait: index(params, parent_run_id=parent_run_id, wait_for=wait),
        "collect": lambda wait: collect(params, parent_run_id=parent_run_id, wait_for=wait),
        "sft_data": lambda wait: sft_data(params, parent_run_id=parent_run_id, wait_for=wait),
        "sft": lambda wait: sft(params, parent_run_id=parent_run_id, wait_for=wait),
    }
    for m in METHODS:
        runners[f"evaluate@{m}"] = lambda wait, m=m: evaluate(params, method=m, parent_run_id=parent_run_id,
                                                              wait_for=wait)
    return runners


@flow(name="rubricflow-pipeline", log_prints=True)
def pipeline(params: Params | None = None) -> dict[str, float]:
    """Run every stage of ``STAGES`` once; returns the evaluation and collection metrics, prefixed by
    method (``react.f1``) or stage (``collect.kept``)."""
    params = resolve(params)
    metrics: dict[str, float] = {}
    with tracking(params, "pipeline") as parent:
        runners = _runners(params, parent.run_id)
        results: dict[str, Any] = {}
        for name in TopologicalSorter(STAGES).static_order():
            results[name] = runners[name]([results[d] for d in STAGES[name]])
        for m in METHODS:
            metrics.update({f"{m}.{k}": v for k, v in results[f"evaluate@{m}"].metrics.items()})
        metrics.update({f"collect.{k}": v for k, v in results["collect"].metrics.items()})
        parent.log_metrics(metrics)
    return metrics


def main() -> None:
    args = stage_argparser(__doc__).parse_args()
    print(json.dumps(pipeline(params_from_args(args)), indent=2))


if __name__ == "__main__":
    run_stage(main)
