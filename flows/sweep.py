"""The ablation sweep: train_policy@<variant> for each (variant, seed) and evaluate@<method> for each (method, seed)
side by side, each seed in ``<run.out_dir>/<sweep.out_dir>/seed_<seed>/`` linked to the main job's outputs (run
``python -m flows.pipeline`` first), in threads or on Ray, then tasks/report.py's comparison of the variants and of
the methods (tables and plots in the sweep's folder and in MLflow); how the runs are placed and fail:
:func:`sweep`.

    python -m flows.sweep                        # params.yaml's sweep section: variants, methods, seeds, runner
    python -m flows.sweep --variants grpo dapo --seeds 1 2 --runner thread --set grpo.steps=1
    python -m flows.sweep --methods sft coreact self_refine self_refine_rubric --seeds 1 2 \
        --set evaluation.n_questions=10          # Co-ReAct's comparison table (no training)
    python -m flows.sweep --runner ray           # the `ray` extra: pip install -e '.[ray]'
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any, Literal

from prefect import flow
from prefect.task_runners import TaskRunner, ThreadPoolTaskRunner
from pydantic import ValidationError

from components.params import Params, SweepParams
from components.params_load import apply_overrides, load_params
from components.params_section import ParamsError
from components.registry import RegistryError
from components.reporting.compare import seed_dir
from flows.placement import ray_placement
from tasks.evaluate import evaluate
from tasks.report import report, sweep_dir
from tasks.runtime import PARAMS_PATH, params_from_args, run_stage, stage_argparser, tracking
from tasks.train_policy import train_policy

Runner = Literal["thread", "ray"]

ENV_FOR_WORKERS = ("RUBRICFLOW_MLFLOW", "RUBRICFLOW_PARAMS", "OMP_NUM_THREADS")
"""Environment a Ray worker needs from the flow's process (a local instance inherits it; a cluster does not)."""


def with_overrides(params: Params | None, overrides: list[str] | None) -> Params:
    """``params`` (None: params.yaml) with ``key=value`` overrides applied as ``--set`` applies them."""
    if params is None:
        return load_params(PARAMS_PATH, overrides=overrides)
    if not overrides:
        return params
    try:
        return Params.model_validate(apply_overrides(params.model_dump(), overrides))
    except ValidationError as exc:
        err = exc.errors()[0]
        raise ParamsError(f"--set {' '.join(overrides)}: {'.'.join(map(str, err['loc']))}: {err['msg']}") from None


def seed_params(params: Params, seed: int) -> Params:
    """The params of the sweep's runs with ``seed``: their own out_dir, linked to the main job's inputs."""
    base, folder = Path(params.run.out_dir), seed_dir(sweep_dir(params), seed)
    inputs = ["data", "index"]
    # the folders of the adapters the main job trained (warm starts, rubric generators), so that a stage run
    # pointed at this folder serves the same weights (and may branch from these runs); a variant whose agent
    # needs a missing warm start fails in train_policy, naming the stage to run
    adapters = sorted({Path(p).relative_to(base).parts[0] for b in params.llm.backends.values() for p in b.adapters
                       if Path(p).is_relative_to(base) and Path(p).exists()})
    folder.mkdir(parents=True, exist_ok=True)
    for name in inputs + adapters:
        target, link = base / name, folder / name
        if not target.exists():
            raise FileNotFoundError(f"{target}: missing; the sweep trains from the main job's outputs "
                                    "(run python -m flows.pipeline first)")
        if link.is_symlink():
            link.unlink()
        if not link.exists():
            link.symlink_to(os.path.relpath(target.resolve(), folder.resolve()), target_is_directory=True)
    run = params.run.model_copy(update={"out_dir": str(folder)})
    return params.model_copy(update={"seed": seed, "run": run})


def task_runner(runner: Runner, settings: SweepParams) -> TaskRunner:
    if runner == "thread":
        return ThreadPoolTaskRunner(max_workers=settings.workers)
    try:
        from prefect_ray import RayTaskRunner
    except ImportError:
        raise ParamsError("sweep runner ray needs the ray extra: pip install -e '.[ray]'") from None
    from prefect.context import FlowRunContext

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    env = {k: os.environ[k] for k in (*ENV_FOR_WORKERS, "RAY_USAGE_STATS_ENABLED") if k in os.environ}
    context = FlowRunContext.get()
    if context is not None:  # the workers report task runs to this flow's API (else each starts its own server)
        env["PREFECT_API_URL"] = str(context.client.api_url).rstrip("/")
    if settings.ray_address:
        return RayTaskRunner(address=settings.ray_address, init_kwargs={"runtime_env": {"env_vars": env}})
    return RayTaskRunner(init_kwargs={"num_cpus": settings.workers, "include_dashboard": False,
                                      "runtime_env": {"env_vars": env}})


def _settings(params: Params, variants: list[str] | None, seeds: list[int] | None,
              runner: Runner | None, methods: list[str] | None = None) -> SweepParams:
    given = {"variants": variants, "methods": methods, "seeds": seeds, "runner": runner}
    if methods and not variants:  # methods named alone: an evaluation sweep, nothing trains
        given["variants"] = []
    given = {k: v for k, v in given.items() if v or (k == "variants" and v == [])}
    try:
        settings = SweepParams.model_validate({**params.sweep.model_dump(), **given})
    except ValidationError as exc:
        raise ParamsError(f"sweep: {exc.errors()[0]['msg']}") from None
    from components.variants import get_variant

    for variant in settings.variants:
        try:
            get_variant(variant)
        except RegistryError as exc:
            raise ParamsError(f"sweep.variants: {exc}") from None
    from components.method_registry import load_methods
    from components.variants import VARIANTS

    load_methods()
    unknown = [m for m in settings.methods if m not in params.methods and m not in VARIANTS.names()]
    if unknown:  # a variant's name evaluates its trained policy (evaluate@<variant>)
        raise ParamsError(f"sweep.methods: unknown method {unknown[0]!r}; params.methods has "
                          f"{', '.join(sorted(params.methods))}; training variants (their trained policies): "
                          f"{', '.join(sorted(VARIANTS.names()))}")
    return settings


STAGES = {"train": train_policy, "eval": evaluate}
"""A job's stage -> its task and folder under seed_<s>/: train/<variant>/ or eval/<method>/."""


@flow(name="rubricflow-sweep", log_prints=True)
def sweep(params: Params | None = None, variants: list[str] | None = None, seeds: list[int] | None = None,
          runner: Runner | None = None, overrides: list[str] | None = None,
          methods: list[str] | None = None) -> dict[str, dict[str, float]]:
    """Train every (variant, seed), evaluate every (method, seed) and compare them; returns each variant's and
    each method's mean metrics over its seeds.

    Each run has its seed and its own ``run.out_dir`` (``seed_<seed>/``, so no two runs share a folder); its
    backends serve the main job's adapters (their paths resolved against the main ``run.out_dir``), and the seed
    folder's links to the main job's data, index and adapter folders let a stage pointed at it serve the same
    weights and branch from its runs. Runs are submitted together, at most ``sweep.workers`` at once: ``thread`` in
    this process, ``ray`` as Prefect tasks through prefect-ray (``sweep.ray_address``, else a local instance), each
    training run asking for ``sweep.ray_gpus_per_training_task`` GPUs (flows/placement.py). One MLflow parent run
    ``sweep`` groups them and the report; a failed run is left out of the comparison and the flow then fails
    naming it. Given ``methods`` alone, no variant trains.

    Args:
        params: The parameters; None reads params.yaml when the run starts.
        variants: Training variants to compare; empty: `sweep.variants` (none when only methods are given).
        seeds: Seeds each variant trains with and each method is evaluated with; empty: `sweep.seeds`.
        runner: Where the runs execute: `thread` (this process) or `ray`; empty: `sweep.runner`.
        overrides: Settings for this run only, one `key=value` each as `--set` takes them, e.g. `grpo.steps=4`.
        methods: Evaluated methods to compare (params.methods); empty: `sweep.methods`.
    """
    params = with_overrides(params, overrides)
    settings = _settings(params, variants, seeds, runner, methods)
    runs = {seed: seed_params(params, seed) for seed in settings.seeds}
    jobs = [("train", variant, seed) for seed in settings.seeds for variant in settings.variants]
    jobs += [("eval", method, seed) for seed in settings.seeds for method in settings.methods]
    tags = {"variants": ",".join(settings.variants), "methods": ",".join(settings.methods),
            "seeds": ",".join(map(str, settings.seeds)), "runner": settings.runner}
    with tracking(params, "sweep", tags=tags) as parent:
        with task_runner(settings.runner, settings) as pool:
            futures = {}
            for stage, name, seed in jobs:
                key = "variant" if stage == "train" else "method"
                # a variant's trained policy is evaluated once this sweep has trained it (same seed)
                upstream = [futures[("train", name, seed)]] if ("train", name, seed) in futures else []
                with ray_placement(STAGES[stage], settings, settings.runner):  # a GPU slot for training on Ray
                    futures[(stage, name, seed)] = pool.submit(
                        STAGES[stage], parameters={"params": runs[seed], key: name, "parent_run_id": parent.run_id},
                        wait_for=upstream)
            failed: list[str] = []
            for (stage, name, seed), future in futures.items():
                try:
                    future.result()
                except Exception as exc:  # noqa: BLE001 - a failed run is named, the others still compared
                    failed.append(f"{name}@seed_{seed}")
                    print(f"sweep run {failed[-1]} failed: {type(exc).__name__}: {exc}")

        def finished(stage: str, names: list[str]) -> dict[str, list[str]]:
            done = {name: [str(seed_dir(sweep_dir(params), seed) / stage / name) for seed in settings.seeds
                           if f"{name}@seed_{seed}" not in failed] for name in names}
            return {name: folders for name, folders in done.items() if folders}

        trained, evaluated = finished("train", settings.variants), finished("eval", settings.methods)
        parent.log_metrics({"runs": len(jobs), "runs_failed": len(failed)})
        metrics = (report(params, runs=trained, methods=evaluated, parent_run_id=parent.run_id).metrics
                   if trained or evaluated else {})
        if failed:
            raise RuntimeError(f"{len(failed)} of {len(jobs)} sweep runs failed: {', '.join(failed)} (errors above); "
                               "the report compares the others")
    return metrics


def main() -> None:
    parser: argparse.ArgumentParser = stage_argparser(__doc__)
    parser.add_argument("--variants", nargs="+", default=None, help="variants to compare (default: sweep.variants)")
    parser.add_argument("--methods", nargs="+", default=None,
                        help="evaluated methods to compare (default: sweep.methods; alone, no variant trains)")
    parser.add_argument("--seeds", nargs="+", type=int, default=None, help="seeds per run (default: sweep.seeds)")
    parser.add_argument("--runner", choices=["thread", "ray"], default=None, help="default: sweep.runner")
    args = parser.parse_args()
    result: Any = sweep(params_from_args(args), variants=args.variants, seeds=args.seeds, runner=args.runner,
                        methods=args.methods)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    run_stage(main)
