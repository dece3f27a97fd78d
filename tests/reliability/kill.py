"""Kill -9 harness: run a stage's command as a subprocess, SIGKILL it at a chosen point, run the same command
again to resume, and compare what it left with an uninterrupted run of the same command in another out_dir.

A :class:`Case` is one stage command (``python -m tasks.collect ...``) under ``--profile paper --overlay smoke``
with fixed seeds, the folders under ``run.out_dir`` it writes, and how to count the records it has written so
far (finished questions, episodes, optimizer steps with a checkpoint). A :class:`KillPoint` is when to kill:
after the k-th record appears (event-based, reproducible) or after a number of seconds drawn from a seeded RNG.
Only the stage's own process gets SIGKILL, as the OOM killer or ``kill -9 <pid>`` would do it; what it started
(a temporary Prefect server) is left running, and must be gone once the resumed run ends. A data-parallel case
(``victim``: a rank) runs its stage under ``torchrun`` and SIGKILLs that one rank's worker instead: the launcher and
the other ranks must then stop on their own, and how long they took after the kill is recorded.

    base = build_inputs(tmp / "base", ["sft", "index"])          # the upstream stages, once
    outcomes = kill_matrix(case, base, tmp / case.name, [[KillPoint(after=1)], [KillPoint(fraction=0.5)]])
    outcome = outcomes[0]                                        # killed after its first record, then resumed
    assert outcome.identical, outcome.differences

:func:`compare_trees` compares every file of the two runs' folders by type: JSONL records (count, duplicate ids,
content), JSON, CSV, parquet and markdown tables, safetensors and torch files tensor by tensor, anything else
byte for byte. Wall-clock fields (:func:`wall_clock`) are left out; they are the only thing allowed to differ.
"""

from __future__ import annotations

import json
import math
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parents[2]
SMOKE = ["--profile", "paper", "--overlay", "smoke"]
DATA = ["data.source=world", "data.n_train=3", "data.n_dev=1", "data.n_test=3"]
"""The generated world (no benchmark files needed) with three training and test questions (the smoke overlay has
one or two): something to kill in between."""
PARAMS = "params.yaml"
"""Each workspace's copy of params.yaml, taken when its inputs were built: every run of a comparison reads the
same settings while the checkout's file changes under it."""

WALL_CLOCK_KEYS = {"wall_s", "agent_s", "s_per_question", "s_per_point", "sessions_s", "resumed", "elapsed_s",
                   "latency_s"}
WALL_CLOCK_PREFIXES = ("time/", "memory/", "timings")
WALL_CLOCK_FILES = {"timings.json"}
"""What may differ between a killed-and-resumed run and an uninterrupted one: wall times, memory readings, and
how many items the resumed invocation skipped."""


def wall_clock(key: str) -> bool:
    return key in WALL_CLOCK_KEYS or key.startswith(WALL_CLOCK_PREFIXES)


# -- cases and workspaces -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    """One stage command. ``args`` follow ``python``; ``sets`` are ``--set`` items besides out_dir/cache_dir;
    ``folders`` (under out_dir) are compared; ``progress(out_dir)`` counts the records written so far, a
    ``unit`` each."""

    name: str
    family: str
    args: tuple[str, ...]
    sets: tuple[str, ...]
    folders: tuple[str, ...]
    progress: Callable[[Path], int]
    unit: str
    timeout_s: float = 600
    unchecked: tuple[tuple[str, str], ...] = ()
    """(file name, top-level JSON key) pairs left out of the comparison, each with its reason in the case's
    definition: only state that a resumed run cannot be expected to reproduce and that no result reads."""
    victim: int | None = None
    """The rank (``RANK`` in a torchrun worker's environment) to SIGKILL instead of the command's own process."""
    env: tuple[tuple[str, str], ...] = ()
    """Environment variables the command runs with, beside :func:`environment`'s."""

    def command(self, ws: Workspace) -> list[str]:
        sets = [*DATA, *self.sets, f"run.out_dir={ws.out_dir}", f"run.cache_dir={ws.cache_dir}"]
        return [sys.executable, *self.args, "--params", str(ws.root / PARAMS), *SMOKE,
                *(x for s in sets for x in ("--set", s))]


@dataclass
class Workspace:
    """A run's out_dir (a copy of the upstream inputs) and its own cache_dir (response cache, shared dev_before),
    so nothing one run caches is read by the run it is compared with. The assembled models are linked.

    Runs that are compared run one after another at the same path and are then :meth:`park`-ed elsewhere: run keys
    hold paths under out_dir (the adapters a backend serves), so two runs are the same run only at one path."""

    root: Path

    @property
    def out_dir(self) -> Path:
        return self.root / "out"

    @property
    def cache_dir(self) -> Path:
        return self.root / "cache"

    def park(self, dest: Path) -> Workspace:
        """Move this finished run to ``dest`` (emptied first), freeing its path for the next run."""
        dest = Path(dest)
        if dest.exists():
            shutil.rmtree(dest)
        dest.parent.mkdir(parents=True, exist_ok=True)
        os.replace(self.root, dest)
        return Workspace(dest)

    @classmethod
    def fresh(cls, root: Path, base: Path | None = None, drop: tuple[str, ...] = ()) -> Workspace:
        """A new workspace at ``root`` holding a copy of ``base``/out without the folders ``drop`` (the outputs of
        the stage about to run: an upstream build may have written them with other settings)."""
        ws = cls(Path(root))
        if ws.root.exists():
            shutil.rmtree(ws.root)
        ws.cache_dir.mkdir(parents=True)
        models = ROOT / ".cache" / "models"
        models.mkdir(parents=True, exist_ok=True)
        (ws.cache_dir / "models").symlink_to(models, target_is_directory=True)
        if base is not None:
            shutil.copyfile(Path(base) / PARAMS, ws.root / PARAMS)
        else:  # the committed file: another session's unfinished edit of the checkout's is not a setting of ours
            head = subprocess.run(["git", "show", f"HEAD:{PARAMS}"], cwd=ROOT, capture_output=True, check=False)
            (ws.root / PARAMS).write_bytes(head.stdout if head.returncode == 0 else (ROOT / PARAMS).read_bytes())
        if base is not None:
            shutil.copytree(Path(base) / "out", ws.out_dir, symlinks=True)
            for folder in drop:
                shutil.rmtree(ws.out_dir / folder, ignore_errors=True)
        else:
            ws.out_dir.mkdir()
        return ws


def environment(extra: tuple[tuple[str, str], ...] = ()) -> dict[str, str]:
    env = dict(os.environ)
    env.update({"RUBRICFLOW_MLFLOW": "0", "PYTHONPATH": str(ROOT), "TOKENIZERS_PARALLELISM": "false",
                "PYTHONUNBUFFERED": "1", **dict(extra)})
    env.pop("PREFECT_API_URL", None)  # a flow starts its own temporary server, as a user's run would
    return env


def build_inputs(root: Path, targets: list[str], sets: list[str] = ()) -> Workspace:
    """The upstream stages ``targets`` (and theirs) of the smoke DAG into ``root``/out, with :data:`DATA`. Given
    only ``prepare`` and ``index``, they run as their modules, without the flow's temporary Prefect server."""
    ws = Workspace.fresh(root)
    items = [*DATA, *sets, f"run.out_dir={ws.out_dir}", f"run.cache_dir={ws.cache_dir}"]
    overrides = ["--params", str(ws.root / PARAMS), *(x for s in items for x in ("--set", s))]
    if set(targets) <= {"prepare", "index"}:
        for stage in ("prepare", "index"):
            _run([sys.executable, "-m", f"tasks.{stage}", *SMOKE, *overrides], ws.root / "inputs.log", 600)
    else:
        _run([sys.executable, "-m", "flows.pipeline", *SMOKE, "--targets", *targets, *overrides],
             ws.root / "inputs.log", 900)
    return ws


# -- running, killing, resuming ------------------------------------------------------------------------------


@dataclass(frozen=True)
class KillPoint:
    """Kill after ``after`` records exist, after ``seconds`` of running, or after ``fraction`` of the uninterrupted
    run's wall time (:meth:`random` draws one; :func:`kill_matrix` turns it into seconds)."""

    after: int | None = None
    seconds: float | None = None
    fraction: float | None = None

    @classmethod
    def random(cls, rng: random.Random, low: float = 0.2, high: float = 0.6) -> KillPoint:
        # well before the end: a killed run, restarted on a busier machine, can finish sooner than its reference
        return cls(fraction=round(rng.uniform(low, high), 3))

    def timed(self, reference_s: float) -> KillPoint:
        return KillPoint(seconds=round(self.fraction * reference_s, 1)) if self.fraction is not None else self

    def describe(self, unit: str) -> str:
        if self.after is not None:
            return f"after {unit} {self.after}"
        if self.seconds is not None:
            return f"at {self.seconds:.1f} s"
        return f"at {self.fraction:.0%} of the run"


@dataclass
class Kill:
    """What one kill did: whether the process was still running to be killed, when, how many records existed
    then, and which of its descendants outlived it."""

    point: KillPoint
    killed: bool
    at_s: float
    records: int
    survivors: list[int] = field(default_factory=list)
    stop_s: float | None = None  # a rank killed: from the kill to the command's exit


@dataclass
class Outcome:
    case: str
    kills: list[Kill]
    records_resumed: int
    records_reference: int
    differences: list[str]
    orphans: list[str]

    @property
    def identical(self) -> bool:
        return not self.differences

    def row(self, unit: str) -> dict[str, Any]:
        return {"stage": self.case, "unit": unit,
                "kill_points": [k.point.describe(unit) for k in self.kills],
                "killed": [k.killed for k in self.kills], "killed_at_s": [round(k.at_s, 1) for k in self.kills],
                "records_at_kill": [k.records for k in self.kills],
                "survivors_after_kill": [len(k.survivors) for k in self.kills],
                "stop_after_kill_s": [k.stop_s for k in self.kills if k.stop_s is not None],
                "records_after_resume": self.records_resumed,
                "records_uninterrupted": self.records_reference, "identical": self.identical,
                "differences": self.differences, "orphans": self.orphans}


def _tail(path: Path, chars: int = 3000) -> str:
    return path.read_text(errors="replace")[-chars:] if path.exists() else ""


def _run(cmd: list[str], log: Path, timeout: float, env: tuple[tuple[str, str], ...] = ()) -> None:
    with log.open("a") as out:
        out.write(f"$ {' '.join(cmd)}\n")
        out.flush()
        proc = subprocess.Popen(cmd, cwd=ROOT, env=environment(env), stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            _kill_group(proc.pid)
            proc.wait()
            raise RuntimeError(f"timed out after {timeout} s: {' '.join(cmd)}\n{_tail(log)}") from None
        finally:
            _kill_group(proc.pid)  # nothing it started outlives a finished run of the harness
    if rc != 0:
        raise RuntimeError(f"exit {rc}: {' '.join(cmd)}\n{_tail(log)}")


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def run_to_end(case: Case, ws: Workspace) -> None:
    """Run ``case`` in ``ws`` to completion (it resumes whatever ``ws`` holds); raises with the log's tail."""
    _run(case.command(ws), ws.root / "run.log", case.timeout_s, case.env)


def _descendants(proc: psutil.Process, seen: dict[int, float]) -> None:
    try:
        for child in proc.children(recursive=True):
            try:
                seen.setdefault(child.pid, child.create_time())
            except psutil.Error:
                pass
    except psutil.Error:
        pass


def alive(identities: dict[int, float]) -> list[int]:
    """The pids of ``identities`` (pid -> start time: a reused pid is another process) still running, not zombies."""
    out = []
    for pid, created in identities.items():
        try:
            p = psutil.Process(pid)
            if p.create_time() == created and p.status() != psutil.STATUS_ZOMBIE:
                out.append(pid)
        except psutil.Error:
            pass
    return sorted(out)


def run_killed(case: Case, ws: Workspace, point: KillPoint, tracked: dict[int, float] | None = None) -> Kill:
    """Start ``case`` in ``ws`` and SIGKILL its process (only it) at ``point``. Every descendant seen while it
    ran is added to ``tracked`` (pid -> start time) so that :func:`resume_and_compare` can check it is gone."""
    tracked = {} if tracked is None else tracked
    log = ws.root / "run.log"
    cmd = case.command(ws)
    with log.open("a") as out:
        out.write(f"$ {' '.join(cmd)}   # to be killed {point.describe(case.unit)}\n")
        out.flush()
        started = time.perf_counter()
        proc = subprocess.Popen(cmd, cwd=ROOT, env=environment(case.env), stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
        me = psutil.Process(proc.pid)
        tracked[proc.pid] = me.create_time()
        killed = False
        while time.perf_counter() - started < case.timeout_s:
            _descendants(me, tracked)
            if proc.poll() is not None:
                break
            elapsed = time.perf_counter() - started
            due = (point.after is not None and case.progress(ws.out_dir) >= point.after) or \
                (point.seconds is not None and elapsed >= point.seconds)
            target = proc.pid if case.victim is None else _rank(me, case.victim)
            if due and target is not None:  # a rank not started yet is killed once it is there
                _descendants(me, tracked)
                os.kill(target, signal.SIGKILL)
                killed = True
                break
            time.sleep(0.02)
        else:
            _kill_group(proc.pid)
            raise RuntimeError(f"{case.name}: kill point {point.describe(case.unit)} not reached in "
                               f"{case.timeout_s} s\n{_tail(log)}")
        kill_at = time.perf_counter()
        try:
            proc.wait(timeout=case.timeout_s)  # a rank killed: the launcher must stop the others and exit
        except subprocess.TimeoutExpired:
            _kill_group(proc.pid)
            raise RuntimeError(f"{case.name}: still running {case.timeout_s} s after rank {case.victim} was "
                               f"killed\n{_tail(log)}") from None
        at = time.perf_counter() - started
        stop = round(time.perf_counter() - kill_at, 1) if killed and case.victim is not None else None
        out.write(f"# {'killed' if killed else 'finished before the kill point'} at {at:.1f} s, rc {proc.returncode}"
                  f"{f', stopped {stop} s after the kill' if stop is not None else ''}\n")
    if not killed and proc.returncode != 0:
        raise RuntimeError(f"exit {proc.returncode} before the kill point: {' '.join(cmd)}\n{_tail(log)}")
    time.sleep(0.2)  # let children that die with their parent go
    return Kill(point, killed, at, case.progress(ws.out_dir), alive({p: c for p, c in tracked.items()
                                                                         if p != proc.pid}), stop)


def _rank(launcher: psutil.Process, rank: int) -> int | None:
    """The pid of the torchrun worker of ``rank`` under ``launcher`` (its ``RANK``), None until it has started."""
    try:
        children = launcher.children(recursive=True)
    except psutil.Error:
        return None
    for child in children:
        try:
            if child.environ().get("RANK") == str(rank):
                return child.pid
        except psutil.Error:
            pass
    return None


def resume_and_compare(case: Case, got: Workspace, ref: Workspace, kills: list[Kill],
                       tracked: dict[int, float] | None = None, grace_s: float = 10) -> Outcome:
    """Run ``case`` to completion in ``got`` (resuming), compare its folders with ``ref``'s, and check that no
    process started by a killed run (``tracked``) or by the resume outlives it (``grace_s`` allowed for a
    server that was sent SIGTERM to exit). Orphans found are killed after being recorded."""
    tracked = dict(tracked or {})
    log = got.root / "run.log"
    cmd = case.command(got)
    with log.open("a") as out:
        out.write(f"$ {' '.join(cmd)}   # resume\n")
        out.flush()
        proc = subprocess.Popen(cmd, cwd=ROOT, env=environment(case.env), stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
        me = psutil.Process(proc.pid)
        deadline = time.perf_counter() + case.timeout_s
        while proc.poll() is None and time.perf_counter() < deadline:
            _descendants(me, tracked)
            time.sleep(0.05)
        if proc.poll() is None:
            _kill_group(proc.pid)
            raise RuntimeError(f"{case.name}: the resumed run timed out\n{_tail(log)}")
    if proc.returncode != 0:
        raise RuntimeError(f"{case.name}: the resumed run exited {proc.returncode}\n{_tail(log)}")
    end = time.perf_counter() + grace_s
    while (left := alive(tracked)) and time.perf_counter() < end:
        time.sleep(0.25)
    orphans = []
    for pid in left:
        try:
            orphans.append(f"{pid} {' '.join(psutil.Process(pid).cmdline())[:120]}")
            os.kill(pid, signal.SIGKILL)
        except psutil.Error:
            pass
    differences = []
    for folder in case.folders:
        differences += compare_trees(ref.out_dir / folder, got.out_dir / folder, folder, case.unchecked)
    return Outcome(case.name, kills, case.progress(got.out_dir), case.progress(ref.out_dir), differences, orphans)


# -- counting records ------------------------------------------------------------------------------------


def count_lines(*parts: str) -> Callable[[Path], int]:
    """Complete lines of the JSONL file at ``parts`` under out_dir (a torn last line is not a record)."""

    def count(out_dir: Path) -> int:
        path = out_dir.joinpath(*parts)
        try:
            return path.read_bytes().count(b"\n")
        except FileNotFoundError:
            return 0

    return count


def checkpoint_step(*parts: str) -> Callable[[Path], int]:
    """The step of the checkpoint ``latest`` names in the checkpoint root at ``parts`` (0 before the first)."""

    def step(out_dir: Path) -> int:
        try:
            name = out_dir.joinpath(*parts, "latest").read_text().strip()
        except (FileNotFoundError, OSError):
            return 0
        return int(name.removeprefix("step_")) if name.startswith("step_") else 0

    return step


def total(*counts: Callable[[Path], int]) -> Callable[[Path], int]:
    return lambda out_dir: sum(c(out_dir) for c in counts)


# -- comparing outputs -----------------------------------------------------------------------------------


def _strip(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _strip(v) for k, v in value.items() if not wall_clock(k)}
    if isinstance(value, list):
        return [_strip(v) for v in value]
    return value


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


def _first_difference(a: Any, b: Any, where: str = "") -> str:
    if isinstance(a, dict) and isinstance(b, dict):
        if a.keys() != b.keys():
            return f"{where or '.'}: keys {sorted(set(a) ^ set(b))[:4]} in one only"
        for k in a:
            if not _same(a[k], b[k]):
                return _first_difference(a[k], b[k], f"{where}.{k}")
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b)):
            if not _same(x, y):
                return _first_difference(x, y, f"{where}[{i}]")
    return f"{where or '.'}: {str(a)[:80]!r} != {str(b)[:80]!r}"


def record_id(record: Any) -> Any:
    """A JSONL record's identity: its question (and depth, for a branching point), else its id, else itself."""
    if isinstance(record, dict):
        if "question_id" in record:
            return (record["question_id"], record.get("depth"))
        if "id" in record:
            return record["id"]
    return json.dumps(record, sort_keys=True)


def _jsonl(path: Path) -> list[Any]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def compare_jsonl(ref: Path, got: Path, name: str) -> list[str]:
    """Records by id: lost, duplicated (more copies than the uninterrupted run holds: some logs hold an id once per
    group), extra, then content in file order."""
    a, b = _jsonl(ref), _jsonl(got)
    count_a, count_b = Counter(record_id(r) for r in a), Counter(record_id(r) for r in b)
    out = []
    dup = [k for k in count_b if count_b[k] > count_a[k] > 0]
    if dup:
        out.append(f"{name}: {len(dup)} duplicated record(s), e.g. {dup[0]}")
    lost = [k for k in count_a if count_b[k] < count_a[k]]
    if lost:
        out.append(f"{name}: {len(lost)} record(s) lost, e.g. {min(map(str, lost))}")
    extra = [k for k in count_b if count_a[k] == 0]
    if extra:
        out.append(f"{name}: {len(extra)} record(s) not in the uninterrupted run")
    if not out:
        for r, mine in zip(a, b):
            if not _same(_strip(r), _strip(mine)):
                out.append(f"{name}: record {record_id(r)} differs at {_first_difference(_strip(r), _strip(mine))}")
                break
    return out


def _table_difference(a, b, name: str) -> list[str]:
    import pandas as pd

    a = a[[c for c in a.columns if not wall_clock(str(c))]]
    b = b[[c for c in b.columns if not wall_clock(str(c))]]
    try:
        pd.testing.assert_frame_equal(a.reset_index(drop=True), b.reset_index(drop=True), check_exact=True)
    except AssertionError as exc:
        return [f"{name}: {' '.join(str(exc).split())[:200]}"]
    return []


def _tensors_difference(a: dict, b: dict, name: str) -> list[str]:
    import torch

    if a.keys() != b.keys():
        return [f"{name}: tensors {sorted(set(a) ^ set(b))[:3]} in one only"]
    for k, tensor in a.items():
        if not torch.equal(tensor, b[k]):
            gap = (tensor.double() - b[k].double()).abs().max().item() if tensor.shape == b[k].shape else "shape"
            return [f"{name}: tensor {k} differs (max abs {gap})"]
    return []


def _torch_objects_same(a: Any, b: Any) -> bool:
    import torch

    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_torch_objects_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_torch_objects_same(x, y) for x, y in zip(a, b))
    return _same(a, b)


def markdown_without_wall_clock(text: str) -> list[Any]:
    """A markdown page as its lines, each pipe table as rows of {header: cell} without wall-clock columns."""
    out: list[Any] = []
    header: list[str] | None = None
    for line in text.splitlines():
        if not line.startswith("|"):
            header = None
            out.append(line)
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if header is None:
            header = cells
        elif not all(set(c) <= set(":-") for c in cells):  # not the separator row
            out.append({h: c for h, c in zip(header, cells) if not wall_clock(h)})
    return out


def compare_file(ref: Path, got: Path, name: str, unchecked: tuple[tuple[str, str], ...] = ()) -> list[str]:
    suffix = ref.suffix
    if suffix == ".md":
        a, b = markdown_without_wall_clock(ref.read_text()), markdown_without_wall_clock(got.read_text())
        return [] if a == b else [f"{name}: {_first_difference(a, b)}"]
    if suffix == ".jsonl":
        return compare_jsonl(ref, got, name)
    if suffix == ".json":
        if ref.name == "manifest.json":  # the sha256 of each file: compared file by file instead
            a, b = json.loads(ref.read_text()), json.loads(got.read_text())
            return [] if sorted(a["files"]) == sorted(b["files"]) else [f"{name}: different file lists"]
        a, b = _strip(json.loads(ref.read_text())), _strip(json.loads(got.read_text()))
        for config in (a, b):
            for key in (key for file, key in unchecked if file == ref.name and isinstance(config, dict)):
                config.pop(key, None)
        if ref.name == "adapter_config.json":  # peft writes this set in the process's string-hash order
            for config in (a, b):
                if isinstance(config.get("target_modules"), list):
                    config["target_modules"] = sorted(config["target_modules"])
        return [] if _same(a, b) else [f"{name}: {_first_difference(a, b)}"]
    if suffix == ".csv":
        import pandas as pd

        return _table_difference(pd.read_csv(ref), pd.read_csv(got), name)
    if suffix == ".parquet":
        import pandas as pd

        return _table_difference(pd.read_parquet(ref), pd.read_parquet(got), name)
    if suffix == ".safetensors":
        from safetensors.torch import load_file

        return _tensors_difference(load_file(str(ref)), load_file(str(got)), name)
    if suffix == ".pt":
        import torch

        a = torch.load(ref, map_location="cpu", weights_only=True)
        b = torch.load(got, map_location="cpu", weights_only=True)
        return [] if _torch_objects_same(a, b) else [f"{name}: torch objects differ"]
    return [] if ref.read_bytes() == got.read_bytes() else [f"{name}: bytes differ"]


def _files(root: Path) -> dict[str, Path]:
    if not root.exists():
        return {}
    return {str(p.relative_to(root)): p for p in sorted(root.rglob("*"))
            if p.is_file() and not p.is_symlink() and p.name not in WALL_CLOCK_FILES}


def compare_trees(ref: Path, got: Path, label: str = "", unchecked: tuple[tuple[str, str], ...] = ()) -> list[str]:
    """Every difference between the files under ``ref`` and ``got`` (see the module docstring); [] if none.
    ``unchecked``: :attr:`Case.unchecked`."""
    a, b = _files(ref), _files(got)
    label = f"{label}/" if label else ""
    out = [f"{label}{p}: missing after resume" for p in sorted(set(a) - set(b))]
    out += [f"{label}{p}: not in the uninterrupted run" for p in sorted(set(b) - set(a))]
    for rel in sorted(set(a) & set(b)):
        out += compare_file(a[rel], b[rel], f"{label}{rel}", unchecked)
    return out


def kill_matrix(case: Case, base: Workspace, root: Path, runs: list[list[KillPoint]]) -> list[Outcome]:
    """One uninterrupted run of ``case`` over ``base``'s outputs, then one run per entry of ``runs``, killed at
    each of its points in turn (a ``fraction`` point: that share of the uninterrupted run's wall time) (each restart resumes the previous one) and resumed to the end; an
    :class:`Outcome` per entry. Every run executes at ``root``/live; the finished ones are parked beside it."""
    root = Path(root)
    ref = Workspace.fresh(root / "live", base.root, case.folders)
    started = time.perf_counter()
    run_to_end(case, ref)
    reference_s = time.perf_counter() - started
    ref = ref.park(root / "uninterrupted")
    outcomes = []
    for i, points in enumerate(runs):
        got = Workspace.fresh(root / "live", base.root, case.folders)
        tracked: dict[int, float] = {}
        kills = [run_killed(case, got, point.timed(reference_s), tracked) for point in points]
        outcomes.append(resume_and_compare(case, got, ref, kills, tracked))
        got.park(root / f"killed_{i}")
    return outcomes
