"""A private Prefect server on loopback and the deployments of flows/deploy.py served against it: what the
server test (tests/flows/test_prefect_server.py) and the UI screenshots (flows/ui_screenshots.py) share.

    with local_server(tmp / "prefect_home", log=tmp / "server.log") as env:   # env points at the server
        serving = serve_deployments(env, ["run.out_dir=/tmp/x", *TINY_WORLD], log=tmp / "serve.log")
        pipeline, sweep = wait_for_deployments(env, ["run-pipeline/pipeline", "run-sweep/nightly-sweep"],
                                               serving, log=tmp / "serve.log")
        ...
        stop(serving)

The server has its own PREFECT_HOME (sqlite), listens on 127.0.0.1 only and sends nothing anywhere
(analytics off, DO_NOT_TRACK).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import httpx

from components.embedded.server import free_port

ROOT = Path(__file__).resolve().parents[1]

TINY_WORLD = ["world.n_people=8", "world.n_films=3", "world.n_cities=3", "world.n_companies=3",
              "data.n_train=2", "data.n_dev=2", "data.n_test=4"]
"""Overrides for a world small enough that `prepare` takes seconds."""


class LocalServerError(RuntimeError):
    """The server or the serving process did not come up; the message ends with its log's tail."""


def tail(path: Path, chars: int = 3000) -> str:
    return path.read_text(errors="replace")[-chars:] if path.exists() else ""


def prefect_env(home: Path, port: int, *, ui: bool = True) -> dict[str, str]:
    """This process's environment pointed at a private server on ``port`` with its home in ``home``."""
    return {
        **os.environ,
        "PREFECT_HOME": str(home),
        "PREFECT_API_URL": f"http://127.0.0.1:{port}/api",
        "PREFECT_SERVER_API_HOST": "127.0.0.1",
        "PREFECT_SERVER_API_PORT": str(port),
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PREFECT_SERVER_UI_ENABLED": "true" if ui else "false",
        "DO_NOT_TRACK": "1",
        "RUBRICFLOW_MLFLOW": "0",
    }


def stop(proc: subprocess.Popen | None) -> None:
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@contextlib.contextmanager
def local_server(home: Path, log: Path, *, ui: bool = True, timeout_s: float = 600) -> Iterator[dict[str, str]]:
    """`prefect server start` on a free loopback port until the block ends; yields the environment that
    points at it. A loaded 2-core machine can take minutes to migrate the database, hence the timeout."""
    env = prefect_env(home, free_port(), ui=ui)
    with log.open("w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1",
                                 "--port", env["PREFECT_SERVER_API_PORT"]],
                                env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            if proc.poll() is not None:
                raise LocalServerError(f"prefect server exited with {proc.returncode}:\n{tail(log)}")
            try:
                if httpx.get(f"{env['PREFECT_API_URL']}/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise LocalServerError(f"prefect server not healthy after {timeout_s:.0f} s:\n{tail(log)}")
            time.sleep(1)
        yield env
    finally:
        stop(proc)


def serve_deployments(env: dict[str, str], overrides: Sequence[str], log: Path) -> subprocess.Popen:
    """`python -m flows.deploy` against the server of ``env``; ``overrides`` become the forms' defaults."""
    with log.open("w") as out:
        return subprocess.Popen([sys.executable, "-m", "flows.deploy", *[a for o in overrides for a in ("--set", o)]],
                                cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)


def wait_for_deployments(env: dict[str, str], names: Sequence[str], serving: subprocess.Popen, log: Path,
                         timeout_s: float = 300) -> list:
    """The deployments ``names`` as the API returns them, once the serving process has registered them."""
    from prefect.client.orchestration import get_client
    from prefect.exceptions import ObjectNotFound
    from prefect.settings import PREFECT_API_URL, temporary_settings

    deadline = time.monotonic() + timeout_s
    with temporary_settings(updates={PREFECT_API_URL: env["PREFECT_API_URL"]}), \
            get_client(sync_client=True) as client:
        while True:
            try:
                return [client.read_deployment_by_name(n) for n in names]
            except ObjectNotFound:
                if serving.poll() is not None or time.monotonic() > deadline:
                    raise LocalServerError(f"deployments {list(names)} not served:\n{tail(log)}") from None
                time.sleep(1)
