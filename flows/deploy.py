"""Serve the deployments users trigger from the Prefect UI, from this one process (no work pool, no worker):

- ``run-pipeline/pipeline``: the pipeline on demand; the run form asks for the stages to run (``targets``)
  and for settings of this run only (``overrides``, ``key=value`` as ``--set`` takes them).
- ``run-sweep/nightly-sweep``: the ablation sweep (flows/sweep.py) on the ``deploy.nightly_cron`` schedule
  in ``deploy.timezone``; it can also be run on demand with the same kind of form.

    prefect server start                      # another terminal; the UI is at http://127.0.0.1:4200
    python -m flows.deploy                    # serves until Ctrl-C (which pauses the nightly schedule)
    python -m flows.deploy --set run.out_dir=outputs/ui   # --set values become the forms' default overrides
    prefect deployment run run-pipeline/pipeline -p targets='["prepare"]'

A triggered run reads params.yaml (or ``--params``) when it starts, then applies its ``overrides`` with the
code of the CLI's ``--set``, so a run from the UI and ``python -m flows.pipeline --set ...`` agree.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any, Literal

from prefect import flow, serve
from prefect.schedules import Cron

from components.params import Params, ParamsError, load_params
from flows.pipeline import METHODS, STAGES, VARIANTS, pipeline
from tasks.runtime import PARAMS_PATH, params_from_args, run_stage, stage_argparser

TARGETS = [*STAGES, *sorted({name.split("@")[0] for name in STAGES if "@" in name})]
"""What the run form offers as targets: every stage, and each `foreach` group (`train_policy`: every variant)."""

# the UI renders a multi-select of these names
Target = Literal[tuple(TARGETS)]  # type: ignore[valid-type]
Variant = Literal[tuple(VARIANTS)]  # type: ignore[valid-type]
Method = Literal[tuple(METHODS)]  # type: ignore[valid-type]


def _params(overrides: Sequence[str]) -> Params:
    return load_params(PARAMS_PATH, overrides=list(overrides))


@flow(name="run-pipeline", log_prints=True)
def run_pipeline(targets: Sequence[Target] = (), overrides: Sequence[str] = ()) -> dict[str, float]:
    """The pipeline with this run's settings.

    Args:
        targets: Stages to run, each with the stages it depends on, as `dvc repro` takes them; empty: the
            main job, as `python -m flows.pipeline` runs it.
        overrides: Settings for this run only, one `key=value` each as `--set` takes them, e.g.
            `run.out_dir=outputs/try1` or `data.n_test=10`.
    """
    return pipeline(params=_params(overrides), targets=list(targets) or None)


@flow(name="run-sweep", log_prints=True)
def run_sweep(variants: Sequence[Variant] = (), seeds: Sequence[int] = (), overrides: Sequence[str] = (),
              runner: Literal["thread", "ray"] | None = None, methods: Sequence[Method] = ()) -> Any:
    """The ablation sweep with this run's settings.

    Args:
        variants: Training variants to compare (`train_policy --variant`); empty: `sweep.variants` of
            params.yaml (none when methods are picked).
        seeds: Seeds each variant trains with and each method is evaluated with; empty: `sweep.seeds`.
        overrides: Settings for this run only, one `key=value` each as `--set` takes them, e.g. `grpo.steps=4`.
        runner: Where the runs execute: threads of the serving process, or Ray; empty: `sweep.runner`.
        methods: Evaluated methods to compare (`evaluate --method`), e.g. Co-ReAct and its baselines; empty:
            `sweep.methods`.
    """
    from flows.sweep import sweep  # imported when a run starts: serving does not need the sweep module

    return sweep(params=_params(overrides), variants=list(variants) or None, seeds=list(seeds) or None,
                 runner=runner, methods=list(methods) or None)


def deployments(params: Params, overrides: list[str]) -> list:
    """The served deployments; ``overrides`` become the default of each form's overrides field."""
    try:
        nightly = Cron(params.deploy.nightly_cron, timezone=params.deploy.timezone)
    except ValueError as exc:
        raise ParamsError(f"deploy.nightly_cron: {exc}") from None
    defaults = {"overrides": overrides} if overrides else {}
    return [
        run_pipeline.to_deployment(
            "pipeline", parameters=defaults, tags=["rubricflow"],
            description="The pipeline on demand: pick the stages and override settings for this run."),
        run_sweep.to_deployment(
            "nightly-sweep", schedule=nightly, parameters=defaults, tags=["rubricflow", "nightly"],
            description="The ablation sweep over the methods' variants, every night; can be run on demand."),
    ]


def main() -> None:
    args = stage_argparser(__doc__).parse_args()
    os.environ["RUBRICFLOW_PARAMS"] = args.params  # the runs start in child processes that inherit it
    overrides = ([f"profile={args.profile}"] * bool(args.profile) + [f"overlay={args.overlays}"] * bool(args.overlays)
                 + args.overrides)
    serve(*deployments(params_from_args(args), overrides))


if __name__ == "__main__":
    run_stage(main)
