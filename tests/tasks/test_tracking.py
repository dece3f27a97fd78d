"""Stage runs are recorded in MLflow (SQLite store, artifacts under the configured root), nested under
the parent run they are given."""

import mlflow
import pytest

from components.params_load import load_params
from tasks.prepare import prepare
from tasks.runtime import tracking


@pytest.fixture
def params(repo_root, tmp_path, monkeypatch):
    monkeypatch.setenv("RUBRICFLOW_MLFLOW", "1")
    monkeypatch.chdir(tmp_path)
    return load_params(repo_root / "params.yaml", overrides=[
        f"run.out_dir={tmp_path / 'out'}", f"run.mlflow_tracking_uri=sqlite:///{tmp_path / 'mlflow.db'}",
        f"run.mlflow_artifact_root={tmp_path / 'mlruns'}", "run.experiment=test", "data.n_test=3",
        "data.n_dev=1", "data.n_train=2",
    ])


def test_stage_run_is_nested_with_params_and_metrics(params, tmp_path):
    with tracking(params, "pipeline") as parent:
        prepare.fn(params, parent_run_id=parent.run_id)
    mlflow.set_tracking_uri(params.run.mlflow_tracking_uri)
    runs = mlflow.search_runs(experiment_names=["test"])
    assert set(runs["tags.stage"]) == {"pipeline", "prepare"}
    child = runs[runs["tags.stage"] == "prepare"].iloc[0]
    assert child["tags.mlflow.parentRunId"] == parent.run_id
    assert child["params.data.source"] == "world" and child["params.seed"] == str(params.seed)
    assert child["metrics.questions_test"] == 3.0
    assert (runs["status"] == "FINISHED").all()
    assert runs.iloc[0]["artifact_uri"].startswith((tmp_path / "mlruns").as_uri())


def test_a_failing_stage_marks_its_run_failed(params):
    with pytest.raises(RuntimeError), tracking(params, "boom"):
        raise RuntimeError("stage crashed")
    mlflow.set_tracking_uri(params.run.mlflow_tracking_uri)
    runs = mlflow.search_runs(experiment_names=["test"])
    assert list(runs["status"]) == ["FAILED"]


def test_metric_names_are_made_acceptable_to_mlflow(params):
    with tracking(params, "collect") as tracker:
        tracker.log_metrics({"judge_validity.council_judges[0]": 1.0, "llm.council_judges[1].calls": 3})
    mlflow.set_tracking_uri(params.run.mlflow_tracking_uri)
    run = mlflow.search_runs(experiment_names=["test"]).iloc[0]
    assert run["metrics.judge_validity.council_judges_0"] == 1.0
    assert run["metrics.llm.council_judges_1_.calls"] == 3.0
