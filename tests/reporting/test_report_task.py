"""The report task logs the comparison to MLflow: files and the table on the sweep's parent run, one
`report@<variant>` child run per variant tagged with it, holding its mean metrics."""

from __future__ import annotations

import mlflow
import pytest

from components.params_load import load_params
from components.reporting.compare import seed_dir
from tasks.report import report
from tasks.runtime import tracking
from tests.reporting.helpers import dev, make_run


@pytest.fixture
def params(repo_root, tmp_path, monkeypatch):
    monkeypatch.setenv("RUBRICFLOW_MLFLOW", "1")
    monkeypatch.chdir(tmp_path)
    p = load_params(repo_root / "params.yaml", overrides=[
        f"run.out_dir={tmp_path / 'out'}", f"run.mlflow_tracking_uri=sqlite:///{tmp_path / 'mlflow.db'}",
        f"run.mlflow_artifact_root={tmp_path / 'mlruns'}", "run.experiment=test", "sweep.final_steps=1",
    ])
    sweep = tmp_path / "out" / "sweep"
    make_run(seed_dir(sweep, 1) / "train" / "grpo", [0.1, 0.5], final=dev(0.1, 0.3, 0.2, 0.4))
    make_run(seed_dir(sweep, 2) / "train" / "grpo", [0.2, 0.7], final=dev(0.1, 0.5, 0.2, 0.6))
    make_run(seed_dir(sweep, 1) / "train" / "dapo", [0.3, 0.2], final=dev(0.1, 0.2, 0.2, 0.3))
    return p


def runs_by_stage(params):
    mlflow.set_tracking_uri(params.run.mlflow_tracking_uri)
    runs = mlflow.search_runs(experiment_names=["test"])
    return {stage: runs[runs["tags.stage"] == stage] for stage in set(runs["tags.stage"])}


def test_comparison_goes_to_the_parent_run_and_one_child_per_variant(params):
    with tracking(params, "sweep") as parent:
        result = report.fn(params, parent_run_id=parent.run_id)
    runs = runs_by_stage(params)
    assert set(runs) == {"sweep", "report@grpo", "report@dapo"}  # no extra run for the report itself
    sweep = runs["sweep"].iloc[0]
    assert sweep["metrics.grpo.dev_after.em"] == pytest.approx(0.4)
    assert sweep["metrics.dapo.reward_final"] == pytest.approx(0.2)
    files = {f.path for f in mlflow.MlflowClient().list_artifacts(parent.run_id, "comparison")}
    assert files == {f"comparison/{name}" for name in
                     ("comparison.csv", "comparison.md", "runs.csv", "comparison.png", "comparison.json")}
    grpo = runs["report@grpo"].iloc[0]
    assert grpo["tags.variant"] == "grpo" and grpo["tags.seeds"] == "2"
    assert grpo["tags.mlflow.parentRunId"] == parent.run_id
    assert grpo["metrics.dev_after.em"] == pytest.approx(0.4) and grpo["metrics.delta.f1"] == pytest.approx(0.3)
    assert grpo["metrics.reward_final"] == pytest.approx(0.6)
    assert "metrics.dev_after.em.sd" not in runs["report@grpo"].columns  # the spread stays in the table
    assert result.metrics["dapo"]["dev_after.em"] == pytest.approx(0.2)


def test_without_a_parent_the_report_is_its_own_run(params, tmp_path):
    result = report.fn(params)  # discovers the runs in the sweep's folder
    assert result.files["plot"] == str(tmp_path / "out" / "sweep" / "comparison.png")
    runs = runs_by_stage(params)
    assert set(runs) == {"report", "report@grpo", "report@dapo"}
    own = runs["report"].iloc[0]["run_id"]
    assert (runs["report@dapo"]["tags.mlflow.parentRunId"] == own).all()
    assert {f.path for f in mlflow.MlflowClient().list_artifacts(own)} == {"comparison"}


def test_evaluated_methods_get_their_own_table_files_and_child_runs(params, tmp_path):
    from tests.reporting.helpers import make_evaluation

    sweep = tmp_path / "out" / "sweep"
    for seed, em in ((1, 0.2), (2, 0.4)):
        make_evaluation(seed_dir(sweep, seed) / "eval" / "coreact", {"n": 10.0, "em": em, "f1": em, "retry_rate": 0.25})
    with tracking(params, "sweep") as parent:
        result = report.fn(params, parent_run_id=parent.run_id)  # discovers both kinds
    runs = runs_by_stage(params)
    assert set(runs) == {"sweep", "report@grpo", "report@dapo", "report@coreact"}
    coreact = runs["report@coreact"].iloc[0]
    assert coreact["tags.evaluated_method"] == "coreact" and coreact["tags.seeds"] == "2"
    assert coreact["metrics.em"] == pytest.approx(0.3) and coreact["metrics.retry_rate"] == pytest.approx(0.25)
    assert runs["sweep"].iloc[0]["metrics.coreact.em"] == pytest.approx(0.3)
    files = {f.path for f in mlflow.MlflowClient().list_artifacts(parent.run_id, "methods")}
    assert files == {f"methods/{name}" for name in
                     ("methods.csv", "methods.md", "method_runs.csv", "methods.png", "methods.json")}
    assert result.files["methods_plot"] == str(sweep / "methods.png")
    assert result.metrics["grpo"]["dev_after.em"] == pytest.approx(0.4)  # the training comparison is still there
