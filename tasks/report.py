"""Stage `report`: compare a sweep's training runs (components/reporting/compare.py) and log the comparison.

    python -m tasks.report                         # the runs under <run.out_dir>/<sweep.out_dir>/seed_*/train/*
    python -m tasks.report --sweep-dir outputs/sweep

Writes comparison.csv, comparison.md, runs.csv and comparison.png into the sweep's folder. In MLflow, the
files go to the sweep's parent run (``parent_run_id``; a new `report` run otherwise) under comparison/, the
table also as an MLflow table, the parent gets ``<variant>.<metric>`` metrics, and each variant gets a child
run `report@<variant>` tagged ``variant`` with its mean metrics over seeds: select those runs and Compare in
the MLflow UI. Inside a Prefect run the table is also a Prefect table artifact (key ``sweep-comparison``).
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import pandas as pd
from prefect import task
from pydantic import BaseModel

from components.params import Params
from components.reporting.compare import discover_runs, display_table, write_report
from tasks.runtime import MlflowTracker, params_from_args, resolve, run_stage, stage_argparser, tracking


class ReportResult(BaseModel):
    files: dict[str, str]  # comparison_csv, comparison_md, runs_csv, plot
    metrics: dict[str, dict[str, float]]  # variant -> mean metrics over its seeds
    markdown: str


def sweep_dir(params: Params) -> Path:
    return Path(params.run.out_dir) / params.sweep.out_dir


@contextlib.contextmanager
def _report_run(params: Params, parent_run_id: str | None):
    """The sweep's parent run when given (the report's files belong to it), else a new `report` run."""
    if parent_run_id is None or os.environ.get("RUBRICFLOW_MLFLOW", "1") == "0":
        with tracking(params, "report") as tracker:
            yield tracker
        return
    import mlflow

    mlflow.set_tracking_uri(params.run.mlflow_tracking_uri)
    yield MlflowTracker(mlflow, mlflow.get_run(parent_run_id))


def _prefect_table(display: pd.DataFrame) -> None:
    from prefect.artifacts import create_table_artifact
    from prefect.context import FlowRunContext, TaskRunContext

    if TaskRunContext.get() or FlowRunContext.get():  # outside a run there is nothing to attach it to
        create_table_artifact(display.reset_index().to_dict("records"), key="sweep-comparison",
                              description="Ablation sweep: mean ± sd over seeds per variant")


@task(name="report")
def report(params: Params | None = None, runs: dict[str, list[str]] | None = None, out_dir: str | None = None,
           parent_run_id: str | None = None) -> ReportResult:
    """Compare ``runs`` (variant -> run folders, one per seed; default: every finished run in the sweep's
    folder) into ``out_dir`` (default: the sweep's folder)."""
    params = resolve(params)
    folder = Path(out_dir) if out_dir else sweep_dir(params)
    result = write_report(runs if runs is not None else discover_runs(folder), folder, params.sweep.final_steps)
    means = {str(variant): {k: float(v) for k, v in row.items() if k != "seeds" and not k.endswith(".sd")
                            and pd.notna(v)}
             for variant, row in result.table.iterrows()}
    with _report_run(params, parent_run_id) as parent:
        for path in result.paths.values():
            parent.log_artifact(path, artifact_path="comparison")
        parent.log_table(result.table.reset_index(), artifact_file="comparison/comparison.json")
        parent.log_metrics({f"{variant}.{k}": v for variant, m in means.items() for k, v in m.items()})
        for variant, m in means.items():
            seeds = int(result.table.loc[variant, "seeds"])
            with tracking(params, f"report@{variant}", parent.run_id,
                          tags={"variant": variant, "method": variant, "seeds": str(seeds)}) as child:
                child.log_metrics(m)
    _prefect_table(display_table(result.table))
    return ReportResult(files={k: str(v) for k, v in result.paths.items()}, metrics=means, markdown=result.markdown)


def main() -> None:
    parser = stage_argparser(__doc__)
    parser.add_argument("--sweep-dir", default=None, help="the sweep's folder (default: run.out_dir/sweep.out_dir)")
    args = parser.parse_args()
    print(report.fn(params_from_args(args), out_dir=args.sweep_dir).markdown)


if __name__ == "__main__":
    run_stage(main)
