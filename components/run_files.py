"""Where a run's files live under ``run.out_dir``, how a run's folder is keyed to its settings (so a stage
resumes only a run of the same settings), and how trajectory files are written so that DVC sees the same
bytes when the same calls are made again.

    path = out_path(params.run, "data", "train.jsonl")          # outputs/data/train.jsonl, folder made
    resumed = keyed_folder(folder, settings)                    # True: same settings, resume what is there
    resumed = keyed_folder(folder, settings, ranks=ranks)       # on N ranks: rank 0 keys it, the others wait
    write_trajectories(folder / "dev.jsonl", trajectories)      # without wall-clock fields
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from components.io import write_jsonl
from components.params import RunParams
from components.params_section import ParamsError
from components.schemas import Trajectory

SFT_METHOD = "sft"  # the default warm start: params.methods.sft (ReAct, compact prompt; evaluates the sft stage)

logger = logging.getLogger(__name__)


def out_path(run: RunParams, *parts: str) -> Path:
    """``run.out_dir``/``parts``, its folder created."""
    path = Path(run.out_dir).joinpath(*parts)
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def record_path(run: RunParams, stage: str) -> Path:
    """Where stage ``stage`` (its DVC name: ``collect``, ``evaluate@sft``) keeps its response record
    (components/llm/response_record.py): ``run.out_dir``/responses/<stage, '@' as a folder>.jsonl, outside the
    stage's own folder, which a run under other settings empties."""
    *group, name = stage.split("@")
    return Path(run.out_dir).joinpath("responses", *group, f"{name}.jsonl")  # made on its first reply


def keep_record(run: RunParams, stage: str) -> Path:
    """Make sure a finished stage's response record exists (empty when it made no deterministic call), so DVC finds
    every output it declares; call it once the stage has succeeded."""
    from components.llm.response_record import ResponseRecord

    path = record_path(run, stage)
    ResponseRecord(path).keep()
    return path


def warm_start_stage(stage: str, method: str, methods: Mapping[str, Any]) -> str:
    """The name of the folder (the DVC stage's) that the warm-start stage ``stage`` (sft_data or sft) writes for the
    warm-start method ``method`` (an entry of ``methods``, params.methods, whose name starts with ``sft``):
    ``sft`` -> sft_data, sft; ``sft_scaffold`` -> sft_data_scaffold, sft_scaffold."""
    if stage not in ("sft_data", "sft"):
        raise ValueError(f"warm-start stages are sft_data and sft, not {stage!r}")
    if not method.startswith("sft") or method not in methods:
        raise ParamsError(f"warm-start method {method!r}: expected a params.methods entry named sft or sft_<name> "
                          f"(defined: {sorted(m for m in methods if m.startswith('sft'))})")
    return method if stage == "sft" else "sft_data" + method.removeprefix("sft")


def settings_digest(settings: dict) -> str:
    """The sha256 of ``settings`` as sorted JSON: a run's key (:func:`keyed_folder`) or its lineage."""
    return hashlib.sha256(json.dumps(settings, sort_keys=True, default=str).encode()).hexdigest()


def keyed_folder(folder: Path, settings: dict, *, adopt_unkeyed: bool = False, ranks: Any = None) -> bool:
    """Whether ``folder`` holds a run of exactly these ``settings`` (then the stage resumes it). Otherwise
    the folder is emptied and the new key written, so a run with other settings starts afresh instead of
    resuming (or returning) a checkpoint trained under different ones. ``adopt_unkeyed``: a non-empty folder
    with no key at all (written before its stage keyed its runs) is taken as this run's, with a warning, rather
    than emptied. ``ranks`` (:class:`components.training.distributed.Ranks`): on N data-parallel ranks rank 0 alone looks and writes, and every rank returns its
    answer once it has (so no rank writes into the folder before it is emptied)."""
    if ranks is not None and ranks.parallel:
        resumed = keyed_folder(folder, settings, adopt_unkeyed=adopt_unkeyed) if ranks.main else None
        return bool(ranks.broadcast(resumed))
    key = settings_digest(settings)
    key_file = folder / "run_key.json"
    if key_file.exists() and json.loads(key_file.read_text()) == {"run_key": key}:
        return True
    if adopt_unkeyed and not key_file.exists() and folder.is_dir() and any(folder.iterdir()):
        logger.warning("%s holds a run from before its stage keyed its runs: taken as this run's (delete the "
                       "folder to start afresh)", folder)
        key_file.write_text(json.dumps({"run_key": key}))
        return True
    if folder.exists():
        for child in folder.iterdir():
            shutil.rmtree(child) if child.is_dir() else child.unlink()
    folder.mkdir(parents=True, exist_ok=True)
    key_file.write_text(json.dumps({"run_key": key}))
    return False


def write_trajectories(path: Path, trajectories: Iterable[Trajectory]) -> None:
    """A trajectory file DVC versions: without wall-clock fields, so a re-run that makes the same calls writes
    the same bytes."""
    write_jsonl(path, [t.without_timings() for t in trajectories])
