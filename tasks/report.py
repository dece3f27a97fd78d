"""Stage `report`: compare a sweep's training runs (components/reporting/compare.py) and evaluated methods
(components/reporting/methods.py), and log the comparisons.

    python -m tasks.report                         # the runs under <run.out_dir>/<sweep.out_dir>/seed_*/{train,eval}/*
    python -m tasks.report --sweep-dir outputs/sweep

Writes comparison.csv, comparison.md, runs.csv and comparison.png (training variants) and methods.csv,
methods.md, method_runs.csv and methods.png (evaluated methods) into the sweep's folder. In MLflow, the
files go to the sweep's parent run (``parent_run_id``; a new `report` run otherwise) under comparison/ and
methods/, each table also as an MLflow table, the parent gets ``<name>.<metric>`` metrics, and each variant
or method gets a child run `report@<name>` (tagged ``variant`` or ``evaluated_method``) with its mean metrics
over seeds: select those runs and Compare in the MLflow UI. Inside a Prefect run each table is also a Prefect
table artifact (keys ``sweep-comparison`` and ``sweep-methods``).
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import pandas as pd
from prefect import task
from pydantic import BaseModel

from components.params import Params
from components.params_cli import params_from_args, stage_argparser
from components.reporting.compare import discover_runs, display_table, write_report
from components.reporting.methods import write_method_report
from tasks.runtime import MlflowTracker, log_rows, resolve, run_stage, tracking


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


def _prefect_table(display: pd.DataFrame, key: str) -> None:
    from prefect.artifacts import create_table_artifact
    from prefect.context import FlowRunContext, TaskRunContext

    if TaskRunContext.get() or FlowRunContext.get():  # outside a run there is nothing to attach it to
        create_table_artifact(display.reset_index().to_dict("records"), key=key,
                              description="Sweep: mean ± sd over seeds per variant or method")


def _log_comparison(params: Params, parent, result, kind: str) -> dict[str, dict[str, float]]:
    """Log one comparison into the parent run (files under ``kind``/, the table, ``<name>.<metric>``) with a
    child run `report@<name>` per row; returns each row's mean metrics."""
    means = {str(name): {k: float(v) for k, v in row.items() if k != "seeds" and not k.endswith(".sd")
                         and pd.notna(v)}
             for name, row in result.table.iterrows()}
    for path in result.paths.values():
        parent.log_artifact(path, artifact_path=kind)
    parent.log_table(result.table.reset_index(), artifact_file=f"{kind}/{kind}.json")
    tag = "variant" if kind == "comparison" else "evaluated_method"
    log_rows(params, parent, means, "report",
             {name: {tag: name, "method": name, "seeds": str(int(result.table.loc[name, "seeds"]))} for name in means})
    return means


@task(name="report")
def report(params: Params | None = None, runs: dict[str, list[str]] | None = None, out_dir: str | None = None,
           parent_run_id: str | None = None, methods: dict[str, list[str]] | None = None) -> ReportResult:
    """Compare ``runs`` (variant -> training run folders, one per seed) and ``methods`` (method -> evaluation
    folders, one per seed) into ``out_dir`` (default: the sweep's folder). Left out, each is every finished
    run of its kind in that folder."""
    params = resolve(params)
    folder = Path(out_dir) if out_dir else sweep_dir(params)
    runs = runs if runs is not None else discover_runs(folder, stage="train")
    methods = methods if methods is not None else discover_runs(folder, stage="eval")
    if not runs and not methods:
        raise ValueError(f"{folder}: no finished training runs or evaluations to compare")
    results = {}
    if runs:
        results["comparison"] = write_report(runs, folder, params.sweep.final_steps)
    if methods:
        results["methods"] = write_method_report(methods, folder)
    means: dict[str, dict[str, float]] = {}
    with _report_run(params, parent_run_id) as parent:
        for kind, result in results.items():
            means.update(_log_comparison(params, parent, result, kind))
    for kind, result in results.items():
        _prefect_table(display_table(result.table), key=f"sweep-{kind}")
    files = {k: str(v) for result in results.values() for k, v in result.paths.items()}
    return ReportResult(files=files, metrics=means, markdown="\n".join(r.markdown for r in results.values()))


def main() -> None:
    parser = stage_argparser(__doc__)
    parser.add_argument("--sweep-dir", default=None, help="the sweep's folder (default: run.out_dir/sweep.out_dir)")
    args = parser.parse_args()
    print(report.fn(params_from_args(args), out_dir=args.sweep_dir).markdown)


if __name__ == "__main__":
    run_stage(main)
