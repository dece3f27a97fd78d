"""What every stage shares beyond the components: params for a task given None, MLflow tracking, and
``run_stage`` for the ``__main__`` block (a user error exits 2 with one line, not a traceback). The command line
(``--params``/``--profile``/``--overlay``/``--set``) is :mod:`components.params_cli`'s, imported here for the flows.

MLflow tracks to SQLite (``run.mlflow_tracking_uri``) with ``run.mlflow_artifact_root`` as the artifact
root. ``RUBRICFLOW_MLFLOW=0`` swaps in a null tracker that records nothing (for unit tests).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from components.embedded.lora_gguf import LoraConversionError
from components.embedded.models import ModelIntegrityError, ModelPartsMissing
from components.io import RecordError
from components.params import Params
from components.params_cli import PARAMS_PATH, params_from_args, stage_argparser  # noqa: F401 (flows use these)
from components.params_load import load_params
from components.params_section import ParamsError
from components.retrieval.run_index import load_toolbox
from tasks.temporary_servers import reap_orphaned_servers

# Mistakes in what the user gave or pointed at (an override, a params file, an input record, a path that does not
# exist, an embedded model whose file fails its pinned sha256 or whose parts are not installed, an adapter llama.cpp
# cannot take), not bugs in the code: each message already names the file, line and field, or the key.
USER_ERRORS: tuple[type[Exception], ...] = (ParamsError, RecordError, FileNotFoundError, ModelIntegrityError,
                                            ModelPartsMissing, LoraConversionError)


def run_stage(main: Callable[[], object]) -> None:
    """Run a stage's or flow's ``main``; a user error exits with status 2 and one line on stderr, in
    argparse's form (``prepare.py: error: --set grpo.lrr=1: unknown key grpo.lrr``). Anything else
    keeps its traceback. Temporary Prefect servers left by killed runs are stopped first."""
    reaped = reap_orphaned_servers()
    if reaped:
        print(f"stopped {len(reaped)} temporary Prefect server(s) of killed runs: pids {reaped}", file=sys.stderr)
    try:
        main()
    except USER_ERRORS as exc:
        message = " ".join(str(exc).split())
        print(f"{Path(sys.argv[0]).name}: error: {message}", file=sys.stderr)
        raise SystemExit(2) from None


def resolve(params: Params | None) -> Params:
    """A flow or task given None reads params.yaml now."""
    return params if params is not None else load_params(PARAMS_PATH)


def run_toolbox(params: Params):
    """The agent toolbox over the run's built index (:func:`components.retrieval.run_index.load_toolbox`)."""
    return load_toolbox(params.run, params.retrieval, params.agent.observation_max_chars)


def flatten(data: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(data, dict):
        out: dict[str, Any] = {}
        for k, v in data.items():
            out.update(flatten(v, f"{prefix}{k}."))
        return out
    return {prefix.rstrip("."): data}


def mlflow_name(name: str) -> str:
    return re.sub(r"[^0-9A-Za-z_\-./: ]", "_", name).replace("__", "_").rstrip("_") or "_"


class NullTracker:
    run_id = None

    def log_params(self, params: dict) -> None: ...
    def log_metrics(self, metrics: dict, step: int | None = None) -> None: ...
    def log_artifact(self, path: str | Path, artifact_path: str | None = None) -> None: ...
    def log_table(self, data, artifact_file: str) -> None: ...
    def log_figure(self, figure, artifact_file: str) -> None: ...
    def set_tags(self, tags: dict) -> None: ...


class MlflowTracker(NullTracker):
    def __init__(self, mlflow, run):
        self.mlflow, self.run_id = mlflow, run.info.run_id

    def log_params(self, params: dict) -> None:
        flat = {k: (json.dumps(v) if isinstance(v, (list, dict)) else v) for k, v in flatten(params).items()}
        items = list(flat.items())
        for i in range(0, len(items), 100):  # MLflow caps a batch at 100 params
            self.mlflow.log_params(dict(items[i : i + 100]), run_id=self.run_id)

    def log_metrics(self, metrics: dict, step: int | None = None) -> None:
        # MLflow allows only alphanumerics and _-./: in names; role names like council_judges[0] have brackets
        numeric = {mlflow_name(k): float(v) for k, v in metrics.items()
                   if isinstance(v, (int, float)) and not isinstance(v, bool)}
        self.mlflow.log_metrics(numeric, step=step, run_id=self.run_id)

    def log_artifact(self, path, artifact_path=None) -> None:
        log = self.mlflow.log_artifacts if Path(path).is_dir() else self.mlflow.log_artifact
        log(str(path), artifact_path=artifact_path, run_id=self.run_id)

    def log_table(self, data, artifact_file: str) -> None:
        self.mlflow.log_table(data=data, artifact_file=artifact_file, run_id=self.run_id)

    def log_figure(self, figure, artifact_file: str) -> None:
        self.mlflow.log_figure(figure, artifact_file, run_id=self.run_id)

    def set_tags(self, tags: dict) -> None:
        for k, v in tags.items():
            self.mlflow.set_tag(k, v)


@contextlib.contextmanager
def tracking(params: Params, run_name: str, parent_run_id: str | None = None, tags: dict | None = None):
    """An MLflow run for a stage (nested under ``parent_run_id`` when given), or a null tracker."""
    if os.environ.get("RUBRICFLOW_MLFLOW", "1") == "0":
        yield NullTracker()
        return
    import mlflow

    mlflow.set_tracking_uri(params.run.mlflow_tracking_uri)
    experiment = mlflow.get_experiment_by_name(params.run.experiment)
    if experiment is None:
        root = Path(params.run.mlflow_artifact_root).resolve()
        root.mkdir(parents=True, exist_ok=True)
        experiment_id = mlflow.create_experiment(params.run.experiment, artifact_location=root.as_uri())
    else:
        experiment_id = experiment.experiment_id
    run_tags = {"stage": run_name, "profile": params.profile, **(tags or {})}
    if params.overlay:
        run_tags["overlay"] = ",".join(params.overlay)
    if parent_run_id:
        run_tags["mlflow.parentRunId"] = parent_run_id
    client = mlflow.MlflowClient()
    run = client.create_run(experiment_id, run_name=run_name, tags=run_tags)
    tracker = MlflowTracker(mlflow, run)
    status = "FAILED"
    try:
        yield tracker
        status = "FINISHED"
    finally:
        client.set_terminated(run.info.run_id, status=status)


def log_rows(params: Params, parent: NullTracker, rows: dict[str, dict[str, float]], run_prefix: str,
             tags: dict[str, dict[str, str]]) -> None:
    """A comparison's rows in MLflow: ``<name>.<metric>`` on ``parent``, and a child run `<run_prefix>@<name>`
    per row holding its metrics and ``tags[name]``, to select and compare in the MLflow UI."""
    parent.log_metrics({f"{name}.{k}": v for name, m in rows.items() for k, v in m.items()})
    for name, metrics in rows.items():
        with tracking(params, f"{run_prefix}@{name}", parent.run_id, tags=tags.get(name, {})) as child:
            child.log_metrics(metrics)
