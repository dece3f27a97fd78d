"""Does `dvc repro` on a fresh clone write the bytes `dvc.lock` records? Run the main job's stages again in a new
clone of the committed tree and compare every output's hash with the lock's.

A fresh clone has the code, `dvc.lock` and nothing else. It gets from a DVC remote only the sampled stages'
response records (outputs/responses/, what those stages replay: components/llm/response_record.py) and the
outputs of the stages named by ``--pull`` (default `sft`: its ~70 minutes of CPU training are not rerun here; its
inputs are, and a changed input would make DVC rerun it, which the script refuses). Every other output of the
checked stages is recomputed by `dvc repro -s <stage>`, stage by stage in DAG order, and its md5 compared with the
original lock. Wall-clock files (`timings.json`) are listed but expected to differ.

    .venv/bin/python -m flows.repro_check                      # the main job's stages, sft pulled
    .venv/bin/python -m flows.repro_check --stages prepare index evaluate@react --pull

It pushes the outputs to a local remote first (``--remote``, a folder; configured in `.dvc/config.local`, so no
tracked file changes), needs the embedded models assembled (`bash scripts/setup.sh`; the clone links this
checkout's `.cache/models`, never its response cache) and a committed `dvc.lock`. Writes
docs/results/reproduction.md (keeping the hand-written part below its ``KEEP`` line) and outputs/repro_check.json.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ruamel.yaml import YAML

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
    finally:
        if not args.workdir:  # a clone holds the pulled sft adapter and every rerun output: ~850 MB
            shutil.rmtree(work, ignore_errors=True)

    rows = []
    for stage in stages:
        for path, md5 in original[stage].items():
            again = rerun.get(stage, {}).get(path, "")
            kind = "wall clock" if path.endswith(WALL_CLOCK) else ("record" if path in records else "output")
            rows.append({"stage": stage, "path": path, "kind": kind, "original": md5, "fresh_clone": again,
                         "identical": md5 == again})
    checked = [r for r in rows if r["kind"] != "wall clock"]
    result = {"commit": commit, "date": dt.date.today().isoformat(), "stages": stages, "pulled": args.pull,
              "seconds": ran, "pulled_current": pulled_current, "pulled_status": status, "identical": sum(r["identical"] for r in checked), "checked": len(checked),
              "rows": rows}
    out = ROOT / "outputs" / "repro_check.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    write_page(result, " ".join(["-m flows.repro_check", *sys.argv[1:]]))
    print(f"{result['identical']} of {result['checked']} outputs identical (wall-clock files aside)")
    sys.exit(0 if result["identical"] == result["checked"] and pulled_current else 1)


def write_page(result: dict, command: str, page: Path = PAGE) -> None:
    """The check's table as ``page``; what the page holds from its ``KEEP`` line on stays as it is."""
    lines = [
        "# Reproduction: `dvc repro` from a fresh clone",
        "",
        f"Written by `python -m flows.repro_check` on {result['date']} at commit `{result['commit']}`; do not edit by hand.",
        "",
        f"    .venv/bin/python {command}",
        "",
        f"A fresh clone of the commit pulled the response records of the stages below and the outputs of "
        f"{', '.join(f'`{s}`' for s in result['pulled']) or 'no stage'} from a DVC remote, then ran "
        f"`dvc repro -s <stage>` for each stage in DAG order. Each output's md5 against the original `dvc.lock`: "
        f"**{result['identical']} of {result['checked']} identical** (wall-clock files aside).",
        "",
        "| stage | output | kind | original md5 | fresh clone md5 | identical |",
        "|---|---|---|---|---|---|",
    ]
    for r in result["rows"]:
        same = "yes" if r["identical"] else ("differs (expected)" if r["kind"] == "wall clock" else "**no**")
        lines.append(f"| {r['stage']} | `{r['path']}` | {r['kind']} | `{r['original'][:12]}` | "
                     f"`{r['fresh_clone'][:12]}` | {same} |")
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
