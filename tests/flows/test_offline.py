"""An offline flow run logs no network errors: the server a flow run starts sends no telemetry."""

from __future__ import annotations

import os
import subprocess
import sys

SCRIPT = """
import flows
from prefect import flow

@flow
def hello():
    return 1

assert hello() == 1
"""


def test_a_flow_run_logs_no_failed_telemetry_call(tmp_path, repo_root):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("PREFECT_") and k != "DO_NOT_TRACK"}  # the project's defaults, not the caller's
    env["PREFECT_HOME"] = str(tmp_path / "prefect")
    done = subprocess.run([sys.executable, "-c", SCRIPT], check=False, cwd=repo_root, env=env, capture_output=True, text=True,
                          timeout=300)
    log = done.stdout + done.stderr
    assert done.returncode == 0, log[-3000:]
    assert "Beginning flow run" in log  # the run's own log lines are there to be read
    assert "telemetry" not in log.lower(), log[-3000:]
