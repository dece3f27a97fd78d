"""The kill table (issue 48): every stage of tests/reliability/kill_cases.py killed with SIGKILL at each of its
kill points and resumed, against an uninterrupted run with the same seeds; writes the table as
docs/results/reliability_kill.md and the full outcomes (every difference found) as JSON beside it
(docs/results/reliability_kill.json, the page's figures).

    .venv/bin/python scripts/kill_table.py                        # every case (about an hour on 2 shared cores)
    .venv/bin/python scripts/kill_table.py --cases collect sft    # these cases again; the others' rows are kept

Each case runs under ``--profile paper --overlay smoke`` (tiny random Qwen2 served in process by transformers,
``RUBRICFLOW_MLFLOW=0``) in a work folder (default: a temporary one, removed at the end unless ``--keep``) over
inputs built once by the smoke DAG (sft, sft_scaffold, index). A case that cannot run (an upstream failure, a
run that exits with an error) is a row with its error, not a missing row.
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from components.reporting.figures import figures_line, figures_path
from tests.reliability.kill import DATA, build_inputs, kill_matrix
from tests.reliability.kill_cases import CASES, STEPS, UPSTREAM, kill_points


def commit() -> str:
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                          check=False)
    return head.stdout.strip() or "unknown"


def run_cases(names: list[str], work: Path) -> list[dict]:
    started = time.perf_counter()
    base = build_inputs(work / "base", UPSTREAM)
    print(f"inputs ({' '.join(UPSTREAM)}) built in {time.perf_counter() - started:.0f} s", flush=True)
    rows = []
    for name in names:
        case, t0 = CASES[name], time.perf_counter()
        try:
            outcomes = kill_matrix(case, base, work / name.replace("@", "_"), kill_points(case))
            new = [{**o.row(case.unit), "error": None} for o in outcomes]
            for row in new:
                row["unchecked"] = [f"{file}: {key}" for file, key in case.unchecked]
        except Exception as exc:  # noqa: BLE001 - a case that cannot run is a row saying why
            traceback.print_exc()
            new = [{"stage": name, "unit": case.unit, "kill_points": [], "killed": [], "records_at_kill": [],
                    "records_after_resume": None, "records_uninterrupted": None, "identical": False,
                    "differences": [], "orphans": [], "error": " ".join(str(exc).split())[:400]}]
        seconds = time.perf_counter() - t0
        for row in new:
            row["case_wall_s"] = round(seconds, 1)
            print(json.dumps(row), flush=True)
        rows += new
    return rows


def cell(values: list) -> str:
    return ", ".join(map(str, values)) if values else "-"


def page(rows: list[dict], wall_s: float, note: str | None = None, figures: str | None = None) -> str:
    cases = list(dict.fromkeys(r["stage"] for r in rows))
    ok = sum(r["identical"] and not r["orphans"] and not r["error"] for r in rows)
    runs: dict[tuple[str, str], list[str]] = {}  # (command, commit) -> its stages, in the order they appear
    for r in rows:
        runs.setdefault((r["command"], r["commit"]), []).append(r["stage"])
    missed = sum(not all(r["killed"]) for r in rows if not r["error"])
    lines = [
        "# Kill -9 anywhere: stages killed mid-run and resumed",
        "",
        (f"Written by `scripts/kill_table.py` on {datetime.now(UTC):%Y-%m-%d %H:%M} UTC; do not edit by "
         "hand. Commands (a partial run replaces its stages' rows), each with the commit HEAD was at when its rows "
         "were written (other sessions commit while a run goes on) and the stages whose rows it wrote:"),
        "",
        *(f"    {command}    # commit {sha}: {', '.join(dict.fromkeys(stages))}"
          for (command, sha), stages in runs.items()),
        "",
        *([figures, ""] if figures else []),
        (f"Size: {len(cases)} stages, {len(rows)} killed-and-resumed runs, each against one uninterrupted run of the "
        f"same command and seeds; `--profile paper --overlay smoke` (tiny random Qwen2, transformers in process, "
        f"fixed seeds) with `{' '.join('--set ' + d for d in DATA)}`, {STEPS} GRPO/SFT steps with a checkpoint "
        f"after each, 3 questions for collect and evaluate. Machine: {platform.machine()} CPU, 2 cores shared "
        f"with other work; {wall_s / 60:.0f} min of kill runs, inputs built once per command aside."),
        "",
        ("Each row is one run, killed with SIGKILL (its own process only, as the OOM killer would; for a `-2ranks` "
        "stage, which runs under `torchrun --nproc_per_node 2`, the worker of rank 1) at each kill point "
        "in turn, restarted after each kill with the same command, and compared with the uninterrupted run: every "
        "file of the stage's folder, JSONL records by id (lost, duplicated, changed), JSON and CSV metrics, "
        "parquet, checkpoint and adapter tensors, optimizer and RNG state, method state (ARBOR memory, RubricEM "
        "bank, ARCO mu: inside each checkpoint and the snapshots beside it). Wall-clock fields (`wall_s`, "
        "`time/*`, `memory/*`, timings.json) are left out; peft's `target_modules` list is compared as a set. "
        "Event points fire when the k-th record exists (the kill lands a poll later, so the count at the kill can "
        "be higher); timed points are a seeded share of the uninterrupted run's wall time. Orphans: processes "
        "the killed runs or the resume started that were still alive 10 s after the resume ended."),
        "",
        (f"**{ok} of {len(rows)} runs identical to the uninterrupted run with no orphan**" +
         (f" ({missed} of them ended before a kill point: not killed there)." if missed else ".")),
        "",
        ("| stage | record | kill points | records at each kill | after resume | uninterrupted | identical | orphans | "
         "differences, error, notes |"),
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        points = cell([f"{p} ({'killed' if k else 'ended first'})" for p, k in zip(r["kill_points"], r["killed"])])
        notes = r["error"] or "; ".join(r["differences"][:3]) + (" ..." if len(r["differences"]) > 3 else "")
        if any(r.get("survivors_after_kill") or []):
            notes = f"{notes}; " if notes else ""
            notes += (f"processes its kills left alive: {cell(r['survivors_after_kill'])}, "
                      f"{'all gone' if not r['orphans'] else 'not all gone'} after the resume")
        if r.get("stop_after_kill_s"):  # a data-parallel case: one rank's worker was the one killed
            notes = f"{notes}; " if notes else ""
            notes += (f"rank 1 of 2 killed: torchrun stopped the job {cell(r['stop_after_kill_s'])} s after each "
                      "kill, and 2 ranks resumed")
        if r.get("note"):
            notes = f"{notes}; {r['note']}" if notes else r["note"]
        lines.append(f"| {r['stage']} | {r['unit']} | {points} | {cell(r['records_at_kill'])} | "
                     f"{r['records_after_resume']} | {r['records_uninterrupted']} | "
                     f"{'yes' if r['identical'] and not r['error'] else 'no'} | {len(r['orphans'])} | "
                     f"{notes or '-'} |")
    for stage in cases:
        unchecked = next((r.get("unchecked") for r in rows if r["stage"] == stage and r.get("unchecked")), None)
        if unchecked:
            lines += ["", (f"Left out of the {stage} comparison: {', '.join(unchecked)}; the reason is with the "
                           "case in tests/reliability/kill_cases.py.")]
    if note:
        lines += ["", note]
    lines += ["", ("Records: collect counts finished questions (done.jsonl), evaluate finished episodes "
              "(trajectories.jsonl), sft and train_policy the step of the latest complete checkpoint, the sweep "
              "both of its runs' (its train_policy@grpo checkpoint step plus its evaluate@sft episodes)."), ""]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", nargs="+", choices=list(CASES), default=list(CASES))
    parser.add_argument("--work", type=Path, default=None, help="work folder (default: a temporary one)")
    parser.add_argument("--keep", action="store_true", help="keep the work folder")
    parser.add_argument("--json", type=Path, default=figures_path(ROOT / "docs" / "results" / "reliability_kill.md"),
                        help="the rows (the page's figures; beside the page, where it names them, by default)")
    parser.add_argument("--page", type=Path, default=ROOT / "docs" / "results" / "reliability_kill.md")
    parser.add_argument("--note", default=None, help="a paragraph for the page, under the table (what was looked "
                        "at by hand in the runs' folders, e.g. how much method state they held)")
    parser.add_argument("--merge", type=Path, nargs="+", default=None,
                        help="run nothing: put these JSON files' rows into --json (replacing their stages') and "
                             "write the page")
    args = parser.parse_args()
    if args.merge:
        merged = [r for f in args.merge for r in json.loads(f.read_text())["rows"]]
        write(args, merged, {r["stage"] for r in merged})
        return
    command = ".venv/bin/python scripts/kill_table.py" + \
        ("" if args.cases == list(CASES) else " --cases " + " ".join(args.cases))
    work = args.work or Path(tempfile.mkdtemp(prefix="kill_table-"))
    started = time.perf_counter()
    try:
        rows = run_cases(args.cases, work)
    finally:
        if not args.keep and args.work is None:
            shutil.rmtree(work, ignore_errors=True)
    wall = time.perf_counter() - started
    for row in rows:
        row.update(commit=commit(), command=command, inputs_s=round(wall - sum(
            {r["stage"]: r["case_wall_s"] for r in rows}.values()), 1))
    write(args, rows, set(args.cases) if args.cases != list(CASES) else None)


def write(args: argparse.Namespace, rows: list[dict], partial: set[str] | None) -> None:
    """``rows`` into --json and the page; a partial run (``partial``: its stages) replaces those stages' rows in
    the existing table and keeps the others, with their commits."""
    earlier = json.loads(args.json.read_text())["rows"] if args.json.exists() and partial else []
    rows = [r for r in earlier if r["stage"] not in partial] + rows if partial else rows
    rows.sort(key=lambda r: list(CASES).index(r["stage"]) if r["stage"] in CASES else len(CASES))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    wall = sum({r["stage"]: r["case_wall_s"] for r in rows}.values())
    args.json.write_text(json.dumps({"rows": rows}, indent=1))
    beside = args.json.resolve() == figures_path(args.page).resolve()
    args.page.write_text(page(rows, wall, args.note, figures_line(args.page) if beside else None))
    print(f"wrote {args.page} and {args.json}")


if __name__ == "__main__":
    main()
