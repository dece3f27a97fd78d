"""Does `dvc repro` on a fresh clone write what `dvc.lock` records? A new clone of the commit pulls from a DVC remote
(``--remote``, a local folder set in `.dvc/config.local`) only the sampled stages' response records and the outputs
of the ``--pull`` stages (default `sft`, ~70 CPU minutes; DVC must find its inputs unchanged), reruns every other
stage with `dvc repro -s <stage>` in DAG order and labels each output against its locked bytes: `identical`,
`within tolerance` or `changed` with its largest difference (the tolerances: components/reporting/reproduction.py;
`timings.json` is wall clock). Needs the embedded models (`bash scripts/setup.sh`) and a committed `dvc.lock`;
writes docs/results/reproduction.md (its part below ``KEEP`` kept) and its figures beside it,
docs/results/reproduction.json.

    .venv/bin/python -m flows.repro_check                      # the main job's stages, sft pulled; all identical
    .venv/bin/python -m flows.repro_check --stages prepare index evaluate@react --pull
    .venv/bin/python -m flows.repro_check --tolerant            # on another CPU: exit 0 unless one is changed
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ruamel.yaml import YAML

from components.reporting.figures import figures_line, write_figures
from components.reporting.reproduction import (
    ANSWER_KEY,
    CHANGED,
    CSV_DECIMALS,
    ID_KEY,
    IDENTICAL,
    METRICS_ABS_TOL,
    WITHIN,
    Verdict,
    compare,
)
from flows.pipeline import select

ROOT = Path(__file__).resolve().parents[1]

WALL_CLOCK = ("timings.json",)
PAGE = ROOT / "docs" / "results" / "reproduction.md"
KEEP = "<!-- hand-written from here on: python -m flows.repro_check keeps it -->"


def sh(cmd: list[str], cwd: Path, env: dict | None = None) -> str:
    done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} (in {cwd}) failed with {done.returncode}:\n{done.stdout}\n{done.stderr}")
    return done.stdout


def lock_outs(root: Path) -> dict[str, dict[str, str]]:
    """Stage -> {out path: md5} from ``root``/dvc.lock."""
    stages = YAML(typ="safe", pure=True).load((root / "dvc.lock").read_text())["stages"]
    return {name: {o["path"]: o.get("md5", "") for o in entry.get("outs", [])} for name, entry in stages.items()}


def md5_of(path: Path) -> str:
    with path.open("rb") as f:
        return hashlib.file_digest(f, "md5").hexdigest()


def locked_copy(path: str, md5: str, into: Path, caches: list[Path]) -> Path | None:
    """The locked bytes of ``path`` (its md5 in dvc.lock): this checkout's file when its md5 matches, else the copy
    in a DVC cache or local remote (``files/md5/ab/cdef...``); a folder (a ``.dir`` md5) as links under ``into``
    to its files found the same way. None when some locked bytes are not at hand."""
    def find(rel: str, digest: str) -> Path | None:
        here = ROOT / rel
        if here.is_file() and md5_of(here) == digest:
            return here
        return next((c for cache in caches if (c := cache / "files" / "md5" / digest[:2] / digest[2:]).is_file()),
                    None)

    if not md5.endswith(".dir"):
        return find(path, md5)
    listing = next((c for cache in caches if (c := cache / "files" / "md5" / md5[:2] / md5[2:]).is_file()), None)
    if listing is None:
        return None
    folder = into / path
    shutil.rmtree(folder, ignore_errors=True)
    for entry in json.loads(listing.read_text()):
        found = find(f"{path}/{entry['relpath']}", entry["md5"])
        if found is None:
            return None
        link = folder / entry["relpath"]
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(found.resolve())
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def verdict(path: str, md5: str, again: str, clone: Path, into: Path, caches: list[Path]) -> Verdict:
    """The clone's ``path`` (md5 ``again``) against the locked one (``md5``)."""
    if md5 and md5 == again:
        return Verdict(IDENTICAL, "md5")
    fresh = clone / path
    if not fresh.exists():
        return Verdict(CHANGED, "presence", "not written in the clone")
    locked = locked_copy(path, md5, into, caches)
    if locked is None:
        return Verdict(CHANGED, "md5", "md5 differs; the locked bytes are not at hand to compare")
    return compare(locked, fresh)


def rerun_in_clone(work: Path, dvc: str, env: dict, args: argparse.Namespace, stages: list[str],
                   records: list[str], pulled: list[str]) -> tuple[dict[str, float], str, bool, dict]:
    """Clone the commit into ``work``, pull the records and pulled outputs, `dvc repro -s` each stage; return the
    seconds per stage, `dvc status` of the pulled stages, whether they are current, and the clone's lock outs."""
    clone = work / "clone"
    sh(["git", "clone", "-q", str(ROOT), str(clone)], work)
    (clone / ".cache").mkdir()
    (clone / ".cache" / "models").symlink_to(ROOT / ".cache" / "models")  # weights; no response cache
    sh([dvc, "remote", "add", "--local", "--default", "repro_check", args.remote], clone)
    sh([dvc, "pull", "-r", "repro_check", *records, *pulled], clone, env)

    ran: dict[str, float] = {}
    for stage in stages:
        started = time.perf_counter()
        sh([dvc, "repro", "-s", stage], clone, env)
        ran[stage] = round(time.perf_counter() - started, 1)
        print(f"{stage}: {ran[stage]} s", flush=True)
    # a pulled stage's inputs were recomputed above: DVC must find its deps and command unchanged, or it was not
    # reproduced (its uncached outs, metrics and plots, are never pushed, so `dvc status` lists them as deleted)
    status = sh([dvc, "status", *args.pull], clone, env).strip() if args.pull else ""
    pulled_current = not any(change in status for change in ("changed deps", "changed command", "always changed"))
    rerun = lock_outs(clone)
    return ran, status, pulled_current, rerun


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--stages", nargs="+", default=None, help="stages to rerun (default: the main job's)")
    parser.add_argument("--pull", nargs="*", default=["sft"], help="stages whose outputs are pulled, not rerun")
    parser.add_argument("--remote", default=str(Path(tempfile.gettempdir()) / "rubricflow-dvc-remote"))
    parser.add_argument("--workdir", default=None, help="where the clone goes (default: a new temporary folder)")
    parser.add_argument("--tolerant", action="store_true",
                        help="exit 0 when no output is changed (within tolerance passes), as on another CPU; "
                             "by default every output must be identical, as on the machine that wrote dvc.lock")
    args = parser.parse_args()

    if sh(["git", "status", "--porcelain", "dvc.lock", "dvc.yaml"], ROOT).strip():
        raise SystemExit("dvc.lock or dvc.yaml has uncommitted changes: commit them, the clone takes the commit")
    commit = sh(["git", "rev-parse", "--short", "HEAD"], ROOT).strip()
    stages = [s for s in (args.stages or select()) if s not in args.pull]
    original = lock_outs(ROOT)
    missing = [s for s in [*stages, *args.pull] if s not in original]
    if missing:
        raise SystemExit(f"not in dvc.lock: {missing}")
    records = [p for s in stages for p in original[s] if p.startswith("outputs/responses/")]
    pulled = [p for s in args.pull for p in original[s]]

    dvc = str(Path(sys.executable).parent / "dvc")
    env = {**os.environ, "RUBRICFLOW_MLFLOW": "0", "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    sh([dvc, "remote", "add", "--local", "--force", "--default", "repro_check", args.remote], ROOT)
    sh([dvc, "push", "-r", "repro_check", *stages, *args.pull], ROOT, env)

    work = Path(args.workdir or tempfile.mkdtemp(prefix="rubricflow-repro-"))
    try:
        ran, status, pulled_current, rerun = rerun_in_clone(work, dvc, env, args, stages, records, pulled)
        caches = [Path(args.remote), ROOT / ".dvc" / "cache"]
        rows = []
        for stage in stages:
            for path, md5 in original[stage].items():
                again = rerun.get(stage, {}).get(path, "")
                kind = "wall clock" if path.endswith(WALL_CLOCK) else ("record" if path in records else "output")
                found = verdict(path, md5, again, work / "clone", work / "locked", caches)
                rows.append({"stage": stage, "path": path, "kind": kind, "original": md5, "fresh_clone": again,
                             "identical": found.label == IDENTICAL, "label": found.label,
                             "compared": found.compared, "difference": found.difference})
    finally:
        if not args.workdir:  # a clone holds the pulled sft adapter and every rerun output: ~850 MB
            shutil.rmtree(work, ignore_errors=True)

    checked = [r for r in rows if r["kind"] != "wall clock"]
    result = {"commit": commit, "date": dt.date.today().isoformat(), "stages": stages, "pulled": args.pull,
              "seconds": ran, "pulled_current": pulled_current, "pulled_status": status, "checked": len(checked),
              **{label: sum(r["label"] == label for r in checked) for label in (IDENTICAL, WITHIN, CHANGED)},
              "rows": rows}
    write_figures(PAGE, result)
    write_page(result, " ".join(["-m flows.repro_check", *sys.argv[1:]]))
    print(f"of {result['checked']} outputs (wall-clock files aside): {result[IDENTICAL]} identical, "
          f"{result[WITHIN]} within tolerance, {result[CHANGED]} changed")
    passed = result[CHANGED] == 0 if args.tolerant else result[IDENTICAL] == result["checked"]
    sys.exit(0 if passed and pulled_current else 1)


def write_page(result: dict, command: str, page: Path = PAGE) -> None:
    """The check's table as ``page``; what the page holds from its ``KEEP`` line on stays as it is."""
    lines = [
        "# Reproduction: `dvc repro` from a fresh clone",
        "",
        f"Written by `python -m flows.repro_check` on {result['date']} at commit `{result['commit']}`; do not edit by hand.",
        "",
        f"    .venv/bin/python {command}",
        "",
        figures_line(page),
        "",
        f"A fresh clone of the commit pulled the response records of the stages below and the outputs of "
        f"{', '.join(f'`{s}`' for s in result['pulled']) or 'no stage'} from a DVC remote, then ran "
        f"`dvc repro -s <stage>` for each stage in DAG order. Each output against the original `dvc.lock`, of "
        f"{result['checked']} (wall-clock files aside): **{result[IDENTICAL]} identical, {result.get(WITHIN, 0)} "
        f"within tolerance, {result.get(CHANGED, 0)} changed**.",
        "",
        (f"`identical`: the same md5 (bytes). An output whose md5 differs is compared with its locked bytes: "
         f"`within tolerance` when a metrics JSON's numbers are within {METRICS_ABS_TOL:g} (absolute) of the locked "
         f"ones, a CSV's numbers equal to {CSV_DECIMALS} decimals, a JSONL of trajectories has the same "
         f"`{ANSWER_KEY}` per `{ID_KEY}`, and everything else equal; otherwise `changed`, with the largest "
         f"difference (a folder: its worst file)."),
        "",
        "| stage | output | kind | original md5 | fresh clone md5 | reproduction | compared | largest difference |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in result["rows"]:
        label = r.get("label", IDENTICAL if r["identical"] else CHANGED)
        shown = f"{label} (wall clock, expected)" if r["kind"] == "wall clock" and label != IDENTICAL else (
            f"**{label}**" if label == CHANGED else label)
        difference = r.get("difference", "").replace("|", "\\|")
        lines.append(f"| {r['stage']} | `{r['path']}` | {r['kind']} | `{r['original'][:12]}` | "
                     f"`{r['fresh_clone'][:12]}` | {shown} | {r.get('compared', 'md5')} | {difference} |")
    if result["pulled"]:
        lines += ["", f"`dvc status {' '.join(result['pulled'])}` in the clone after the reruns (its inputs recomputed): "
                  + ("up to date." if result["pulled_current"] else f"**changed**: {result['pulled_status']}")]
    lines += ["", "Seconds per stage in the clone: " + ", ".join(f"{s} {t}" for s, t in result["seconds"].items()) + "."]
    text = "\n".join(lines) + "\n"
    old = page.read_text() if page.exists() else ""
    if KEEP in old:
        text += "\n" + old[old.index(KEEP):]
    page.write_text(text)


if __name__ == "__main__":
    main()
