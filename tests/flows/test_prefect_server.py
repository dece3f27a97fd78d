"""The deployments of flows/deploy.py against a real Prefect server on loopback: `python -m flows.deploy`
serves them, a flow run triggered through the API completes and writes its outputs, and the nightly sweep
carries the schedule of params.yaml's ``deploy`` section. Slow: it starts a server and a serving process.

    .venv/bin/python -m pytest -q -m slow tests/flows/test_prefect_server.py
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from components.io import read_jsonl
from components.params_load import load_params
from components.schemas import Question
from flows.local_server import TINY_WORLD, local_server, serve_deployments, stop, tail, wait_for_deployments
from flows.pipeline import STAGES

# a loaded 2-core machine can take minutes to migrate the server's database and start a flow run
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]


@pytest.fixture
def server(tmp_path: Path) -> Iterator[dict[str, str]]:
    """`prefect server start` on a free loopback port; yields the environment that points at it."""
    with local_server(tmp_path / "prefect_home", tmp_path / "server.log", ui=False) as env:
        yield {**env, "OMP_NUM_THREADS": "1"}


@pytest.fixture
def served(server: dict[str, str], tmp_path: Path) -> Iterator[tuple]:
    """`python -m flows.deploy` serving against the server; yields (process, its log)."""
    log = tmp_path / "serve.log"
    proc = serve_deployments(server, [], log)
    try:
        yield proc, log
    finally:
        stop(proc)


def test_served_pipeline_runs_from_the_api_and_the_sweep_is_scheduled(server, served, tmp_path):
    from prefect.deployments import run_deployment
    from prefect.exceptions import PrefectHTTPStatusError
    from prefect.settings import PREFECT_API_URL, temporary_settings

    proc, log = served
    out_dir = tmp_path / "out"
    pipeline_dep, sweep_dep = wait_for_deployments(
        server, ["run-pipeline/pipeline", "run-sweep/nightly-sweep"], proc, log)
    with temporary_settings(updates={PREFECT_API_URL: server["PREFECT_API_URL"]}):
        # the run form: targets is a multi-select of the DAG's stages, overrides a list of strings
        props = pipeline_dep.parameter_openapi_schema["properties"]
        assert props["targets"]["type"] == "array"
        assert set(props["targets"]["items"]["enum"]) == {*STAGES, "evaluate", "train_policy", "train_rubric_generator"}
        assert (props["overrides"]["type"], props["overrides"]["items"]) == ("array", {"type": "string"})
        # beside them the typed settings (components/run_form.py), which the server checks before a run starts
        form = pipeline_dep.parameter_openapi_schema["definitions"]["RunForm"]["properties"]
        assert form["source"]["anyOf"][0]["enum"][0] == "world" and form["n_questions"]["anyOf"][0]["minimum"] == 1
        with pytest.raises(PrefectHTTPStatusError, match="n_questions"):
            run_deployment("run-pipeline/pipeline", timeout=0, parameters={"settings": {"n_questions": 0}})

        # the nightly schedule as params.yaml sets it
        deploy = load_params("params.yaml").deploy
        assert [(s.schedule.cron, s.schedule.timezone, s.active) for s in sweep_dep.schedules] == [
            (deploy.nightly_cron, deploy.timezone, True)]

        world = [item for item in TINY_WORLD if item.startswith("world.")]
        run = run_deployment("run-pipeline/pipeline", timeout=600, parameters={
            "targets": ["prepare"], "settings": {"out_dir": str(out_dir), "n_train": 2, "n_dev": 2, "n_test": 4},
            "overrides": world})
        assert run.state is not None and run.state.is_completed(), (
            f"flow run ended {run.state}:\n{tail(log)}")

    # the run applied its settings and overrides: the tiny world's split sizes, under the run's own out_dir
    summary = json.loads((out_dir / "data" / "summary.json").read_text())
    assert (summary["source"], summary["questions_test"], summary["questions_train"]) == ("world", 4, 2)
    assert len(read_jsonl(out_dir / "data" / "test.jsonl", Question)) == 4
    assert not (out_dir / "index").exists()  # only the targeted stage ran
