"""The deployments of flows/deploy.py against a real Prefect server on loopback: `python -m flows.deploy`
serves them, a flow run triggered through the API completes and writes its outputs, and the nightly sweep
carries the schedule of params.yaml's ``deploy`` section. Slow: it starts a server and a serving process.

    .venv/bin/python -m pytest -q -m slow tests/flows/test_prefect_server.py
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from components.io import read_jsonl
from components.params import load_params
from components.schemas import Question
from flows.pipeline import STAGES

# a loaded 2-core machine can take minutes to migrate the server's database and start a flow run
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

# a world small enough that `prepare` takes seconds
TINY = ["world.n_people=8", "world.n_films=3", "world.n_cities=3", "world.n_companies=3",
        "data.n_train=2", "data.n_dev=2", "data.n_test=4"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def prefect_env(home: Path, port: int) -> dict[str, str]:
    """A private Prefect (its own home and sqlite database) on loopback, with nothing sent anywhere."""
    return {
        **os.environ,
        "PREFECT_HOME": str(home),
        "PREFECT_API_URL": f"http://127.0.0.1:{port}/api",
        "PREFECT_SERVER_API_HOST": "127.0.0.1",
        "PREFECT_SERVER_API_PORT": str(port),
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "DO_NOT_TRACK": "1",
        "PREFECT_SERVER_UI_ENABLED": "false",
        "RUBRICFLOW_MLFLOW": "0",
        "OMP_NUM_THREADS": "1",
    }


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def tail(path: Path, chars: int = 3000) -> str:
    return path.read_text(errors="replace")[-chars:] if path.exists() else ""


@pytest.fixture
def server(tmp_path: Path) -> Iterator[dict[str, str]]:
    """`prefect server start` on a free loopback port; yields the environment that points at it."""
    env = prefect_env(tmp_path / "prefect_home", free_port())
    log = tmp_path / "server.log"
    with log.open("w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1",
                                 "--port", env["PREFECT_SERVER_API_PORT"]],
                                env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 600
        while True:
            assert proc.poll() is None, f"prefect server exited:\n{tail(log)}"
            try:
                if httpx.get(f"{env['PREFECT_API_URL']}/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, f"prefect server not healthy after 600 s:\n{tail(log)}"
            time.sleep(1)
        yield env
    finally:
        stop(proc)


@pytest.fixture
def served(server: dict[str, str], tmp_path: Path, repo_root: Path) -> Iterator[Path]:
    """`python -m flows.deploy` serving against the server; yields its log."""
    log = tmp_path / "serve.log"
    with log.open("w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "flows.deploy"], cwd=repo_root, env=server,
                                stdout=out, stderr=subprocess.STDOUT)
    try:
        yield log
    finally:
        stop(proc)


def test_served_pipeline_runs_from_the_api_and_the_sweep_is_scheduled(server, served, tmp_path):
    from prefect.client.orchestration import get_client
    from prefect.deployments import run_deployment
    from prefect.exceptions import ObjectNotFound
    from prefect.settings import PREFECT_API_URL, temporary_settings

    out_dir = tmp_path / "out"
    with temporary_settings(updates={PREFECT_API_URL: server["PREFECT_API_URL"]}), \
            get_client(sync_client=True) as client:
        deadline = time.monotonic() + 300
        while True:
            try:
                pipeline_dep = client.read_deployment_by_name("run-pipeline/pipeline")
                sweep_dep = client.read_deployment_by_name("run-sweep/nightly-sweep")
                break
            except ObjectNotFound:
                assert time.monotonic() < deadline, f"deployments not served after 300 s:\n{tail(served)}"
                time.sleep(1)

        # the run form: targets is a multi-select of the DAG's stages, overrides a list of strings
        props = pipeline_dep.parameter_openapi_schema["properties"]
        assert props["targets"]["type"] == "array"
        assert set(props["targets"]["items"]["enum"]) == {*STAGES, "evaluate", "train_policy", "train_rubric_generator"}
        assert (props["overrides"]["type"], props["overrides"]["items"]) == ("array", {"type": "string"})

        # the nightly schedule as params.yaml sets it
        deploy = load_params("params.yaml").deploy
        assert [(s.schedule.cron, s.schedule.timezone, s.active) for s in sweep_dep.schedules] == [
            (deploy.nightly_cron, deploy.timezone, True)]

        run = run_deployment("run-pipeline/pipeline", timeout=600, parameters={
            "targets": ["prepare"], "overrides": [f"run.out_dir={out_dir}", *TINY]})
        assert run.state is not None and run.state.is_completed(), (
            f"flow run ended {run.state}:\n{tail(served)}")

    # the run applied its overrides: the tiny world's split sizes, under the run's own out_dir
    summary = json.loads((out_dir / "data" / "summary.json").read_text())
    assert (summary["source"], summary["questions_test"], summary["questions_train"]) == ("world", 4, 2)
    assert len(read_jsonl(out_dir / "data" / "test.jsonl", Question)) == 4
    assert not (out_dir / "index").exists()  # only the targeted stage ran
