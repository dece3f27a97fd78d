"""The lab sweep's grid and its reading: the cells (variant x judge dial x seed) of ``lab.sweep``, each cell's
params (``--overlay lab`` plus its dial, seed and folder), what a finished cell's folders say (its dev curve against
steps and judge calls, test EM, its mechanism's health, the gaming check), and the table across cells (final EM,
area under the curve, steps to a threshold, the paired difference against the variant's matched baseline of the
same seed with a t interval across seeds, the break-even judge quality). Free of Prefect and MLflow: ``flows/lab.py`` runs the cells and writes
the page.

    cells = grid(params.lab.sweep, "session")              # or "full", "intro": lab.sweep.grids
    rows = [read_cell(cell_folder(sweep_root(params.run.out_dir, params.lab.sweep), c), c) for c in cells]
    table = summarise(rows, params.lab.sweep, "session")
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats

from components.evaluation.gaming import GamingCheck, gaming_check
from components.io import read_json
from components.lab.params import LabGrid, LabSweepParams
from components.method_registry import paired_baselines
from components.params import Params
from components.params_load import apply_overrides

BASELINE = "grpo"
"""The baseline of a variant whose matched one (components.method_registry.paired_baselines) is not in the grid."""

HEALTH = {  # metrics.csv column -> (label, how it is summarised over the steps)
    "reward/zero_var/rescued_fraction": ("zero-variance groups rescued", "mean"),
    "method/memory/total_admitted": ("rubrics admitted", "last"),
    "method/memory/total_consolidations": ("consolidations", "last"),
    "method/memory/total_retired": ("rubrics retired", "last"),
    "reward/arco/oracle_corr": ("mu's correlation with the oracle", "mean"),
    "method/policy_dense": ("ARCO dense phase reached", "last"),
    "reward/judge/flat_groups": ("flat stage groups", "mean"),
    "reward/judge/fallback_fraction": ("stage judge fallbacks", "mean"),
    "reward/homogeneous_fraction": ("homogeneous groups", "mean"),
}


@dataclass(frozen=True)
class Cell:
    variant: str
    dial: str
    seed: int

    @property
    def name(self) -> str:
        return f"{self.variant}@{self.dial}/seed_{self.seed}"


def chosen(settings: LabSweepParams, name: str) -> LabGrid:
    """The grid ``name`` of ``lab.sweep.grids`` (a clear error naming the grids there otherwise)."""
    if name not in settings.grids:
        raise ValueError(f"lab.sweep.grids has no grid {name!r} (it has {', '.join(settings.grids)})")
    return settings.grids[name]


def dials(settings: LabSweepParams, name: str) -> dict[str, dict]:
    return chosen(settings, name).dials


def grid(settings: LabSweepParams, name: str = "session") -> list[Cell]:
    """Every cell of the grid ``name``, the outcome-only variants under its first dial alone, seed by seed (the
    order the flow runs them in)."""
    cells = [Cell(v, d, s) for v in chosen(settings, name).variants
             for d in dials_of(settings, v, name) for s in seeds_of(settings, v, name)]
    return sorted(cells, key=lambda c: c.seed)  # seed by seed: a sweep stopped early holds whole paired seeds


def dials_of(settings: LabSweepParams, variant: str, name: str = "session") -> list[str]:
    """The dials ``variant`` runs under in grid ``name``: the first alone for an outcome-only variant, else its
    ``variant_dials`` or every dial."""
    names = list(dials(settings, name))
    return names[:1] if variant in settings.outcome_only else chosen(settings, name).variant_dials.get(variant, names)


def seeds_of(settings: LabSweepParams, variant: str, name: str = "session") -> list[int]:
    g = chosen(settings, name)
    return g.variant_seeds.get(variant, g.seeds if g.seeds is not None else settings.seeds)


def sweep_root(out_dir: str | Path, settings: LabSweepParams) -> Path:
    """The sweep's folder under the lab's ``run.out_dir``."""
    return Path(out_dir) / settings.out_dir


def cell_folder(root: Path, cell: Cell) -> Path:
    """The cell's ``run.out_dir`` under the sweep's ``root`` (:func:`sweep_root`): its dial's and seed's (every
    variant of one dial and seed shares the folder, each in its own train/<variant>/ and eval/<variant>/)."""
    return Path(root) / cell.dial / f"seed_{cell.seed}"


def cell_record(folder: Path, cell: Cell) -> Path:
    """Where a finished cell's record is in its folder (the sweep reads it back instead of running the cell)."""
    return Path(folder) / "cells" / f"{cell.variant}.json"


def cell_done(root: Path, cell: Cell) -> Path:
    """:func:`cell_record` of the cell's folder under the sweep's ``root``."""
    return cell_record(cell_folder(root, cell), cell)


def link_inputs(out_dir: str | Path, root: Path, cell: Cell) -> None:
    """The cell folder (under the sweep's ``root``) linked to the lab's prepared world and index (``out_dir``'s, the
    lab's ``run.out_dir``: data/ and index/)."""
    folder = cell_folder(root, cell)
    folder.mkdir(parents=True, exist_ok=True)
    for name in ("data", "index"):
        link = folder / name
        if not link.exists():
            link.symlink_to(os.path.relpath(Path(out_dir) / name, folder), target_is_directory=True)


def cell_overrides(settings: LabSweepParams, name: str = "session") -> list[str]:
    """The ``key=value`` settings of grid ``name``'s cells: ``lab.sweep.overrides``, then the grid's own."""
    return [*settings.overrides, *chosen(settings, name).overrides]


def cell_params(params: Params, cell: Cell, name: str = "session") -> Params:
    """``params`` (the lab overlay's) with the cell's judge dial, seed, steps and folder, then
    :func:`cell_overrides`."""
    settings = params.lab.sweep
    dial = dials(settings, name)[cell.dial]
    raw = params.model_dump()
    raw["lab"]["judge"].update(dial)
    raw["seed"] = cell.seed
    raw["grpo"]["steps"] = chosen(settings, name).steps or settings.steps
    raw["train_policy"]["eval_every"] = settings.eval_every
    raw["run"]["out_dir"] = str(cell_folder(sweep_root(params.run.out_dir, settings), cell))
    return Params.model_validate(apply_overrides(raw, cell_overrides(settings, name)))


def _curve(rows: pd.DataFrame, before: dict, after: dict | None, steps: int) -> list[dict[str, float]]:
    calls = rows["calls/judges"] if "calls/judges" in rows else pd.Series(0.0, index=rows.index)
    points = [{"step": 0.0, "em": before["em"], "calls": 0.0}]
    if "dev/em" in rows:
        for i, r in rows[rows["dev/em"].notna()].iterrows():
            points.append({"step": float(r["step"]), "em": float(r["dev/em"]), "calls": float(calls[i])})
    if after is not None:
        points.append({"step": float(steps), "em": after["em"], "calls": float(calls.iloc[-1]) if len(calls) else 0.0})
    return points


def _health(rows: pd.DataFrame) -> dict[str, float]:
    out = {}
    for column, (label, how) in HEALTH.items():
        if column in rows and rows[column].notna().any():
            values = rows[column].dropna()
            out[label] = float(values.iloc[-1] if how == "last" else values.mean())
    if "episodes/zero_advantage" in rows and "episodes" in rows:
        out["zero-advantage episodes"] = float(rows["episodes/zero_advantage"].sum() / max(rows["episodes"].sum(), 1))
    return out


def _gaming(rows: pd.DataFrame, last: dict) -> GamingCheck:
    """The gaming check over a cell's metrics, the trend beyond the outcome reward of the same episodes: its
    ``reward/outcome``, or for a cell recorded before that was logged ``reward/em`` (the lab's outcome is the answer's
    F1 at a format penalty of 0, the EM of a one-name answer up to partial credit)."""
    outcome = "reward/outcome" if "reward/outcome" in rows else "reward/em"
    dev = [{k: last[f"dev_{when}.{k}"] for k in ("em", "f1") if f"dev_{when}.{k}" in last} for when in ("before", "after")]
    return gaming_check([dev[0], *rows.to_dict("records"), dev[1]], outcome_key=outcome)


def read_cell(folder: Path, cell: Cell) -> dict:
    """A finished cell's record: its curve (dev EM at step 0, every eval_every steps and the last, with the judge
    calls so far), test EM (``evaluate@<variant>``), health, the gaming check and wall time."""
    train, evaluation = folder / "train" / cell.variant, folder / "eval" / cell.variant
    rows = pd.read_csv(train / "metrics.csv")
    last = read_json(train / "metrics.json")
    before = {"em": last["dev_before.em"]}
    after = {"em": last["dev_after.em"]}
    steps = int(rows["step"].max())
    test = read_json(evaluation / "metrics.json")
    return {"variant": cell.variant, "dial": cell.dial, "seed": cell.seed, "steps": steps,
            "curve": _curve(rows, before, after, steps), "test_em": float(test["em"]),
            "judge_calls": float(rows["calls/judges"].iloc[-1]) if "calls/judges" in rows else 0.0,
            "health": _health(rows), "gaming_suspected": _gaming(rows, last).suspected,
            "wall_s": float(read_json(train / "timings.json")["wall_s"]) if (train / "timings.json").exists() else math.nan}


def area_under_curve(curve: list[dict]) -> float:
    """Mean dev EM over the run: the trapezoid area under EM against steps, divided by the steps."""
    steps = [p["step"] for p in curve]
    ems = [p["em"] for p in curve]
    return float(np.trapezoid(ems, steps) / steps[-1]) if len(curve) > 1 and steps[-1] > 0 else ems[-1]


def steps_to(curve: list[dict], gain: float) -> float:
    """The first step at which dev EM is ``gain`` above its start (NaN: never)."""
    return next((p["step"] for p in curve[1:] if p["em"] >= curve[0]["em"] + gain), math.nan)


def interval(diffs: list[float], level: float = 0.95) -> tuple[float, float, float]:
    """Mean and a t interval across seeds (NaN bounds with one seed)."""
    diffs = [d for d in diffs if not math.isnan(d)]
    if not diffs:
        return math.nan, math.nan, math.nan
    mean = float(np.mean(diffs))
    if len(diffs) < 2:
        return mean, math.nan, math.nan
    half = float(stats.t.ppf(0.5 + level / 2, len(diffs) - 1) * stats.sem(diffs)) if np.std(diffs) > 0 else 0.0
    return mean, mean - half, mean + half


def summarise(cells: list[dict], settings: LabSweepParams, name: str = "session") -> pd.DataFrame:
    """One row per (variant, dial): seeds, final test EM, AUC, steps to threshold, judge calls, the paired
    difference in test EM against its :func:`baseline_of` of the same seed (outcome-only variants' cells serve
    every dial; a baseline's own row has none), and whether the gaming check flagged any seed."""
    names = list(dials(settings, name))
    by = {(c["variant"], c["dial"], c["seed"]): c for c in cells}

    def find(variant: str, dial: str, seed: int) -> dict | None:
        return by.get((variant, dial, seed)) or (by.get((variant, names[0], seed))
                                                  if variant in settings.outcome_only else None)

    out = []
    variants = list(dict.fromkeys(c["variant"] for c in cells))
    for variant in variants:
        for dial in dials_of(settings, variant, name):
            mine = [c for s in seeds_of(settings, variant, name) if (c := find(variant, dial, s)) is not None]
            if not mine:
                continue
            baseline, diffs = baseline_of(variant, variants), []
            for c in mine:
                base = find(baseline, dial, c["seed"]) if baseline is not None else None
                diffs.append(c["test_em"] - base["test_em"] if base is not None else math.nan)
            mean, low, high = interval(diffs)
            reached = [steps_to(c["curve"], settings.threshold) for c in mine]
            out.append({"variant": variant, "dial": dial, "seeds": len(mine),
                        "test_em": float(np.mean([c["test_em"] for c in mine])),
                        "auc_dev_em": float(np.mean([area_under_curve(c["curve"]) for c in mine])),
                        "steps_to_threshold": float(np.nanmean(reached)) if not np.isnan(reached).all() else math.nan,
                        "judge_calls": float(np.mean([c["judge_calls"] for c in mine])),
                        "baseline": baseline, "diff_vs_baseline": mean, "diff_low": low, "diff_high": high,
                        "gaming_flagged": sum(c["gaming_suspected"] for c in mine),
                        "wall_s": float(np.mean([c["wall_s"] for c in mine]))})
    return pd.DataFrame(out)


def baseline_of(variant: str, variants: list[str]) -> str | None:
    """Whom ``variant`` is paired with among the grid's ``variants``: its first matched baseline there (ARBOR's
    ``grpo_arbor``, RubricEM's ``scaffold_grpo``: GRPO under the method's own protocol and settings), else
    ``grpo``; None for a baseline itself (``grpo``, a matched GRPO)."""
    wanted = paired_baselines(variant)
    if not wanted:
        return None
    return next((b for b in wanted if b in variants), BASELINE)


def judge_quality(dial: dict) -> float:
    """How far a dial is from the oracle: its flip rate plus its bias rate (0: perfect)."""
    return float(dial.get("flip_rate", 0.0)) + float(dial.get("bias_rate", 0.0) if dial.get("bias", "none") != "none"
                                                    else 0.0)


def break_even(table: pd.DataFrame, settings: LabSweepParams, name: str = "session") -> dict[str, str]:
    """Per variant, the worst judge (by :func:`judge_quality`, flip-rate dials only) under which it still beats
    its baseline (the table's ``baseline``) with an interval above 0, or why none does."""
    found = {}
    flips = {n: d for n, d in dials(settings, name).items() if d.get("bias", "none") == "none"}
    for variant in table["variant"].unique():
        if variant == BASELINE or variant in settings.outcome_only:
            continue
        rows = table[(table["variant"] == variant) & (table["dial"].isin(list(flips)))]
        base = table[table["variant"] == variant]["baseline"].iloc[0]
        wins = rows[rows["diff_low"] > 0]
        if wins.empty:
            found[variant] = f"beats {base} under no judge (interval includes or is below 0)"
        else:
            worst = max(wins["dial"], key=lambda n: judge_quality(flips[n]))
            found[variant] = f"beats {base} up to {worst} (flip rate {judge_quality(flips[worst]):g})"
    return found


def panel_cells(cells: list[dict], dial: str, outcome_only: Sequence[str] = ()) -> dict[str, list[dict]]:
    """The cells drawn in ``dial``'s panel, by variant: each variant's cells under that dial; an ``outcome_only``
    variant's cells of its one dial when it has none there. A variant that never ran under ``dial`` is left out."""
    out: dict[str, list[dict]] = {}
    for variant in dict.fromkeys(c["variant"] for c in cells):
        mine = [c for c in cells if c["variant"] == variant and c["dial"] == dial]
        if not mine and variant in outcome_only:
            mine = [c for c in cells if c["variant"] == variant]
        if mine:
            out[variant] = mine
    return out


def plot_curves(cells: list[dict], dial_names: list[str], path: Path, outcome_only: Sequence[str] = ()) -> Path:
    """Dev EM against steps (top) and against judge calls (bottom), one panel per dial of ``dial_names``, a line
    per variant that ran under that dial (mean over seeds); an ``outcome_only`` variant's one dial in every panel."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, len(dial_names), figsize=(4.2 * len(dial_names), 6.4), squeeze=False)
    for j, dial in enumerate(dial_names):
        for variant, mine in panel_cells(cells, dial, outcome_only).items():
            steps = [p["step"] for p in mine[0]["curve"]]
            em = np.mean([[p["em"] for p in c["curve"]] for c in mine if len(c["curve"]) == len(steps)], axis=0)
            calls = np.mean([[p["calls"] for p in c["curve"]] for c in mine if len(c["curve"]) == len(steps)], axis=0)
            axes[0][j].plot(steps, em, marker="o", ms=3, label=variant)
            axes[1][j].plot(calls, em, marker="o", ms=3, label=variant)
        axes[0][j].set_title(f"judge: {dial}")
        axes[0][j].set_xlabel("GRPO step")
        axes[1][j].set_xlabel("judge calls")
        axes[0][j].set_ylabel("dev EM (mean over seeds)")
        axes[1][j].set_ylabel("dev EM")
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _fmt(value: float, digits: int = 3) -> str:
    return "-" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.{digits}f}"


def page(cells: list[dict], table: pd.DataFrame, settings: LabSweepParams, *, name: str, header: list[str],
         plot_name: str) -> str:
    """The sweep's markdown: the header lines (date, command, sizes, commit), the table, the break-even judge
    per method, each mechanism's health at every dial, and the plot."""
    lines = [*header, "",
             "| variant | judge | seeds | test EM | dev EM AUC | steps to dev EM "
             f"+{settings.threshold:g} | judge calls | paired with | test EM - baseline [95% t interval] | "
             "gaming flagged | wall s |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for _, r in table.iterrows():
        paired = r["baseline"] if isinstance(r["baseline"], str) else "- (a baseline)"
        diff = "-" if not isinstance(r["baseline"], str) else (
            f"{r['diff_vs_baseline']:+.3f} [{_fmt(r['diff_low'])}, {_fmt(r['diff_high'])}]")
        lines.append(f"| {r['variant']} | {r['dial']} | {r['seeds']} | {r['test_em']:.3f} | {r['auc_dev_em']:.3f} | "
                     f"{_fmt(r['steps_to_threshold'], 0)} | {r['judge_calls']:.0f} | {paired} | {diff} | "
                     f"{int(r['gaming_flagged'])}/{r['seeds']} | {_fmt(r['wall_s'], 0)} |")
    lines += ["", "Break-even judge (the worst flip-rate judge under which the method still beats its baseline, "
              "interval above 0):", ""]
    lines += [f"- {v}: {text}" for v, text in break_even(table, settings, name).items()]
    lines += ["", "Each mechanism's health (mean over seeds; rates are means over steps, totals at the last step):",
              "", "| variant | judge | health |", "|---|---|---|"]
    for (variant, dial), group in pd.DataFrame(cells).groupby(["variant", "dial"], sort=False):
        keys = sorted({k for h in group["health"] for k in h})
        shown = "; ".join(f"{k} {np.nanmean([h.get(k, math.nan) for h in group['health']]):.3f}" for k in keys)
        lines.append(f"| {variant} | {dial} | {shown or '-'} |")
    lines += ["", f"![learning curves]({plot_name})", ""]
    return "\n".join(lines)
