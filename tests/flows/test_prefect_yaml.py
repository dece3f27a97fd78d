"""prefect.yaml as `prefect deploy --all` reads it: the deployments that train go to the GPU work pool (with
CUDA_VISIBLE_DEVICES in their job variables and a `gpu` tag), the rest to the CPU process pool, and every
entrypoint, target and override is one the flows accept."""

from __future__ import annotations

import importlib

import yaml
from prefect.cli.deploy._models import PrefectYamlModel

from components.params_load import load_params
from flows.pipeline import STAGES, select

TRAINING = {"sft", "sft_scaffold", "train_rubric_generator", "train_policy"}


def deployments(repo_root) -> dict[str, dict]:
    raw = yaml.safe_load((repo_root / "prefect.yaml").read_text())
    model = PrefectYamlModel.model_validate(raw)  # what `prefect deploy` validates before deploying
    return {d["name"]: d for d in (c.model_dump(exclude_unset=True, mode="json") for c in model.deployments)}


def trains(deployment: dict) -> bool:
    """A deployment whose own job trains: the sweep, or the pipeline with training targets. The pipeline form
    with no targets is the on-demand entry (the embedded main job, CPU-sized) and stays on the CPU pool."""
    if deployment["entrypoint"].endswith(":run_sweep"):
        return True
    targets = deployment.get("parameters", {}).get("targets") or []
    return any(stage.split("@")[0] in TRAINING for stage in select(targets)) if targets else False


def test_training_deployments_run_on_the_gpu_pool_and_the_rest_on_the_process_pool(repo_root):
    found = deployments(repo_root)
    assert {"pipeline", "train", "nightly-sweep"} <= set(found)
    for name, d in found.items():
        pool = d["work_pool"]
        if trains(d):
            assert pool["name"] == "rubricflow-gpu", name
            assert pool["job_variables"]["env"]["CUDA_VISIBLE_DEVICES"] == "0", name
            assert "gpu" in d["tags"], name
        else:
            assert pool["name"] == "rubricflow" and not pool.get("job_variables"), name
            assert "gpu" not in d.get("tags", []), name


def test_entrypoints_targets_and_overrides_are_accepted(repo_root):
    for name, d in deployments(repo_root).items():
        path, attr = d["entrypoint"].split(":")
        flow = getattr(importlib.import_module(path.removesuffix(".py").replace("/", ".")), attr)
        params = d.get("parameters", {})
        assert set(params) <= set(flow.parameters.properties), name
        targets = params.get("targets") or []
        assert set(select(targets)) <= set(STAGES), name
        load_params(repo_root / "params.yaml", overrides=list(params.get("overrides", [])))


def test_the_nightly_lab_runs_the_full_grid_on_the_nightly_schedule(repo_root):
    """The lab's full grid is the nightly default (issue 73): in prefect.yaml and among the served deployments, on
    the same cron as the nightly sweep; its grid is one lab.sweep.grids names."""
    from flows.deploy import deployments as served, run_lab

    lab = deployments(repo_root)["nightly-lab"]
    assert lab["entrypoint"] == "flows/deploy.py:run_lab" and lab["parameters"]["grid"] == "full"
    assert run_lab.parameters.properties["grid"]["default"] == "full"
    params = load_params(repo_root / "params.yaml", overlays=["lab"])
    assert "full" in params.lab.sweep.grids
    by_name = {d.name: d for d in served(params, [])}
    assert [s.schedule.cron for s in by_name["nightly-lab"].schedules] == [params.deploy.nightly_cron]
