"""One DAG: flows/pipeline.py and dvc.yaml run the same stages with the same dependency edges.

DVC names a `foreach` stage's instances `evaluate@react` and derives an edge wherever a stage's dep is
another stage's out; its own graph (what `dvc repro` walks) is compared with the flow's ``STAGES``, and the
flow body is checked to follow ``STAGES`` (order and wait_for) with stub tasks."""

from __future__ import annotations

from types import SimpleNamespace

from prefect import Task

from components.params import load_params
from flows import pipeline as pipeline_module


def dvc_dag(repo_root) -> dict[str, set[str]]:
    """Stage name -> the stages it depends on, as DVC builds them from dvc.yaml (without running)."""
    from dvc.repo import Repo

    with Repo(str(repo_root)) as repo:
        graph = repo.index.graph  # an edge points from a stage to a stage whose output it reads
        return {stage.addressing: {dep.addressing for dep in graph.successors(stage)} for stage in graph.nodes}


def test_flow_stages_and_edges_are_dvc_yamls(repo_root):
    dvc = dvc_dag(repo_root)
    assert "evaluate@react" in dvc  # foreach names expanded as DVC does
    flow = {name: set(deps) for name, deps in pipeline_module.STAGES.items()}
    assert flow == dvc
    # every evaluated method is one `evaluate --method NAME` knows
    assert set(pipeline_module.METHODS) <= set(load_params(repo_root / "params.yaml").methods)


def test_flow_body_follows_stages(repo_root, monkeypatch):
    monkeypatch.setenv("RUBRICFLOW_MLFLOW", "0")
    calls: list[tuple[str, list]] = []

    def stub(stage):
        def run(params, parent_run_id=None, wait_for=(), method=None, **_):
            name = f"{stage}@{method}" if method else stage
            calls.append((name, list(wait_for)))
            return SimpleNamespace(name=name, metrics={"score": float(len(calls))})
        return run

    tasks = {name: obj for name, obj in vars(pipeline_module).items() if isinstance(obj, Task)}
    assert {"prepare", "index", "evaluate", "collect"} <= set(tasks)
    for name, task in tasks.items():  # every stage the flow can call records its call instead of running
        monkeypatch.setattr(pipeline_module, name, stub(task.name))
    metrics = pipeline_module.pipeline.fn(load_params(repo_root / "params.yaml"))

    order = [name for name, _ in calls]
    assert sorted(order) == sorted(pipeline_module.STAGES)  # every stage once
    for name, waited in calls:
        deps = pipeline_module.STAGES[name]
        assert [r.name for r in waited] == deps  # waits on exactly its upstream stages' results
        assert all(order.index(d) < order.index(name) for d in deps)
    expected = {f"{m}.score": float(order.index(f"evaluate@{m}") + 1) for m in pipeline_module.METHODS}
    assert metrics == {**expected, "collect.score": float(order.index("collect") + 1)}
