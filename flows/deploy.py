"""Serve the pipeline flow from this process (a long-running alternative to `prefect deploy --all`
with prefect.yaml, for a single machine without a work pool).

    python -m flows.deploy            # needs a Prefect server: prefect server start
"""

from __future__ import annotations

from flows.pipeline import pipeline
from tasks.runtime import run_stage


def main() -> None:
    pipeline.serve(name="pipeline-embedded", cron=None)


if __name__ == "__main__":
    run_stage(main)
