"""What every stage shares: params loading with ``--set`` overrides, output paths, MLflow tracking, and
``run_stage`` for the ``__main__`` block (a user error exits 2 with one line, not a traceback).

MLflow tracks to SQLite (``run.mlflow_tracking_uri``) with ``run.mlflow_artifact_root`` as the artifact
root. ``RUBRICFLOW_MLFLOW=0`` swaps in a null tracker that records nothing (for unit tests).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from components.io import RecordError, write_jsonl
from components.params import Params, ParamsError, load_params
from components.schemas import Trajectory
from tasks.temporary_servers import reap_orphaned_servers

PARAMS_PATH = os.environ.get("RUBRICFLOW_PARAMS", "params.yaml")


def stage_argparser(doc: str | None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=(doc or "").splitlines()[0] if doc else None)
    parser.add_argument("--params", default=PARAMS_PATH, help="params file (default: params.yaml)")
    parser.add_argument("--profile", default=None, help="profile to apply (default: the file's)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override a parameter, e.g. --set data.source=hotpotqa (repeatable)")
    return parser


# Mistakes in what the user gave (an override, a params file, an input record), not bugs in the code.
USER_ERRORS: tuple[type[Exception], ...] = (ParamsError, RecordError)


def run_stage(main: Callable[[], object]) -> None:
    """Run a stage's or flow's ``main``; a user error exits with status 2 and one line on stderr, in
    argparse's form (``prepare.py: error: --set grpo.lrr=1: unknown key grpo.lrr``). Anything else
    keeps its traceback. Temporary Prefect servers left by killed runs are stopped first."""
    reaped = reap_orphaned_servers()
    if reaped:
        print(f"stopped {len(reaped)} temporary Prefect server(s) of killed runs: pids {reaped}", file=sys.stderr)
    try:
        main()
    except USER_ERRORS as exc:
        message = " ".join(str(exc).split())
        print(f"{Path(sys.argv[0]).name}: error: {message}", file=sys.stderr)
        raise SystemExit(2) from None


def release_memory() -> None:
    """Hand a finished training run's memory back to the OS. A process that runs several (a sweep's thread
    runner, a reused Ray worker) otherwise keeps the peak of each: glibc keeps freed torch buffers in its
    arenas, and the second GRPO run of one sweep process was killed for memory at 24 GB."""
    from components.training.process_memory import release

    release(min_growth_gb=0)


def write_trajectories(path: Path, trajectories: Iterable[Trajectory]) -> None:
    """A trajectory file DVC versions: without wall-clock fields, so a re-run that makes the same calls writes
    the same bytes."""
    write_jsonl(path, [t.without_timings() for t in trajectories])


def params_from_args(args: argparse.Namespace) -> Params:
    return load_params(args.params, args.profile, args.overrides)


def resolve(params: Params | None) -> Params:
    """A flow or task given None reads params.yaml now."""
    return params if params is not None else load_params(PARAMS_PATH)


def out_path(params: Params, *parts: str) -> Path:
    path = Path(params.run.out_dir).joinpath(*parts)
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


SFT_METHOD = "sft"  # the default warm start: params.methods.sft (ReAct, compact prompt; evaluates the sft stage)


def warm_start_folder(params: Params, stage: str, method: str) -> Path:
    """The folder the warm-start stage ``stage`` (sft_data or sft) writes for the warm-start method ``method``
    (a params.methods entry whose name starts with ``sft``): ``sft`` -> outputs/sft_data, outputs/sft;
    ``sft_scaffold`` -> outputs/sft_data_scaffold, outputs/sft_scaffold (each the DVC stage's name)."""
    if stage not in ("sft_data", "sft"):
        raise ValueError(f"warm-start stages are sft_data and sft, not {stage!r}")
    if not method.startswith("sft") or method not in params.methods:
        raise ParamsError(f"warm-start method {method!r}: expected a params.methods entry named sft or sft_<name> "
                          f"(defined: {sorted(m for m in params.methods if m.startswith('sft'))})")
    name = method if stage == "sft" else "sft_data" + method.removeprefix("sft")
    return Path(params.run.out_dir) / name


def settings_digest(settings: dict) -> str:
    """The sha256 of ``settings`` as sorted JSON: a run's key (:func:`keyed_folder`) or its lineage."""
    import hashlib

    return hashlib.sha256(json.dumps(settings, sort_keys=True, default=str).encode()).hexdigest()


def keyed_folder(folder: Path, settings: dict) -> bool:
    """Whether ``folder`` holds a run of exactly these ``settings`` (then the stage resumes it). Otherwise
    the folder is emptied and the new key written, so a run with other settings starts afresh instead of
    resuming (or returning) a checkpoint trained under different ones."""
    import shutil

    key = settings_digest(settings)
    key_file = folder / "run_key.json"
    if key_file.exists() and json.loads(key_file.read_text()) == {"run_key": key}:
        return True
    if folder.exists():
        for child in folder.iterdir():
            shutil.rmtree(child) if child.is_dir() else child.unlink()
    folder.mkdir(parents=True, exist_ok=True)
    key_file.write_text(json.dumps({"run_key": key}))
    return False


def flatten(data: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(data, dict):
        out: dict[str, Any] = {}
        for k, v in data.items():
            out.update(flatten(v, f"{prefix}{k}."))
        return out
    return {prefix.rstrip("."): data}


def mlflow_name(name: str) -> str:
    return re.sub(r"[^0-9A-Za-z_\-./: ]", "_", name).replace("__", "_").rstrip("_") or "_"


class NullTracker:
    run_id = None

    def log_params(self, params: dict) -> None: ...
    def log_metrics(self, metrics: dict, step: int | None = None) -> None: ...
    def log_artifact(self, path: str | Path, artifact_path: str | None = None) -> None: ...
    def log_table(self, data, artifact_file: str) -> None: ...
    def log_figure(self, figure, artifact_file: str) -> None: ...
    def set_tags(self, tags: dict) -> None: ...


class MlflowTracker(NullTracker):
    def __init__(self, mlflow, run):
        self.mlflow, self.run_id = mlflow, run.info.run_id

    def log_params(self, params: dict) -> None:
        flat = {k: (json.dumps(v) if isinstance(v, (list, dict)) else v) for k, v in flatten(params).items()}
        items = list(flat.items())
        for i in range(0, len(items), 100):  # MLflow caps a batch at 100 params
            self.mlflow.log_params(dict(items[i : i + 100]), run_id=self.run_id)

    def log_metrics(self, metrics: dict, step: int | None = None) -> None:
        # MLflow allows only alphanumerics and _-./: in names; role names like council_judges[0] have brackets
        numeric = {mlflow_name(k): float(v) for k, v in metrics.items()
                   if isinstance(v, (int, float)) and not isinstance(v, bool)}
        self.mlflow.log_metrics(numeric, step=step, run_id=self.run_id)

    def log_artifact(self, path, artifact_path=None) -> None:
        log = self.mlflow.log_artifacts if Path(path).is_dir() else self.mlflow.log_artifact
        log(str(path), artifact_path=artifact_path, run_id=self.run_id)

    def log_table(self, data, artifact_file: str) -> None:
        self.mlflow.log_table(data=data, artifact_file=artifact_file, run_id=self.run_id)

    def log_figure(self, figure, artifact_file: str) -> None:
        self.mlflow.log_figure(figure, artifact_file, run_id=self.run_id)

    def set_tags(self, tags: dict) -> None:
        for k, v in tags.items():
            self.mlflow.set_tag(k, v)


@contextlib.contextmanager
def tracking(params: Params, run_name: str, parent_run_id: str | None = None, tags: dict | None = None):
    """An MLflow run for a stage (nested under ``parent_run_id`` when given), or a null tracker."""
    if os.environ.get("RUBRICFLOW_MLFLOW", "1") == "0":
        yield NullTracker()
        return
    import mlflow

    mlflow.set_tracking_uri(params.run.mlflow_tracking_uri)
    experiment = mlflow.get_experiment_by_name(params.run.experiment)
    if experiment is None:
        root = Path(params.run.mlflow_artifact_root).resolve()
        root.mkdir(parents=True, exist_ok=True)
        experiment_id = mlflow.create_experiment(params.run.experiment, artifact_location=root.as_uri())
    else:
        experiment_id = experiment.experiment_id
    run_tags = {"stage": run_name, "profile": params.profile, **(tags or {})}
    if parent_run_id:
        run_tags["mlflow.parentRunId"] = parent_run_id
    client = mlflow.MlflowClient()
    run = client.create_run(experiment_id, run_name=run_name, tags=run_tags)
    tracker = MlflowTracker(mlflow, run)
    status = "FAILED"
    try:
        yield tracker
        status = "FINISHED"
    finally:
        client.set_terminated(run.info.run_id, status=status)


def load_toolbox(params: Params):
    """The agent toolbox over the prepared corpus and the built index (stale indexes are refused), in the
    ``retrieval.scope`` of params: an episode uses ``toolbox.for_question(question)``."""
    from components.io import read_jsonl
    from components.retrieval import load_index, make_toolbox
    from components.schemas import Document

    docs = read_jsonl(out_path(params, "data", "corpus.jsonl"), Document)
    index = load_index(out_path(params, "index", "manifest.json").parent, docs=docs)
    return make_toolbox(index, docs, top_k=params.retrieval.top_k, snippet_chars=params.retrieval.snippet_chars,
                        browse_chars=params.agent.observation_max_chars, scope=params.retrieval.scope)
