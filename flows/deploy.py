"""Serve the deployments users trigger from the Prefect UI, from this one process (no work pool, no worker):

- ``run-pipeline/pipeline``: the pipeline on demand; the run form asks for the stages to run (``targets``),
  the settings users change most as typed fields (``settings``: components/run_form.py's ``RunForm``, e.g. the
  data source and sizes, the profile, the output folder) and any other setting of this run only
  (``overrides``, ``key=value`` as ``--set`` takes them).
- ``run-sweep/nightly-sweep``: the ablation sweep (flows/sweep.py) on the ``deploy.nightly_cron`` schedule
  in ``deploy.timezone``; it can also be run on demand with the same kind of form.
- ``run-lab/nightly-lab``: the lab sweep (flows/lab.py, ``--overlay lab``) of the ``full`` grid on the same
  schedule, resuming cell by cell; on demand, any grid of ``lab.sweep.grids``.

    prefect server start                      # another terminal; the UI is at http://127.0.0.1:4200
    python -m flows.deploy                    # serves until Ctrl-C (which pauses the nightly schedule)
    python -m flows.deploy --set run.out_dir=outputs/ui   # --set values become the forms' default overrides
    prefect deployment run run-pipeline/pipeline -p targets='["prepare"]'

A triggered run reads params.yaml (or ``--params``) when it starts, then applies its ``settings`` (turned into
``--set`` items by ``to_overrides``) and then its ``overrides`` with the code of the CLI's ``--set``, so a run
from the UI and ``python -m flows.pipeline --set ...`` agree, and a value the form lets through that params.yaml's
models refuse stops the run with load_params' message.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any, Literal

from prefect import flow, serve
from prefect.schedules import Cron

from components.params import Params
from components.params_load import load_params
from components.params_section import ParamsError
from components.run_form import RunForm, to_overrides
from flows.pipeline import METHODS, STAGES, VARIANTS, pipeline
from tasks.runtime import PARAMS_PATH, params_from_args, run_stage, stage_argparser

TARGETS = [*STAGES, *sorted({name.split("@")[0] for name in STAGES if "@" in name})]
"""What the run form offers as targets: every stage, and each `foreach` group (`train_policy`: every variant)."""

# the UI renders a multi-select of these names
Target = Literal[tuple(TARGETS)]  # type: ignore[valid-type]
Variant = Literal[tuple(VARIANTS)]  # type: ignore[valid-type]
Method = Literal[tuple(METHODS)]  # type: ignore[valid-type]


NO_SETTINGS = RunForm()
"""The form's default: every typed field empty, so params.yaml (and the free-text overrides) decide."""


def _params(settings: RunForm | None, overrides: Sequence[str]) -> Params:
    """params.yaml with the form's typed settings, then its free-text overrides (which win on a shared key)."""
    return load_params(PARAMS_PATH, overrides=[*to_overrides(settings), *overrides])


@flow(name="run-pipeline", log_prints=True)
def run_pipeline(targets: Sequence[Target] = (), settings: RunForm = NO_SETTINGS,
                 overrides: Sequence[str] = ()) -> dict[str, float]:
    """The pipeline with this run's settings.

    Args:
        targets: Stages to run, each with the stages it depends on, as `dvc repro` takes them; empty: the
            main job, as `python -m flows.pipeline` runs it.
        settings: The settings changed most, typed as params.yaml types them; empty fields keep its values.
        overrides: Any other setting for this run only, one `key=value` each as `--set` takes them, e.g.
            `grpo.lr=5e-5`; applied after `settings`.
    """
    return pipeline(params=_params(settings, overrides), targets=list(targets) or None)


@flow(name="run-sweep", log_prints=True)
def run_sweep(variants: Sequence[Variant] = (), seeds: Sequence[int] = (), overrides: Sequence[str] = (),
              runner: Literal["thread", "ray"] | None = None, methods: Sequence[Method] = (),
              settings: RunForm = NO_SETTINGS) -> Any:
    """The ablation sweep with this run's settings.

    Args:
        variants: Training variants to compare (`train_policy --variant`); empty: `sweep.variants` of
            params.yaml (none when methods are picked).
        seeds: Seeds each variant trains with and each method is evaluated with; empty: `sweep.seeds`.
        overrides: Any other setting for this run only, one `key=value` each as `--set` takes them, e.g.
            `grpo.lr=5e-5`; applied after `settings`.
        runner: Where the runs execute: threads of the serving process, or Ray; empty: `sweep.runner`.
        methods: Evaluated methods to compare (`evaluate --method`), e.g. Co-ReAct and its baselines; empty:
            `sweep.methods`.
        settings: The settings changed most (training steps, data sizes, profile, ...), typed as params.yaml
            types them; empty fields keep its values.
    """
    from flows.sweep import sweep  # imported when a run starts: serving does not need the sweep module

    return sweep(params=_params(settings, overrides), variants=list(variants) or None, seeds=list(seeds) or None,
                 runner=runner, methods=list(methods) or None)


@flow(name="run-lab", log_prints=True)
def run_lab(grid: str = "full", overrides: Sequence[str] = (), settings: RunForm = NO_SETTINGS) -> dict:
    """The lab sweep under ``--overlay lab`` (a nano policy and simulated judges; lab results).

    Args:
        grid: A grid of `lab.sweep.grids`: `full` (every training variant x five judges x 3 seeds, the nightly
            default), `session`, `intro` or `worlds`. Cells already finished under the same settings are read back.
        overrides: Any other setting for this run only, one `key=value` each as `--set` takes them, e.g.
            `lab.world_seed=2000`; applied after `settings`.
        settings: The settings changed most (data sizes, output folder, ...), typed as params.yaml types them;
            empty fields keep the lab overlay's values.
    """
    from flows.lab import run  # imported when a run starts

    params = load_params(PARAMS_PATH, overlays=["lab"], overrides=[*to_overrides(settings), *overrides])
    return run(params, grid, f"run-lab/nightly-lab (grid={grid})")


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
        run_lab.to_deployment(
            "nightly-lab", schedule=nightly, parameters=defaults, tags=["rubricflow", "nightly", "lab"],
            description="The lab sweep's full grid (nano policy, simulated judges), every night, cell by cell."),
    ]


def main() -> None:
    args = stage_argparser(__doc__).parse_args()
    os.environ["RUBRICFLOW_PARAMS"] = args.params  # the runs start in child processes that inherit it
    overrides = ([f"profile={args.profile}"] * bool(args.profile) + [f"overlay={args.overlays}"] * bool(args.overlays)
                 + args.overrides)
    serve(*deployments(params_from_args(args), overrides))


if __name__ == "__main__":
    run_stage(main)
