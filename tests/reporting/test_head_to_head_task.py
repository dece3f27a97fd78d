"""The head_to_head stage logs to MLflow: a `head_to_head` run (under the flow's parent run when given) with the
files and the table, a child run `head_to_head@<method>` per row tagged with its kind, scope, seeds and baseline;
it writes the results under run.out_dir/head_to_head/ and the dated document from them."""

from __future__ import annotations

import json

import mlflow
import pytest

from components.params_load import load_params
from components.reporting.compare import seed_dir
from tasks.head_to_head import head_to_head, role_prices
from tasks.runtime import tracking
from tests.reporting.helpers import make_run, write_evaluation


@pytest.fixture
def params(repo_root, tmp_path, monkeypatch):
    monkeypatch.setenv("RUBRICFLOW_MLFLOW", "1")
    monkeypatch.chdir(tmp_path)
    p = load_params(repo_root / "params.yaml", overrides=[
        f"run.out_dir={tmp_path / 'out'}", f"run.mlflow_tracking_uri=sqlite:///{tmp_path / 'mlflow.db'}",
        f"run.mlflow_artifact_root={tmp_path / 'mlruns'}", "run.experiment=test", "seed=1234",
    ])
    out = tmp_path / "out"
    (out / "data").mkdir(parents=True)
    (out / "data" / "summary.json").write_text(json.dumps({"source": "world"}))
    write_evaluation(out / "eval" / "sft", [1, 0, 1, 0])
    write_evaluation(seed_dir(out / "sweep", 2) / "eval" / "sft", [1, 1, 1, 0])
    write_evaluation(out / "eval" / "coreact", [1, 1, 1, 1])
    write_evaluation(out / "eval" / "grpo", [0, 0, 1, 0])
    write_evaluation(out / "eval" / "arbor", [0, 1, 1, 0])
    make_run(out / "train" / "arbor", [0.1, 0.2], wall_s=50.0)
    return p


def runs_by_stage(params):
    mlflow.set_tracking_uri(params.run.mlflow_tracking_uri)
    runs = mlflow.search_runs(experiment_names=["test"])
    return {stage: runs[runs["tags.stage"] == stage] for stage in set(runs["tags.stage"])}


def test_one_parent_run_with_the_files_and_a_child_run_per_method(params, tmp_path):
    doc = tmp_path / "docs" / "results" / "head_to_head.md"
    with tracking(params, "pipeline") as pipeline:
        result = head_to_head.fn(params, parent_run_id=pipeline.run_id, doc_path=str(doc))
    runs = runs_by_stage(params)
    assert set(runs) == {"pipeline", "head_to_head", *(f"head_to_head@{m}" for m in ("sft", "coreact", "grpo", "arbor"))}
    parent = runs["head_to_head"].iloc[0]
    assert parent["tags.mlflow.parentRunId"] == pipeline.run_id
    assert parent["metrics.coreact.em"] == pytest.approx(1.0) and parent["metrics.sft.seeds"] == 2
    arbor = runs["head_to_head@arbor"].iloc[0]
    assert arbor["tags.mlflow.parentRunId"] == parent["run_id"]
    assert arbor["tags.kind"] == "trained" and arbor["tags.baseline"] == "grpo" and arbor["tags.scope"] == "world"
    assert arbor["metrics.em"] == pytest.approx(0.5) and arbor["metrics.em.diff"] == pytest.approx(0.25)
    assert arbor["metrics.train.wall_s"] == pytest.approx(50.0)
    sft = runs["head_to_head@sft"].iloc[0]
    assert sft["tags.seeds"] == "2" and sft["tags.baseline"] == "none" and sft["tags.kind"] == "inference"
    assert sft["metrics.em"] == pytest.approx((0.5 + 0.75) / 2)
    files = {f.path for f in mlflow.MlflowClient().list_artifacts(parent["run_id"], "head_to_head")}
    assert files == {f"head_to_head/{n}" for n in ("head_to_head.json", "head_to_head.csv", "head_to_head.md",
                                                   "head_to_head.png", "table.json", "document")}
    out = tmp_path / "out" / "head_to_head"
    assert result.files["csv"] == str(out / "head_to_head.csv") and result.files["document"] == str(doc)
    text = doc.read_text()
    assert text.startswith("# Head-to-head") and "`python -m tasks.head_to_head`" in text and " UTC" in text
    assert "4 methods (2 inference-time, 2 trained) · 4 questions · 1–2 seeds per method (labels: 2, 1234)" in text
    assert (out / "head_to_head.md").read_text() in text
    # its figures committed beside it: the report's JSON, named on the page
    assert result.files["figures"] == str(doc.with_suffix(".json")) and "[`head_to_head.json`](head_to_head.json)" in text
    assert json.loads(doc.with_suffix(".json").read_text()) == json.loads((out / "head_to_head.json").read_text())
    assert result.metrics["coreact"]["em.diff"] == pytest.approx(1.0 - (0.5 + 0.75) / 2)


def test_several_out_dirs_are_one_section_each(params, tmp_path, monkeypatch):
    monkeypatch.setenv("RUBRICFLOW_MLFLOW", "0")
    other = tmp_path / "hotpot"
    (other / "data").mkdir(parents=True)
    (other / "data" / "summary.json").write_text(json.dumps({"source": "hotpotqa"}))
    write_evaluation(other / "eval" / "sft", [0, 0, 1])
    result = head_to_head.fn(params, out_dirs=[params.run.out_dir, str(other)], doc_path=None)
    assert "hotpotqa/sft" in result.metrics and "world/coreact" in result.metrics
    assert "## world" in result.markdown and "## hotpotqa" in result.markdown
    assert "document" not in result.files


def test_prices_follow_each_methods_backends(params):
    priced = params.model_copy(deep=True)
    priced.llm.backends["embedded-0_5b-sft"].price_prompt_per_1k = 1.0
    assert role_prices(priced, "sft", [])["policy"] == (1.0, 0.0)
    assert role_prices(priced, "react", [])["policy"] == (0.0, 0.0)
    assert role_prices(priced, "grpo", ["grpo"])["policy"] == (1.0, 0.0)  # served as its warm start's backend


def test_the_trained_components_of_a_method_are_the_adapters_of_its_non_policy_roles(params):
    from tasks.head_to_head import trained_components

    assert trained_components(params, "coreact") == ["train_rubric_generator/listwise"]
    assert trained_components(params, "coreact_pairwise") == ["train_rubric_generator/pairwise"]
    assert trained_components(params, "self_refine_rubric") == ["train_rubric_generator/listwise"]
    for method in ("react", "sft", "coreact_untrained", "self_refine", "grpo"):  # the warm start is the policy's
        assert trained_components(params, method) == []


def test_coreact_s_row_carries_its_generator_s_training_compute_and_health(params, tmp_path):
    run = tmp_path / "out" / "train_rubric_generator" / "listwise"
    make_run(run, [0.1, 0.2], wall_s=90.0)
    (run / "metrics.json").write_text(json.dumps({"points_held_out": 2.0,
                                                  "heldout_after.spearman_with_unparsed": 0.25}))
    result = head_to_head.fn(params, doc_path=None)
    assert result.metrics["coreact"]["train.wall_s"] == 90.0
    assert result.metrics["coreact"]["health.held-out points"] == 2.0
    assert result.metrics["coreact"]["health.held-out rho after (greedy)"] == 0.25
    assert "train.wall_s" not in result.metrics["sft"]
    assert "held-out rho after (greedy) 0.25" in result.markdown


def test_the_command_line_writes_the_results_page_it_is_given(params, tmp_path, monkeypatch, repo_root, capsys):
    import sys

    from tasks.head_to_head import DOC_PATH, main

    monkeypatch.setenv("RUBRICFLOW_MLFLOW", "0")
    page = tmp_path / "docs" / "page.md"
    monkeypatch.setattr(sys, "argv", ["head_to_head", "--params", str(repo_root / "params.yaml"),
                                      "--set", f"run.out_dir={tmp_path / 'out'}", "--set", "seed=1234",
                                      "--doc", str(page)])
    main()
    text = page.read_text()
    assert text.startswith("# Head-to-head") and f"--doc {page}" in text and "| coreact |" in text
    assert not (tmp_path / DOC_PATH).exists()  # the default page is left alone
