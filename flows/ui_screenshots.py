"""Screenshots of the Prefect UI as a user sees it, for docs/ui/: the pipeline deployment's run form, a
completed flow run of it, and the nightly-sweep deployment with its schedule.

    .venv/bin/python -m flows.ui_screenshots [--out docs/ui]

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
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run as a script: the repository root is importable from here on

from flows.local_server import TINY_WORLD, local_server, serve_deployments, stop, tail, wait_for_deployments


def screenshot(chromium: str, url: str, path: Path, profile: Path) -> None:
    """One page after its JavaScript has had 20 s of (virtual) time to fetch and render."""
    subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                    "--no-first-run", f"--user-data-dir={profile}", "--window-size=1400,1000",
                    "--virtual-time-budget=20000", f"--screenshot={path}", url],
                   check=True, timeout=180, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    print(f"wrote {path} ({path.stat().st_size} bytes)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "ui", help="folder of the PNGs")
    args = parser.parse_args()
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        raise SystemExit("chromium not found: apt-get install -y chromium")
    args.out.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="rubricflow-ui-"))
    with local_server(tmp / "prefect_home", tmp / "server.log") as env:
        os.environ.update(env)  # this process's Prefect client talks to the same server
        serving = serve_deployments(env, [f"run.out_dir={tmp / 'out'}", *TINY_WORLD], tmp / "serve.log")
        try:
            pipeline, sweep = wait_for_deployments(env, ["run-pipeline/pipeline", "run-sweep/nightly-sweep"],
                                                   serving, tmp / "serve.log")
            from prefect.deployments import run_deployment

            run = run_deployment("run-pipeline/pipeline", parameters={"targets": ["prepare"]}, timeout=600)
            if run.state is None or not run.state.is_completed():
                raise SystemExit(f"flow run {run.name} ended {run.state}:\n{tail(tmp / 'serve.log')}")
            ui = f"http://127.0.0.1:{env['PREFECT_SERVER_API_PORT']}/v2"  # the UI a fresh browser is sent to
            shots = [(f"{ui}/deployments/deployment/{pipeline.id}/run", "pipeline_run_form.png"),
                     (f"{ui}/runs/flow-run/{run.id}", "pipeline_flow_run.png"),
                     (f"{ui}/deployments/deployment/{sweep.id}", "nightly_sweep_deployment.png")]
            for url, name in shots:
                screenshot(chromium, url, args.out / name, tmp / "chromium")
        finally:
            stop(serving)
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
