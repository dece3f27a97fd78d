"""Compare evaluated methods: the table and plot of an evaluation sweep (Co-ReAct's comparison: ReAct,
Co-ReAct, the baselines, their rubric plug-ins and the ablations, each over several seeds). The head-to-head
report (:mod:`components.reporting.head_to_head`) builds on the same per-run rows and adds per-question
intervals and paired tests.

    from components.reporting.compare import discover_runs
    from components.reporting.methods import write_method_report
    runs = discover_runs("outputs/sweep", stage="eval")   # {"coreact": [.../seed_1/eval/coreact, ...], ...}
    print(write_method_report(runs, "outputs/sweep").markdown)

A run folder is what ``evaluate@<method>`` writes: metrics.json (EM, F1, judge accuracy, behaviour, cost) and
timings.json. The table has one row per method: the questions scored, accuracy, the behaviour of the paper's
Table 3 (components.evaluation.behaviour.BEHAVIOUR_COLUMNS), the retry rate and the cost per question per role,
then the seconds per question; with several seeds each value is the mean over seeds and ``<column>.sd`` its
sample standard deviation. Files: methods.csv, methods.md (mean ± sd), method_runs.csv (one row per run) and
methods.png (EM, F1 and judge accuracy per method with the standard deviation over seeds as error bars).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from components.evaluation.behaviour import BEHAVIOUR_COLUMNS
from components.io import read_json
from components.reporting.compare import Report, Run, comparison_table, load_run, save_report

ACCURACY_COLUMNS = ["n", "em", "f1", "judge_accuracy", "judge_failures", "gold_recall", "answered_rate"]
GUIDANCE_COLUMNS = ["retry_rate", "rubric_failures", "verifier_failures", "token_budget_hits"]
ROLE_COST_SUFFIXES = (".calls", ".completion_tokens", ".failures")
"""Per-role cost columns kept (``cost.<role>.<suffix>``); prompt tokens are in ``cost.tokens``."""


def summarize_method(run: Run) -> dict[str, float | str]:
    """One row of method_runs.csv: the fixed columns (NaN where the method has none), every per-role cost,
    and seconds per question."""
    row: dict[str, float | str] = {"variant": run.variant, "run": str(run.folder)}
    for column in [*ACCURACY_COLUMNS, *BEHAVIOUR_COLUMNS, *GUIDANCE_COLUMNS, "cost.tokens"]:
        row[column] = run.final.get(column, math.nan)
    row.update({k: v for k, v in sorted(run.final.items())
                if k.startswith("cost.") and k.count(".") == 2 and k.endswith(ROLE_COST_SUFFIXES)})
    timings = run.folder / "timings.json"
    row["s_per_question"] = float(read_json(timings).get("s_per_question", math.nan)) if timings.is_file() else math.nan
    return row


def method_figure(table: pd.DataFrame) -> Figure:
    """EM, F1 and judge accuracy per method, mean over seeds with the standard deviation as error bars."""
    fig = Figure(figsize=(max(6.0, 0.9 * len(table) + 2), 4.2), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    x, width = np.arange(len(table)), 0.27
    for offset, column in zip((-width, 0.0, width), ("em", "f1", "judge_accuracy")):
        ax.bar(x + offset, table[column], width, yerr=table[f"{column}.sd"].fillna(0.0), capsize=3, label=column)
    seeds = sorted({int(s) for s in table["seeds"]})
    ax.set_xticks(x, list(table.index), rotation=30 if len(table) > 4 else 0, ha="right" if len(table) > 4 else "center")
    ax.set(ylabel="score", ylim=(0, 1), title=f"Methods (mean ± sd over {'/'.join(map(str, seeds))} seeds)")
    ax.legend(fontsize="small")
    return fig


def write_method_report(runs: Mapping[str, Sequence[str | Path]], out_dir: str | Path) -> Report:
    """Load every evaluation folder of ``runs`` (method -> folders, one per seed) and write the method
    comparison files into ``out_dir``."""
    loaded = [load_run(method, folder) for method, folders in runs.items() for folder in folders]
    if not loaded:
        raise ValueError("no evaluations to compare")
    per_run = pd.DataFrame([summarize_method(r) for r in loaded])
    fixed = ["variant", "run", *ACCURACY_COLUMNS, *BEHAVIOUR_COLUMNS, *GUIDANCE_COLUMNS, "cost.tokens"]
    roles = sorted(c for c in per_run.columns if c not in fixed and c != "s_per_question")
    per_run = per_run[[*fixed, *roles, "s_per_question"]]
    table = comparison_table(per_run)
    out = Path(out_dir)
    paths = {"methods_csv": out / "methods.csv", "methods_md": out / "methods.md",
             "method_runs_csv": out / "method_runs.csv", "methods_plot": out / "methods.png"}
    return save_report(table, per_run, method_figure(table), paths)
