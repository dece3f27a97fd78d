"""The whole pipeline as a Prefect flow: prepare -> index -> evaluate (ReAct baseline).

    python -m flows.pipeline                          # the embedded default, offline, CPU
    python -m flows.pipeline --set data.source=hotpotqa --set run.out_dir=outputs/hotpotqa

The flow calls the same @task functions that `dvc repro` runs as `python -m tasks.<stage>`; one MLflow
parent run groups the stage runs. Prefect runs in ephemeral mode (no server needed).
"""

from __future__ import annotations

import json

from prefect import flow

from components.params import Params
from tasks.evaluate import evaluate
from tasks.index import index
from tasks.prepare import prepare
from tasks.runtime import params_from_args, resolve, stage_argparser, tracking


@flow(name="rubricflow-pipeline", log_prints=True)
def pipeline(params: Params | None = None) -> dict[str, float]:
    params = resolve(params)
    with tracking(params, "pipeline") as parent:
        prepared = prepare(params, parent_run_id=parent.run_id)
        indexed = index(params, parent_run_id=parent.run_id, wait_for=[prepared])
        result = evaluate(params, method="react", parent_run_id=parent.run_id, wait_for=[indexed])
        parent.log_metrics({f"react.{k}": v for k, v in result.metrics.items()})
    return result.metrics


def main() -> None:
    args = stage_argparser(__doc__).parse_args()
    print(json.dumps(pipeline(params_from_args(args)), indent=2))


if __name__ == "__main__":
    main()
