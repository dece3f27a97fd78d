"""Screenshots of the Prefect UI as a user sees it, for docs/ui/: the pipeline deployment's run form, a
completed flow run of it, and the nightly-sweep deployment with its schedule.

    .venv/bin/python scripts/ui_screenshots.py [--out docs/ui]

It starts a private Prefect server with its UI on a free loopback port (temporary PREFECT_HOME, sqlite,
analytics off), serves the deployments with `python -m flows.deploy` (its --set values, a tiny world and a
temporary out_dir, become the form's default overrides), triggers the pipeline's `prepare` stage through
the API, waits for it to complete, and photographs the pages with Debian's headless Chromium
(`apt-get install -y chromium`). Everything stops at the end; nothing leaves 127.0.0.1.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
TINY = ["world.n_people=8", "world.n_films=3", "world.n_cities=3", "world.n_companies=3",
        "data.n_train=2", "data.n_dev=2", "data.n_test=4"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(url: str, proc: subprocess.Popen, timeout: float = 600) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"prefect server exited with {proc.returncode}")
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(1)
    raise SystemExit(f"prefect server not healthy after {timeout:.0f} s")


def screenshot(chromium: str, url: str, path: Path, profile: Path) -> None:
    """One page after its JavaScript has had 20 s of (virtual) time to fetch and render."""
    subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                    "--no-first-run", f"--user-data-dir={profile}", "--window-size=1400,1000",
                    "--virtual-time-budget=20000", f"--screenshot={path}", url],
                   check=True, timeout=180, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    print(f"wrote {path} ({path.stat().st_size} bytes)")


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "ui", help="folder of the PNGs")
    args = parser.parse_args()
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        raise SystemExit("chromium not found: apt-get install -y chromium")
    args.out.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="rubricflow-ui-"))
    port = free_port()
    api = f"http://127.0.0.1:{port}/api"
    env = {**os.environ, "PREFECT_HOME": str(tmp / "prefect_home"), "PREFECT_API_URL": api,
           "PREFECT_SERVER_API_HOST": "127.0.0.1", "PREFECT_SERVER_API_PORT": str(port),
           "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "DO_NOT_TRACK": "1", "RUBRICFLOW_MLFLOW": "0"}
    os.environ.update(env)  # this process's Prefect client talks to the same server
    logs = (tmp / "server.log").open("w"), (tmp / "serve.log").open("w")
    server = subprocess.Popen([sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1",
                               "--port", str(port)], env=env, stdout=logs[0], stderr=subprocess.STDOUT)
    serving = None
    try:
        wait_healthy(api, server)
        overrides = [f"run.out_dir={tmp / 'out'}", *TINY]
        serving = subprocess.Popen([sys.executable, "-m", "flows.deploy", *[a for o in overrides for a in ("--set", o)]],
                                   cwd=ROOT, env=env, stdout=logs[1], stderr=subprocess.STDOUT)
        from prefect.client.orchestration import get_client
        from prefect.deployments import run_deployment
        from prefect.exceptions import ObjectNotFound

        with get_client(sync_client=True) as client:
            deadline = time.monotonic() + 300
            while True:
                try:
                    pipeline = client.read_deployment_by_name("run-pipeline/pipeline")
                    sweep = client.read_deployment_by_name("run-sweep/nightly-sweep")
                    break
                except ObjectNotFound:
                    if time.monotonic() > deadline or serving.poll() is not None:
                        raise SystemExit(f"deployments not served; see {tmp / 'serve.log'}") from None
                    time.sleep(1)
        run = run_deployment("run-pipeline/pipeline", parameters={"targets": ["prepare"]}, timeout=600)
        if run.state is None or not run.state.is_completed():
            raise SystemExit(f"flow run {run.name} ended {run.state}; see {tmp / 'serve.log'} (kept)")
        ui = f"http://127.0.0.1:{port}/v2"  # the UI a fresh browser is sent to
        shots = [(f"{ui}/deployments/deployment/{pipeline.id}/run", "pipeline_run_form.png"),
                 (f"{ui}/runs/flow-run/{run.id}", "pipeline_flow_run.png"),
                 (f"{ui}/deployments/deployment/{sweep.id}", "nightly_sweep_deployment.png")]
        for url, name in shots:
            screenshot(chromium, url, args.out / name, tmp / "chromium")
    finally:
        for proc in (serving, server):
            if proc is not None:
                stop(proc)
        for log in logs:
            log.close()
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
