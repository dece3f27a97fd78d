"""Compare training runs: the table and plot of an ablation sweep (flows/sweep.py, tasks/report.py).

    from components.reporting.compare import discover_runs, write_report
    runs = discover_runs("outputs/sweep")   # {"dapo": [.../seed_1/train/dapo, .../seed_2/train/dapo], "grpo": [...]}
    report = write_report(runs, "outputs/sweep", final_steps=5)
    print(report.markdown)

A run folder is what ``train_policy@<variant>`` writes: metrics.csv (one row per trainer step), metrics.json
(the last step's metrics plus ``dev_before.*`` / ``dev_after.*``) and timings.json (``wall_s``). The table
has one row per variant: dev EM and F1 before and after training and their change (``delta.*``), the mean of
``reward/mean`` and ``reward/std`` over the last ``final_steps`` steps, the steps run, the method's own
metrics at the last step (every metric the trainer itself does not write) and the wall time. With several
seeds of a variant each value is the mean over seeds and ``<column>.sd`` its sample standard deviation
(empty for one seed).

write_report writes comparison.csv (that table), comparison.md (mean ± sd), runs.csv (one row per run) and
comparison.png (reward/mean per step per variant, mean over seeds with a min-max band; dev EM before and
after per variant, with the standard deviation over seeds as error bars).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from components.io import atomic_path, read_json

SEED_PREFIX = "seed_"

TRAINER_METRICS = frozenset({
    "step", "episodes", "episodes/unscored", "reward/none_fraction", "reward/mean", "reward/std",
    "reward/missing_values", "response_length", "loss", "pg_loss", "kl", "clip_fraction", "ratio_mean",
    "advantage/abs_mean", "ratio_min", "ratio_max", "grad_norm", "grad_norm_max", "lr", "optimizer_steps",
    "tokens", "old_logprob_pass", "episodes/zero_advantage",
    "reward/format_valid", "reward/em", "reward/outcome",  # the outcome reward every variant keeps
})
"""What GRPOTrainer (and the shared outcome reward) writes for every variant; any other metric of a run (not
dev_*, not time/*) is its method's."""

DEV_COLUMNS = ["dev_before.em", "dev_before.f1", "dev_after.em", "dev_after.f1"]
SUMMARY_COLUMNS = [*DEV_COLUMNS, "delta.em", "delta.f1", "reward_final", "reward_std_final", "steps"]


@dataclass
class Run:
    """One finished training run."""

    variant: str
    folder: Path
    steps: pd.DataFrame  # metrics.csv: one row per trainer step (empty when the file is missing)
    final: dict[str, float]  # metrics.json: the numeric values
    wall_s: float | None  # timings.json


@dataclass
class Report:
    table: pd.DataFrame  # one row per variant (index), means and .sd columns
    runs: pd.DataFrame  # one row per run
    markdown: str
    paths: dict[str, Path]  # comparison_csv, comparison_md, runs_csv, plot


def seed_dir(sweep_dir: str | Path, seed: int) -> Path:
    """The ``run.out_dir`` of a sweep's runs with ``seed``; each variant's run lands in its train/<variant>/."""
    return Path(sweep_dir) / f"{SEED_PREFIX}{seed}"


def _seed_key(folder: Path) -> tuple[int, str]:
    label = folder.name.removeprefix(SEED_PREFIX)
    return (int(label), "") if label.lstrip("-").isdigit() else (0, label)


def discover_runs(sweep_dir: str | Path, stage: str = "train") -> dict[str, list[Path]]:
    """Variant (``stage="train"``: train/<variant>/) or method (``"eval"``: eval/<method>/) -> its finished run
    folders (those with a metrics.json) in a sweep's seed folders, in seed order."""
    found: dict[str, list[Path]] = {}
    seeds = sorted((p for p in Path(sweep_dir).glob(f"{SEED_PREFIX}*") if p.is_dir()), key=_seed_key)
    for seed in seeds:
        for metrics in sorted(seed.glob(f"{stage}/*/metrics.json")):
            found.setdefault(metrics.parent.name, []).append(metrics.parent)
    return dict(sorted(found.items()))


def load_run(variant: str, folder: str | Path) -> Run:
    folder = Path(folder)
    if not (folder / "metrics.json").is_file():
        raise FileNotFoundError(f"{folder}: no metrics.json (the {variant} run did not finish)")
    raw = read_json(folder / "metrics.json")
    final = {k: float(v) for k, v in raw.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    csv = folder / "metrics.csv"
    steps = pd.read_csv(csv) if csv.is_file() and csv.stat().st_size else pd.DataFrame()
    timings = folder / "timings.json"
    wall_s = float(read_json(timings)["wall_s"]) if timings.is_file() else None
    return Run(variant=variant, folder=folder, steps=steps, final=final, wall_s=wall_s)


def method_metrics(final: Mapping[str, float]) -> list[str]:
    """The metrics of a run's last step that its method adds to the trainer's own."""
    return sorted(k for k in final if k not in TRAINER_METRICS and not k.startswith(("dev_", "time/")))


def summarize(run: Run, final_steps: int) -> dict[str, float | str]:
    """One row of runs.csv."""
    nan = math.nan
    row: dict[str, float | str] = {"variant": run.variant, "run": str(run.folder)}
    for column in DEV_COLUMNS:
        row[column] = run.final.get(column, nan)
    for metric in ("em", "f1"):
        row[f"delta.{metric}"] = row[f"dev_after.{metric}"] - row[f"dev_before.{metric}"]
    tail = run.steps.tail(final_steps)
    row["reward_final"] = float(tail["reward/mean"].mean()) if "reward/mean" in tail else nan
    row["reward_std_final"] = float(tail["reward/std"].mean()) if "reward/std" in tail else nan
    row["steps"] = float(len(run.steps))
    row.update({k: run.final[k] for k in method_metrics(run.final)})
    row["wall_s"] = run.wall_s if run.wall_s is not None else nan
    return row


def comparison_table(per_run: pd.DataFrame) -> pd.DataFrame:
    """Per-run rows -> one row per variant (first-seen order): ``seeds``, then each metric's mean over seeds
    followed by ``<metric>.sd``, the sample standard deviation (NaN for one seed)."""
    groups = per_run.drop(columns=["run"]).groupby("variant", sort=False)
    mean, sd = groups.mean(), groups.std(ddof=1)
    table = pd.DataFrame({"seeds": groups.size()})
    for column in mean.columns:
        table[column] = mean[column]
        table[f"{column}.sd"] = sd[column]
    return table


def _cell(mean: float, sd: float, digits: int) -> str:
    if pd.isna(mean):
        return ""
    return f"{mean:.{digits}f}" if pd.isna(sd) else f"{mean:.{digits}f} ± {sd:.{digits}f}"


def display_table(table: pd.DataFrame) -> pd.DataFrame:
    """The table as text: one ``mean ± sd`` cell per metric (``mean`` alone for one seed, empty when absent)."""
    metrics = [c for c in table.columns if c != "seeds" and not c.endswith(".sd")]
    shown = pd.DataFrame({"seeds": table["seeds"].astype(int)}, index=table.index)
    for column in metrics:
        digits = 0 if column in ("steps", "wall_s", "n") else 3
        shown[column] = [_cell(m, s, digits) for m, s in zip(table[column], table[f"{column}.sd"])]
    return shown


def to_markdown(table: pd.DataFrame) -> str:
    return display_table(table).to_markdown() + "\n"


def _reward_curve(run: Run) -> pd.Series | None:
    if "reward/mean" not in run.steps:
        return None
    steps = run.steps if "step" in run.steps else run.steps.assign(step=np.arange(1, len(run.steps) + 1))
    return steps.drop_duplicates("step", keep="last").set_index("step")["reward/mean"]


def comparison_figure(runs: Sequence[Run], table: pd.DataFrame) -> Figure:
    """Reward/mean per step (mean over a variant's seeds, min-max band) beside dev EM before and after."""
    fig = Figure(figsize=(11, 4.2), layout="constrained")
    FigureCanvasAgg(fig)
    ax_reward, ax_dev = fig.subplots(1, 2, width_ratios=[3, 2])
    for variant in table.index:
        curves = [c for c in (_reward_curve(r) for r in runs if r.variant == variant) if c is not None]
        if not curves:
            continue
        frame = pd.concat(curves, axis=1).sort_index()
        (line,) = ax_reward.plot(frame.index, frame.mean(axis=1), marker="o", markersize=3,
                                 label=f"{variant} ({frame.shape[1]} seed{'s' if frame.shape[1] > 1 else ''})")
        if frame.shape[1] > 1:
            ax_reward.fill_between(frame.index, frame.min(axis=1), frame.max(axis=1), color=line.get_color(),
                                   alpha=0.2, linewidth=0)
    ax_reward.set(xlabel="step", ylabel="reward/mean", title="Training reward (mean over seeds, min-max band)")
    ax_reward.xaxis.set_major_locator(MaxNLocator(integer=True))
    if ax_reward.lines:
        ax_reward.legend(fontsize="small")
    x, width = np.arange(len(table)), 0.38
    for offset, when in ((-width / 2, "before"), (width / 2, "after")):
        column = f"dev_{when}.em"
        if column in table:
            ax_dev.bar(x + offset, table[column], width, yerr=table[f"{column}.sd"].fillna(0.0), capsize=3,
                       label=when)
    ax_dev.set_xticks(x, list(table.index), rotation=30 if len(table) > 4 else 0)
    ax_dev.set(ylabel="exact match", ylim=(0, 1), title="Dev EM before / after training")
    ax_dev.legend(fontsize="small")
    return fig


def write_report(runs: Mapping[str, Sequence[str | Path]], out_dir: str | Path, final_steps: int = 5) -> Report:
    """Load every run folder of ``runs`` (variant -> folders, one per seed) and write the comparison files
    into ``out_dir``."""
    loaded = [load_run(variant, folder) for variant, folders in runs.items() for folder in folders]
    if not loaded:
        raise ValueError("no runs to compare")
    per_run = pd.DataFrame([summarize(r, final_steps) for r in loaded])
    own = sorted({k for r in loaded for k in method_metrics(r.final)})
    per_run = per_run[["variant", "run", *SUMMARY_COLUMNS, *own, "wall_s"]]
    table = comparison_table(per_run)
    out = Path(out_dir)
    paths = {"comparison_csv": out / "comparison.csv", "comparison_md": out / "comparison.md",
             "runs_csv": out / "runs.csv", "plot": out / "comparison.png"}
    return save_report(table, per_run, comparison_figure(loaded, table), paths)


def save_report(table: pd.DataFrame, per_run: pd.DataFrame, figure: Figure, paths: dict[str, Path]) -> Report:
    """Write a comparison's files atomically: ``paths`` in the order table CSV, markdown, per-run CSV, PNG."""
    table_csv, table_md, runs_csv, png = paths.values()
    markdown = to_markdown(table)
    with atomic_path(table_csv) as fh:
        table.to_csv(fh)
    with atomic_path(runs_csv) as fh:
        per_run.to_csv(fh, index=False)
    with atomic_path(table_md) as fh:
        fh.write(markdown)
    with atomic_path(png, "wb") as fh:
        figure.savefig(fh, format="png", dpi=120)
    return Report(table=table, runs=per_run, markdown=markdown, paths=paths)
