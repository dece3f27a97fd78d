"""The newcomer's clock (issue 49.7): what a new user waits for, from a clean clone of this repository's HEAD, on
this machine. The README's three commands (setup, cold and warm; the tests; the main job), each timed whole with
its peak memory.

Run (about 75 minutes on 2 cores; leave the machine otherwise idle if the times are to be compared)::

    python perf/bench_newcomer.py [--work /tmp/newcomer] [--phases setup setup_warm tests main] \\
        [--out perf/results/newcomer.json]
    python perf/bench_newcomer.py --report-only --work /tmp/newcomer   # the table and JSON from a run's files
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import re
import shutil
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

from components.io import JsonlAppender, iter_json_objects, read_json, write_json

REPO = Path(__file__).resolve().parents[1]
SETUP = "bash scripts/setup.sh"
TESTS = ".venv/bin/python -m pytest -q"
MAIN = ".venv/bin/python -m flows.pipeline"
PHASES = {"setup": SETUP, "setup_warm": SETUP, "tests": TESTS, "main": MAIN}
"""Phase -> the README's command it times (tests/test_perf_newcomer.py holds them to the README and .ci/run)."""
TARGETS_S = {"setup": 12 * 60, "main": 60 * 60}


def parse_time_v(text: str) -> dict:
    """Wall seconds and peak RSS (MiB) from GNU time's ``-v`` report; absent fields are left out."""
    out: dict = {}
    if m := re.search(r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): ([\d:.]+)", text):
        seconds = 0.0
        for part in m.group(1).split(":"):
            seconds = seconds * 60 + float(part)
        out["wall_s"] = round(seconds, 1)
    if m := re.search(r"Maximum resident set size \(kbytes\): (\d+)", text):
        out["peak_rss_mib"] = round(int(m.group(1)) / 1024, 1)
    if m := re.search(r"Exit status: (\d+)", text):
        out["exit_status"] = int(m.group(1))
    return out


def pytest_summary(log: str) -> str:
    """pytest's last summary line (``1225 passed, 54 deselected in 807.12s (0:13:27)``), or ''."""
    found = re.findall(r"^=*\s*(\d+ (?:passed|failed|error).*?)\s*=*$", log, flags=re.MULTILINE)
    return found[-1] if found else ""


def stage_times(db: Path) -> list[dict]:
    """The stages of the newest ``pipeline`` run in an MLflow sqlite store, in the order they ended: name, minutes
    from the pipeline's start to its end, and its wall seconds. The flow runs its stages one after another, and a
    stage opens its MLflow run when it has something to log (evaluate only once its episodes are done), so a stage's
    time is from the end of the one before it (the pipeline's start for the first) to its own end. Read with sqlite3
    (the store's own tables), so reading a clone's store neither migrates nor locks it."""
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as con:
        parent = con.execute("SELECT run_uuid, start_time FROM runs WHERE name = 'pipeline' "
                             "ORDER BY start_time DESC LIMIT 1").fetchone()
        if parent is None:
            return []
        rows = con.execute(
            "SELECT r.name, r.end_time, r.status FROM runs r JOIN tags t ON t.run_uuid = r.run_uuid "
            "WHERE t.key = 'mlflow.parentRunId' AND t.value = ? ORDER BY r.end_time", (parent[0],)).fetchall()
    stages, previous = [], parent[1]
    for name, end, status in rows:
        if end is None:  # still running, or killed
            stages.append({"stage": name, "end_s": None, "wall_s": None, "status": status})
            continue
        stages.append({"stage": name, "end_s": round((end - parent[1]) / 1000, 1),
                       "wall_s": round((end - previous) / 1000, 1), "status": status})
        previous = end
    return stages


def pip_cache_state() -> str:
    """Whether pip's wheel cache held anything (the clone builds everything else itself)."""
    out = subprocess.run([sys.executable, "-m", "pip", "cache", "dir"], capture_output=True, text=True, check=False).stdout.strip()
    folder = Path(out) if out else Path.home() / ".cache" / "pip"
    return "warm" if folder.is_dir() and any(folder.iterdir()) else "cold"


def clone(work: Path) -> str:
    """A fresh clone of HEAD at ``<work>/main`` and a copy of ``../shared`` beside it; the clone's commit."""
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    subprocess.run(["git", "clone", "--quiet", "--no-hardlinks", str(REPO), str(work / "main")], check=True)
    shared = REPO.parent / "shared"
    if shared.is_dir():
        shutil.copytree(shared, work / "shared")
    return subprocess.run(["git", "-C", str(work / "main"), "rev-parse", "--short", "HEAD"], capture_output=True,
                          text=True, check=True).stdout.strip()


def run_phase(work: Path, phase: str) -> dict:
    """Run one phase's command in the clone under GNU time, logging to ``<work>/<phase>.log``."""
    started = dt.datetime.now(dt.UTC)
    load = os.getloadavg()[0]
    with open(work / f"{phase}.log", "w") as log:
        rc = subprocess.run(["/usr/bin/time", "-v", "-o", str(work / f"{phase}.time"), "bash", "-c", PHASES[phase]],
                            cwd=work / "main", stdout=log, stderr=subprocess.STDOUT, check=False).returncode
    record = {"phase": phase, "command": PHASES[phase], "rc": rc, "start": started.isoformat(timespec="seconds"),
              "end": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
              "load_before": round(load, 2), "load_after": round(os.getloadavg()[0], 2)}
    with JsonlAppender(work / "phases.jsonl") as phases:
        phases.append(record)
    return record


def report(work: Path) -> dict:
    """The result from ``<work>``'s files: each phase's last run, the main job's stages and the judged rows."""
    records: dict[str, dict] = {}
    if (work / "phases.jsonl").exists():
        for _, rec in iter_json_objects(work / "phases.jsonl"):
            records[rec["phase"]] = rec
    phases = []
    for phase, record in records.items():
        timing = work / f"{phase}.time"
        entry = {**record, **(parse_time_v(timing.read_text()) if timing.exists() else {})}
        if phase == "tests" and (work / "tests.log").exists():
            entry["summary"] = pytest_summary((work / "tests.log").read_text())
        phases.append(entry)
    db = work / "main" / "mlflow.db"
    stages = stage_times(db) if db.exists() else []
    rows = []
    for phase, target in TARGETS_S.items():
        entry = next((p for p in phases if p["phase"] == phase), None)
        if entry is None or "wall_s" not in entry:
            continue
        ok = entry["rc"] == 0
        rows.append({"measure": f"{phase} ({PHASES[phase]}) from a clean clone" + ("" if ok else f", rc {entry['rc']}"),
                     "value": round(entry["wall_s"] / 60, 1), "unit": "min",
                     "figures": f"peak RSS {entry.get('peak_rss_mib', 0) / 1024:.1f} GB, load {entry['load_before']} "
                                f"-> {entry['load_after']}",
                     "target": f"<= {target // 60} min", "met": ok and entry["wall_s"] <= target})
    meta = read_json(work / "run.json") if (work / "run.json").exists() else {}
    return {**meta, "cpu_count": os.cpu_count(), "rows": rows, "phases": phases, "stages": stages}


def table(result: dict) -> str:
    lines = [f"{'phase':<11} {'rc':>3} {'wall':>9} {'peak RSS':>9}  {'load':<13} summary"]
    for p in result["phases"]:
        wall = f"{p['wall_s'] / 60:.1f} min" if "wall_s" in p else "-"
        rss = f"{p['peak_rss_mib'] / 1024:.1f} GB" if "peak_rss_mib" in p else "-"
        lines.append(f"{p['phase']:<11} {p['rc']:>3} {wall:>9} {rss:>9}  {p['load_before']} -> {p['load_after']:<5} "
                     f"{p.get('summary', '')}")
    if result["stages"]:
        lines += ["", f"{'main job stage':<20} {'wall':>10} {'ends at':>10}  status"]
        lines += [f"{s['stage']:<20} {(s['wall_s'] or 0) / 60:>6.1f} min {(s['end_s'] or 0) / 60:>6.1f} min  {s['status']}"
                  for s in result["stages"]]
    lines += [""] + [f"{r['measure']}: {r['value']} {r['unit']} (target {r['target']}: {'met' if r['met'] else 'NO'})"
                     for r in result["rows"]]
    return "\n".join(lines)


def main() -> None:
    """How it measures, and what it writes.

    - setup: ``bash scripts/setup.sh`` on the fresh clone (nothing built yet: llama.cpp, the venv, the embedded
      weights), then again on the set-up clone (warm: nothing left to build);
    - tests: ``.venv/bin/python -m pytest -q`` (the summary line is kept);
    - main: ``.venv/bin/python -m flows.pipeline``, with the time of each of its stages, read from the stage runs the
      flow records in the clone's MLflow store (``mlflow.db``: one child run per stage under the ``pipeline`` run; a
      stage's time runs from the end of the stage before it to its own end).

    Targets: setup from a cold build at most 12 minutes; the main job at most 60 minutes. pip's wheel cache is not
    the clone's: whether it held anything when the run began is recorded beside the times.

    The clone is ``<work>/main``, with a copy of ``../shared`` beside it (the benchmark subsets the tests read). Each
    phase writes ``<work>/<phase>.log`` and ``<work>/<phase>.time`` (GNU time's ``-v`` report) and appends a line to
    ``<work>/phases.jsonl`` (return code, start and end, load average), so ``--report-only`` rebuilds the result from
    a run that was stopped, or from phases run by hand with the same files. Prints a table and writes JSON: ``rows``
    (the judged measures), ``phases`` and ``stages`` (the main job's, in the order they ran).
    """
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", type=Path, default=Path("/tmp/newcomer"), help="the clone and the phases' files")
    parser.add_argument("--phases", nargs="+", choices=list(PHASES), default=list(PHASES))
    parser.add_argument("--report-only", action="store_true", help="run nothing: report the files under --work")
    parser.add_argument("--out", type=Path, default=REPO / "perf" / "results" / "newcomer.json")
    args = parser.parse_args()
    if not args.report_only:
        cache = pip_cache_state()
        commit = clone(args.work)
        started = time.time()
        write_json(args.work / "run.json", {
            "date": dt.date.today().isoformat(), "commit": commit, "pip_wheel_cache_at_start": cache,
            "command": "python perf/bench_newcomer.py --phases " + " ".join(args.phases)})
        for phase in args.phases:
            print(f"== {phase}: {PHASES[phase]} (at {(time.time() - started) / 60:.1f} min)", flush=True)
            run_phase(args.work, phase)
    elif not (args.work / "phases.jsonl").exists():
        parser.error(f"--report-only: {args.work / 'phases.jsonl'} does not exist (no phase has run there)")
    result = report(args.work)
    print(table(result))
    write_json(args.out, result, sort_keys=False)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
