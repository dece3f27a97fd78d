"""One DAG: flows/pipeline.py and dvc.yaml run the same stages with the same dependency edges, both derived from
the method specs (components/dag.py), and dvc.yaml is the one `python -m components.dag write-dvc` writes.

DVC names a `foreach` stage's instances `evaluate@react` and derives an edge wherever a stage's dep is
another stage's out; its own graph (what `dvc repro` walks) is compared with the flow's ``STAGES``, the
flow's target selection with the stages `dvc repro <targets>` plans, and the flow body is checked to follow
``STAGES`` (order and wait_for) with stub tasks."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest
from prefect import Task

from components import dag
from components.method_registry import Evaluation, MethodSpec, load_methods
from components.params_load import load_params
from components.run_spec import run_spec
from components.trained_policy import variant_agent
from components.variants import VARIANTS
from flows import pipeline as pipeline_module


def dvc_dag(repo_root) -> dict[str, set[str]]:
    """Stage name -> the stages it depends on, as DVC builds them from dvc.yaml (without running)."""
    from dvc.repo import Repo

    with Repo(str(repo_root)) as repo:
        graph = repo.index.graph  # an edge points from a stage to a stage whose output it reads
        return {stage.addressing: {dep.addressing for dep in graph.successors(stage)} for stage in graph.nodes}


@pytest.fixture(scope="module")
def dvc_plan(repo_root):
    """targets -> the stages `dvc repro <targets>` would consider (the targets and everything upstream),
    without running."""
    from dvc.repo import Repo
    from dvc.repo.reproduce import collect_stages, get_active_graph, plan_repro

    with Repo(str(repo_root)) as repo:
        graph = get_active_graph(repo.index.graph)
        yield lambda targets: {stage.addressing for stage in plan_repro(graph, collect_stages(repo, targets))}


def test_flow_stages_and_edges_are_dvc_yamls(repo_root):
    dvc = dvc_dag(repo_root)
    assert {"evaluate@react", "train_policy@arbor", "train_rubric_generator@listwise"} <= set(dvc)  # foreach names
    flow = {name: set(deps) for name, deps in pipeline_module.STAGES.items()}
    assert flow == dvc
    # every method of params.yaml is evaluated, and every training variant trained
    assert set(pipeline_module.METHODS) == set(load_params(repo_root / "params.yaml").methods)
    load_methods()  # every method registers its variants
    assert set(pipeline_module.VARIANTS) == set(VARIANTS.names())


@pytest.mark.parametrize("targets", [
    ["train_policy@arbor"], ["evaluate@coreact_pairwise"], ["evaluate@react", "collect", "evaluate@sft"],
    ["train_policy"], ["train_rubric_generator@listwise", "train_policy@grpo"],
    ["evaluate@arbor"], ["evaluate@rubricem"], ["evaluate"], ["head_to_head"],
])
def test_target_selection_is_dvc_repros(dvc_plan, targets):
    assert set(pipeline_module.select(targets)) == dvc_plan(targets)


def stub_tasks(monkeypatch) -> list[tuple[str, list]]:
    """Replace every task the flow can call by a stub that records (stage, wait_for) and returns metrics."""
    monkeypatch.setenv("RUBRICFLOW_MLFLOW", "0")
    calls: list[tuple[str, list]] = []

    def stub(stage):
        def run(params, parent_run_id=None, wait_for=(), method=None, variant=None, reward=None, **_):
            item = method or variant or reward
            name = f"{stage}@{item}" if item else stage
            if stage in ("sft_data", "sft") and method:  # warm-start stages are named after their folder
                name = run_spec(params).warm_start_folder(stage, method).name
            calls.append((name, list(wait_for)))
            return SimpleNamespace(name=name, metrics={"score": float(len(calls))})
        return run

    tasks = {name: obj for name, obj in vars(pipeline_module).items() if isinstance(obj, Task)}
    assert {"prepare", "index", "evaluate", "collect", "train_policy", "train_rubric_generator"} <= set(tasks)
    for name, task in tasks.items():  # every stage the flow can call records its call instead of running
        monkeypatch.setattr(pipeline_module, name, stub(task.name))
    return calls


def check_calls(calls: list[tuple[str, list]]) -> list[str]:
    """Each stage called once, after its upstream stages, waiting on exactly their results; the call order."""
    order = [name for name, _ in calls]
    assert len(order) == len(set(order))
    for name, waited in calls:
        deps = pipeline_module.STAGES[name]
        assert [r.name for r in waited] == deps
        assert all(order.index(d) < order.index(name) for d in deps)
    return order


def test_flow_body_follows_stages(repo_root, monkeypatch):
    calls = stub_tasks(monkeypatch)
    params = load_params(repo_root / "params.yaml")
    metrics = pipeline_module.pipeline.fn(params, targets=list(pipeline_module.STAGES))

    order = check_calls(calls)
    assert sorted(order) == sorted(pipeline_module.STAGES)  # every stage once
    score = {name: float(i + 1) for i, name in enumerate(order)}
    expected = {f"{m}.score": score[f"evaluate@{m}"] for m in [*pipeline_module.METHODS, *pipeline_module.VARIANTS]}
    expected |= {f"{s}.score": score[s] for s in order if not s.startswith("evaluate@")
                 and s not in pipeline_module.UNREPORTED}
    assert metrics == expected
    assert "collect.score" in metrics and "train_policy@arbor.score" in metrics and "arbor.score" in metrics
    assert order[-1] == "head_to_head"  # after every evaluation


def test_default_targets_run_the_main_job_with_its_metrics(repo_root, monkeypatch):
    calls = stub_tasks(monkeypatch)
    metrics = pipeline_module.pipeline.fn(load_params(repo_root / "params.yaml"))

    (report, waited), calls = calls[-1], calls[:-1]
    order = check_calls(calls)
    assert set(order) == {"prepare", "index", "evaluate@react", "sft_data", "sft", "evaluate@sft"}
    # it ends with the head-to-head table of the evaluations it ran (not every stage head_to_head depends on)
    assert report == "head_to_head" and [r.name for r in waited] == ["evaluate@react", "evaluate@sft"]
    score = {name: float(i + 1) for i, name in enumerate(order)}
    assert metrics == {"react.score": score["evaluate@react"], "sft.score": score["evaluate@sft"]}


def test_targets_run_exactly_their_upstream_closure(repo_root, monkeypatch):
    calls = stub_tasks(monkeypatch)
    metrics = pipeline_module.pipeline.fn(load_params(repo_root / "params.yaml"), targets=["train_policy@arbor"])

    order = check_calls(calls)
    assert set(order) == {"prepare", "index", "sft_data", "sft", "train_policy@arbor"}
    assert metrics == {"train_policy@arbor.score": float(order.index("train_policy@arbor") + 1)}


def test_a_target_listed_twice_or_reached_twice_runs_once(repo_root, monkeypatch):
    calls = stub_tasks(monkeypatch)
    pipeline_module.pipeline.fn(load_params(repo_root / "params.yaml"),
                                targets=["evaluate@coreact", "evaluate@coreact", "train_rubric_generator"])

    order = check_calls(calls)
    assert set(order) == {"prepare", "index", "collect", "train_rubric_generator@listwise",
                          "train_rubric_generator@pairwise", "sft_data", "sft", "evaluate@coreact"}


def test_unknown_target_is_an_error_naming_the_known_stages(repo_root, monkeypatch):
    calls = stub_tasks(monkeypatch)
    with pytest.raises(ValueError, match="unknown stage.*'train_policy@nope'") as raised:
        pipeline_module.pipeline.fn(load_params(repo_root / "params.yaml"), targets=["collect", "train_policy@nope"])
    assert "train_policy@arbor" in str(raised.value) and "evaluate@react" in str(raised.value)
    assert calls == []  # nothing ran


def dvc_deps(repo_root) -> dict[str, set[str]]:
    """Stage name -> its dependency paths relative to the repository, as DVC reads them from dvc.yaml."""
    from dvc.repo import Repo

    with Repo(str(repo_root)) as repo:
        return {stage.addressing: {str(dep.fs_path).removeprefix(str(repo_root) + "/") for dep in stage.deps}
                for stage in repo.index.stages}


def test_a_method_package_is_a_dependency_of_its_own_stages_only(repo_root):
    """A change to one method's package re-runs that method's stages and no other method's."""
    from components.method_registry import load_methods

    deps = dvc_deps(repo_root)
    packages = {spec.name: f"components/methods/{spec.name}" for spec in load_methods()}
    params = load_params(repo_root / "params.yaml")
    expected: dict[str, set[str]] = {}
    for spec in load_methods():
        for variant in spec.variants:
            expected[f"train_policy@{variant}"] = {spec.name}
    for name in ("grpo", "dapo"):
        expected[f"train_policy@{name}"] = set()
    for method, settings in params.methods.items():
        owner = {spec.name for spec in load_methods() if settings.agent in spec.agents}
        expected[f"evaluate@{method}"] = owner
    for variant in VARIANTS.names():  # a trained policy runs its warm start's agent: that agent's package only
        agent = variant_agent(run_spec(params), variant)
        expected[f"evaluate@{variant}"] = {spec.name for spec in load_methods() if agent in spec.agents}
    expected["head_to_head"] = set()
    expected["collect"] = {"coreact"}
    # the shared ReAct warm start every method starts from re-runs for none of them; RubricEM's is its own
    expected["sft_data"] = expected["sft"] = set()
    expected["sft_data_scaffold"] = expected["sft_scaffold"] = {"rubricem"}
    expected["train_rubric_generator@listwise"] = expected["train_rubric_generator@pairwise"] = {"coreact"}
    for stage, owners in expected.items():
        used = {name for name, path in packages.items()
                if any(dep == path or dep.startswith(path + "/") for dep in deps[stage])}
        assert used == owners, f"{stage} depends on {sorted(used)}, expected {sorted(owners)}"
    assert not any(dep == "components/methods" for stage in deps.values() for dep in stage)


def test_the_committed_dvc_yaml_is_the_generated_one(repo_root, tmp_path):
    """dvc.yaml is written from the specs (`python -m components.dag write-dvc`); a hand edit, or a spec changed
    without rewriting it, fails here and in `check-dvc`."""
    text = dag.dvc_yaml()
    assert (repo_root / "dvc.yaml").read_text() == text, "dvc.yaml is stale: run python -m components.dag write-dvc"
    stale = tmp_path / "dvc.yaml"
    stale.write_text(text.replace("      - components/world  # ARCO's oracle diagnostics\n", ""))
    assert dag.main(["check-dvc", "--path", str(stale)]) == 1
    assert dag.main(["write-dvc", "--path", str(stale)]) == 0 and stale.read_text() == text
    assert dag.main(["check-dvc", "--path", str(stale)]) == 0


def resolved_by_dvc(repo_root, text: str) -> dict:
    """dvc.yaml's text as DVC resolves it (foreach expanded), without writing it."""
    import yaml
    from dvc.parsing import DataResolver
    from dvc.repo import Repo

    with Repo(str(repo_root)) as repo:
        return DataResolver(repo, repo.root_dir, yaml.safe_load(text)).resolve()["stages"]


def test_a_variant_declared_in_its_spec_alone_appears_in_the_flow_and_dvc_yaml(repo_root):
    """Adding a variant is one place (its method's spec) plus its builder: the flow's DAG, dvc.yaml's train_policy
    and evaluate items and head_to_head's deps all follow."""
    specs = [dataclasses.replace(s, variants=(*s.variants, "arbor_tiny")) if s.name == "arbor" else s
             for s in load_methods()]
    stages = dag.pipeline_stages(specs)
    graph = dag.edges(dag.resolve(stages))
    assert graph["train_policy@arbor_tiny"] == ["prepare", "index", "sft"]
    assert graph["evaluate@arbor_tiny"] == ["prepare", "index", "sft", "train_policy@arbor_tiny"]
    assert "train_policy@arbor_tiny" in graph["head_to_head"] and "evaluate@arbor_tiny" in graph["head_to_head"]
    assert "train_policy@arbor_tiny" not in pipeline_module.STAGES  # the shipped specs are untouched

    dvc = resolved_by_dvc(repo_root, dag.dvc_yaml(stages))
    trained = dvc["train_policy@arbor_tiny"]
    assert trained["cmd"] == "python -m tasks.train_policy --variant arbor_tiny"
    assert "components/methods/arbor" in trained["deps"] and "arbor" in trained["params"]
    assert "outputs/train/arbor_tiny/adapter" in trained["outs"]
    assert dvc["evaluate@arbor_tiny"]["cmd"] == "python -m tasks.evaluate --method arbor_tiny"
    assert "outputs/train/arbor_tiny/metrics.csv" in dvc["head_to_head"]["deps"]
    assert set(dvc) - set(resolved_by_dvc(repo_root, dag.dvc_yaml())) == {"train_policy@arbor_tiny",
                                                                          "evaluate@arbor_tiny"}


def test_a_method_with_a_warm_start_of_its_own_gets_its_stages(repo_root):
    """A spec's warm start: sft_data_<x> -> sft_<x> reading its package, evaluated, and its variants train from it."""
    tiny = MethodSpec(name="tiny", sections=("arbor",), variants=("tiny_grpo",), warm_start="sft_tiny",
                      evaluations=(Evaluation("tiny_rubric", serves=("train_rubric_generator@listwise",)),))
    stages = dag.pipeline_stages([*load_methods(), tiny])
    graph = dag.edges(dag.resolve(stages))
    assert graph["sft_data_tiny"] == ["prepare", "index"] and graph["sft_tiny"] == ["sft_data_tiny"]
    assert graph["train_policy@tiny_grpo"] == ["prepare", "index", "sft_tiny"]
    assert graph["evaluate@sft_tiny"] == ["prepare", "index", "sft_tiny"]
    assert graph["evaluate@tiny_rubric"] == ["prepare", "index", "sft_tiny", "train_rubric_generator@listwise"]
    dvc = resolved_by_dvc(repo_root, dag.dvc_yaml(stages))
    assert dvc["sft_tiny"]["cmd"] == "python -m tasks.sft --method sft_tiny"
    assert "components/methods/tiny" in dvc["sft_data_tiny"]["deps"]
    assert "methods.sft_tiny" in dvc["train_policy@tiny_grpo"]["params"]


def test_an_evaluation_of_a_stage_that_does_not_exist_is_refused():
    bad = MethodSpec(name="bad", sections=("arbor",), evaluations=(Evaluation("bad", serves=("train_nothing",)),))
    with pytest.raises(ValueError, match="'train_nothing', which is no stage"):
        dag.pipeline_stages([*load_methods(), bad])


def test_the_warm_starts_are_train_policy_s(repo_root):
    """Each spec's warm start is the entry train_policy.warm_start gives its agent (the DAG's edges and the run's
    warm start agree), and every variant's is its agent's."""
    params = load_params(repo_root / "params.yaml")
    for spec in load_methods():
        for agent in spec.agents:
            if agent in params.train_policy.warm_start:
                assert params.train_policy.warm_start[agent] == spec.warm_start, spec.name
    for variant in pipeline_module.VARIANTS:
        assert dag.variant_warm_start(variant) == params.train_policy.warm_start[variant_agent(run_spec(params), variant)]
