"""A whole GRPO step of ``train_policy@<variant>``, run as a user runs it, at the working tree and at older
revisions side by side in one run: where the step's time goes (rollout, reward, update) and how it changed
(issue 49.3).

Run::

    python perf/bench_train_step.py --adapter outputs/sft/adapter --baseline-rev fbc3f92
        # grpo, 1 question x G=4 from the sft warm start, at fbc3f92 (when issue 49 was filed) and now;
        # about 25 minutes on 2 cores
    python perf/bench_train_step.py --adapter outputs/sft/adapter --baseline-rev fbc3f92 \
        --side int8:grpo.int8_base=true     # and the working tree again with these overrides
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, str(REPO))

from perf.bench_grpo_step import export_revision

RESULTS = Path(__file__).parent / "results" / "train_step.json"
PHASES = ("rollout", "reward", "update")
KEPT_OUT_OF_CACHE = ("llm_responses.sqlite", "dev_before")  # what each side must compute, not replay
TARGET = 0.5  # issue 49.3: half of the step time at the filing, at the same size


def step_rows(metrics_csv: Path) -> list[dict[str, float]]:
    """The trainer's rows of ``metrics.csv``: one per step, the numeric values of each column."""
    with metrics_csv.open(newline="") as f:
        rows = list(csv.DictReader(f))
    out = []
    for row in rows:
        values: dict[str, float] = {}
        for key, text in row.items():
            try:
                values[key] = float(text)
            except (TypeError, ValueError):
                continue
        if all(f"time/{p}" in values for p in PHASES):
            if "time/method" in values:  # the method's step-end work, timed apart since; older revisions count it in the update
                values["time/update"] += values["time/method"]
            out.append(values)
    if not out:
        raise ValueError(f"{metrics_csv}: no row with time/{', time/'.join(PHASES)}")
    return out


def summarize(steps: list[dict[str, float]], group_size: int, prompts: int) -> dict[str, Any]:
    """Median over steps of each phase's seconds, the step (their sum), the episodes' mean response length
    and generated tokens a step (that length x the episodes), reward, loss and gradient norm (equal on two sides
    that ran the same episodes), and the peak RSS over the steps."""
    med = {p: statistics.median(s[f"time/{p}"] for s in steps) for p in PHASES}
    step = statistics.median(sum(s[f"time/{p}"] for p in PHASES) for s in steps)
    length = statistics.median(s.get("response_length", float("nan")) for s in steps)
    return {
        **{f"{p}_s": v for p, v in med.items()},
        "step_s": step,
        "response_length": length,
        "generated_tokens": length * group_size * prompts,
        "rollout_tok_per_s": length * group_size * prompts / med["rollout"] if med["rollout"] else None,
        "reward_mean": statistics.median(s.get("reward/mean", float("nan")) for s in steps),
        "loss": statistics.median(s.get("loss", float("nan")) for s in steps),
        "grad_norm": statistics.median(s.get("grad_norm", float("nan")) for s in steps),
        # tokens through the update's forward passes, padding included (revisions before 2026-11-30 do not log it)
        "update_pass_tokens": statistics.median(s.get("pass_tokens", float("nan")) for s in steps),
        "peak_rss_gb": max(s.get("memory/peak_rss_gb", float("nan")) for s in steps),
        **{f"{p}_s": statistics.median(s[f"time/{p}"] for s in steps) if all(f"time/{p}" in s for s in steps) else None
           for p in ("method", "checkpoint")},
        "steps": len(steps),
    }


def ratios(new: dict[str, Any], old: dict[str, Any]) -> dict[str, float | None]:
    """``new`` / ``old`` for each time and the peak RSS (below 1: faster or smaller)."""
    keys = [f"{p}_s" for p in PHASES] + ["step_s", "stage_wall_s", "peak_rss_gb"]
    return {k: (new[k] / old[k] if new.get(k) and old.get(k) else None) for k in keys}


def _pass_tokens_note(row: dict[str, Any]) -> str:
    tokens = row.get("update_pass_tokens")
    return "" if tokens is None or math.isnan(tokens) else f"; {tokens:.0f} tokens through the update's passes"


def target_rows(rows: list[dict[str, Any]], ratio_rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The suite's rows: each later side's step time over the first side's, against :data:`TARGET`."""
    base = rows[0]
    out = []
    for q in ratio_rows:
        new = next(r for r in rows if r["code"] == q["code"])
        ratio = q["step_s"]
        out.append({
            "measure": f"GRPO step, {q['code']} / {base['code']}", "ratio": ratio, "target": f"<= {TARGET:g}",
            "met": ratio is not None and ratio <= TARGET,
            "figures": (f"{new['step_s']:.0f} s vs {base['step_s']:.0f} s (rollout {new['rollout_s']:.0f} vs "
                        f"{base['rollout_s']:.0f}, update {new['update_s']:.0f} vs {base['update_s']:.0f}); "
                        f"{new['generated_tokens']:.0f} vs {base['generated_tokens']:.0f} generated tokens"
                        + _pass_tokens_note(new)),
        })
    return out


def side_cache(cache: Path) -> None:
    """A cache folder linking everything of this checkout's ``.cache`` but what a side must compute itself."""
    cache.mkdir(parents=True)
    source = REPO / ".cache"
    for entry in source.iterdir() if source.is_dir() else ():
        if entry.name not in KEPT_OUT_OF_CACHE:
            (cache / entry.name).symlink_to(entry.resolve())


def run_side(code_root: Path, work: Path, adapter: Path, args: argparse.Namespace,
             overrides: list[str] = ()) -> dict[str, Any]:
    """Prepare, index and train at ``code_root`` in ``work`` (``overrides``: ``key=value`` for train_policy);
    its figures."""
    out, cache = work / "outputs", work / "cache"
    side_cache(cache)
    (out / "sft").mkdir(parents=True)
    shutil.copytree(adapter, out / "sft" / "adapter")
    common = ["--set", f"run.out_dir={out}", "--set", f"run.cache_dir={cache}",
              "--set", f"run.mlflow_tracking_uri=sqlite:///{work / 'mlflow.db'}",
              "--set", f"run.mlflow_artifact_root={work / 'mlruns'}"]
    train = ["--variant", args.variant, "--set", f"grpo.steps={args.steps}",
             "--set", f"grpo.prompts_per_step={args.prompts}", "--set", "grpo.skip_zero_advantage=false",
             "--set", "train_policy.eval_questions=0", "--set", f"seed={args.seed}",
             *(arg for item in overrides for arg in ("--set", item))]
    env = {**os.environ, "PYTHONPATH": str(code_root), "RUBRICFLOW_CACHE": str(cache)}
    walls = {}
    for stage, extra in (("prepare", []), ("index", []), ("train_policy", train)):
        cmd = [sys.executable, "-m", f"tasks.{stage}", *extra, *common]
        t0 = time.perf_counter()
        with (work / f"{stage}.log").open("w") as log:
            proc = subprocess.run(cmd, cwd=code_root, env=env, stdout=log, stderr=subprocess.STDOUT, check=False)
        walls[stage] = time.perf_counter() - t0
        if proc.returncode != 0:
            tail = (work / f"{stage}.log").read_text()[-3000:]
            raise RuntimeError(f"{stage} at {code_root} failed ({proc.returncode}):\n{tail}")
    group_size = int(_params_value(code_root, "grpo", "group_size"))
    figures = summarize(step_rows(out / "train" / args.variant / "metrics.csv"), group_size, args.prompts)
    return {**figures, "group_size": group_size, "stage_wall_s": walls["train_policy"],
            "prepare_index_s": walls["prepare"] + walls["index"]}


def _params_value(code_root: Path, section: str, key: str) -> Any:
    import yaml

    return yaml.safe_load((code_root / "params.yaml").read_text())[section][key]


def print_table(rows: list[dict[str, Any]], ratio_rows: list[dict[str, Any]]) -> None:
    cols = (("rollout_s", "rollout s"), ("reward_s", "reward s"), ("update_s", "update s"), ("step_s", "step s"),
            ("stage_wall_s", "stage wall s"), ("generated_tokens", "gen tokens"), ("peak_rss_gb", "peak RSS GB"))
    width = max(14, *(len(r["code"]) + 2 for r in rows))
    header = f"{'code':{width}}" + "".join(f"{h:>14}" for _, h in cols)
    print(header)
    print("-" * len(header))
    for r in rows:
        print(f"{r['code']:{width}}" + "".join(f"{r[k]:>14.1f}" if r.get(k) is not None else f"{'-':>14}"
                                              for k, _ in cols))
    for q in ratio_rows:
        print(f"{'/' + q['code']:{width}}" + "".join(f"{q[k]:>13.2f}x" if q.get(k) is not None else f"{'':>14}"
                                                    for k, _ in cols))
    if ratio_rows:
        print("/CODE = that code / the first baseline (below 1x: faster or smaller)")


def shown_command(args: argparse.Namespace) -> str:
    """The command line that reproduces this run, with the adapter named relative to the repository."""
    adapter = args.adapter.resolve()
    shown = adapter.relative_to(REPO) if adapter.is_relative_to(REPO) else adapter.name
    parts = ["python perf/bench_train_step.py", f"--adapter {shown}",
             *(f"--baseline-rev {rev}" for rev in args.baseline_rev), *(f"--side {item}" for item in args.side),
             f"--variant {args.variant} --steps {args.steps} --prompts {args.prompts} --seed {args.seed}"]
    return " ".join(parts)


def main() -> None:
    """How it measures, and what it writes.

    Each side is one revision's own code (the working tree, or ``git archive REV`` unpacked in a temporary folder) run
    as its own stages, ``python -m tasks.prepare``, ``tasks.index`` and ``tasks.train_policy --variant V``, with that
    revision's ``params.yaml``, in a fresh output folder where ``--adapter`` is copied in as the ``sft`` stage's
    warm start, and a fresh cache folder that links the embedded models of ``.cache/models`` (no response cache, no
    earlier dev evaluation). Every side runs the same size: ``--steps`` steps of ``--prompts`` questions x the
    revision's group size, no dev evaluation, and ``grpo.skip_zero_advantage=false``, so that every episode is in
    the update whatever its group's rewards (with skipping on, a step whose groups came out all right or all wrong
    has no update at all, and one step against one step would compare luck). Rollouts are sampled from the same
    seed: where the revisions prompt or sample alike, both sides run the same episodes (the same generated tokens,
    reward, loss and gradient norm, all in the JSON); where they do not, the generated tokens say how the work differs.

    The figures per side come from the revision's own ``outputs/train/<variant>/metrics.csv`` (the trainer's
    ``time/rollout``, ``time/reward`` and ``time/update``, the update including the hand-over of the new adapter to
    the rollout engine and the method's step-end work, ``time/method``, which newer revisions time apart and which is
    also reported alone as ``method_s``; ``time/checkpoint`` as ``checkpoint_s`` where a revision records it, outside
    the step as before; ``memory/peak_rss_gb``) and the stage's wall time (model load, server start and the final
    save around the steps). Prints a table and writes JSON to ``perf/results/train_step.json`` (``--out``).
    """
    from components.io import write_json
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--adapter", type=Path, required=True, help="the sft stage's warm-start adapter folder")
    parser.add_argument("--baseline-rev", action="append", default=[],
                        help="also run this git revision (repeatable; ratios are against the first)")
    parser.add_argument("--variant", default="grpo")
    parser.add_argument("--steps", type=int, default=1)
    parser.add_argument("--prompts", type=int, default=1, help="questions a step (grpo.prompts_per_step)")
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--side", action="append", default=[], metavar="LABEL:KEY=VALUE[,KEY=VALUE]",
                        help="also run the working tree with these overrides, labelled LABEL (repeatable), e.g. "
                        "int8:grpo.int8_base=true")
    parser.add_argument("--keep", type=Path, default=None, help="keep each side's folder (logs, metrics) here")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    if not (args.adapter / "adapter_config.json").exists():
        parser.error(f"--adapter {args.adapter}: no adapter_config.json (run the sft stage first)")
    adapter = args.adapter.resolve()
    extra_sides = []
    for item in args.side:
        label, sep, sets = item.partition(":")
        if not sep or not label or "=" not in sets:
            parser.error(f"--side {item!r}: expected LABEL:KEY=VALUE[,KEY=VALUE]")
        extra_sides.append((label, sets.split(",")))

    started = time.perf_counter()
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="rubricflow-train-step-") as tmp:
        root = args.keep.resolve() if args.keep else Path(tmp)
        sides = [(rev, root / f"code-{i}", "", []) for i, rev in enumerate(args.baseline_rev)]
        sides += [(None, REPO, "working tree", [])]
        sides += [(None, REPO, f"working tree, {label}", sets) for label, sets in extra_sides]
        for i, (rev, code_root, label, sets) in enumerate(sides):
            if rev is not None:
                code_root.mkdir(parents=True)
                label = export_revision(rev, code_root)
            print(f"== {label}: {args.variant}, {args.steps} step(s) of {args.prompts} question(s)", flush=True)
            rows.append({"code": label, "overrides": sets, **run_side(code_root, root / f"side-{i}", adapter, args, sets)})
            print(json.dumps(rows[-1]), flush=True)
    ratio_rows = [{"code": r["code"], **ratios(r, rows[0])} for r in rows[1:]] if len(rows) > 1 else []
    print_table(rows, ratio_rows)

    head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                          check=False).stdout.strip()
    report = {
        "machine": {"cpu_count": os.cpu_count(), "python": platform.python_version(),
                    "load_average_1m_after": os.getloadavg()[0]},
        "working_tree_head": head,
        "command": shown_command(args),
        "size": {"variant": args.variant, "steps": args.steps, "prompts_per_step": args.prompts,
                 "skip_zero_advantage": False, "eval_questions": 0, "seed": args.seed},
        "wall_s": time.perf_counter() - started,
        "results": rows,
        "ratios": ratio_rows,
        "targets": target_rows(rows, ratio_rows),
    }
    write_json(args.out, report, sort_keys=False)
    print(f"wrote {args.out} ({report['wall_s']:.0f} s)")


if __name__ == "__main__":
    main()
