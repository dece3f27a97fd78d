"""Every evaluated method in one table: inference-time methods and trained policies side by side, on each data scope
(a ``run.out_dir`` with its ``eval/<method>/`` folders and a sweep's ``seed_<S>/`` ones, whatever seeds exist), with
bootstrap intervals over questions, the spread over seeds, paired tests against a shared baseline, the cost per
question per role, and for trained policies the training compute and the method's mechanism health (the columns:
:func:`head_to_head`). :func:`write_head_to_head` writes head_to_head.{json,csv,md,png}; :func:`document` dates the
markdown for docs/results/.

    from components.reporting.head_to_head import collect_scope, head_to_head, write_head_to_head
    scope = collect_scope("outputs", sweep_name="sweep", main_seed=1234, variants={"grpo", "arbor"})
    report = write_head_to_head(head_to_head([scope]), "outputs/head_to_head")
    print(report.markdown)
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter
from scipy import stats

from components.evaluation import intervals
from components.io import atomic_path, read_json
from components.method_registry import HealthMetric
from components.reporting.compare import SEED_PREFIX, discover_runs

METRICS = {"em": "EM", "f1": "F1", "judge_accuracy": "judge acc."}
"""Per-question scores -> their label (per_question.csv's column ``judge`` is ``judge_accuracy``)."""

BASELINES = {"inference": "sft", "trained": "grpo"}
"""A method's kind -> the shared baseline it is paired with."""

CONFIDENCE = 0.95
RESAMPLES = 9999
STATS_SEED = 0
STATISTICS = {
    "interval": f"{CONFIDENCE:.0%} percentile bootstrap over questions of the per-question score averaged over "
                f"seeds (scipy.stats.bootstrap, {RESAMPLES} resamples, seed {STATS_SEED})",
    "seed_spread": "mean ± sample standard deviation over seeds of each seed's mean",
    "paired_test": "two-sided paired sign-flip permutation test of the mean per-question difference from the "
                   f"baseline (scipy.stats.permutation_test; exact up to 13 questions, else {RESAMPLES} "
                   f"resamples, seed {STATS_SEED})",
}

_CALLS = re.compile(r"(^|[/_])calls$")


# ------------------------------------------------------------------------------------------- statistics


def bootstrap_interval(values: Sequence[float], confidence: float = CONFIDENCE, n_resamples: int = RESAMPLES,
                       seed: int = STATS_SEED) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean of ``values`` (NaN for fewer than two values)."""
    ci = intervals.bootstrap_interval(values, np.mean, confidence=confidence, n_resamples=n_resamples, seed=seed)
    return ci if ci is not None else (math.nan, math.nan)


def paired_permutation_p(differences: Sequence[float], n_resamples: int = RESAMPLES, seed: int = STATS_SEED) -> float:
    """Two-sided p-value that the mean of paired ``differences`` is 0: each difference's sign is flipped at random
    (every flip when there are at most ``n_resamples`` of them); 1 when all are 0, NaN when there are none."""
    d = np.asarray(differences, dtype=float)
    if len(d) == 0:
        return math.nan
    if not d.any():
        return 1.0
    result = stats.permutation_test((d,), lambda x, axis: np.mean(x, axis=axis), vectorized=True,
                                    permutation_type="samples", alternative="two-sided", n_resamples=n_resamples,
                                    random_state=np.random.default_rng(seed))
    return float(result.pvalue)


# ------------------------------------------------------------------------------------------- inputs


@dataclass
class Evaluation:
    """One seed of one method's evaluation."""

    method: str
    seed: str
    folder: Path
    questions: pd.DataFrame  # indexed by question_id: em, f1, judge_accuracy (NaN: not judged)
    metrics: dict[str, float]


@dataclass
class Training:
    """One seed of one variant's training run."""

    variant: str
    seed: str
    folder: Path
    compute: dict[str, float]


@dataclass
class Scope:
    """One ``run.out_dir``: its name, where it is, and what was evaluated and trained in it."""

    name: str
    out_dir: Path
    evaluations: dict[str, list[Evaluation]]
    trainings: dict[str, list[Training]] = field(default_factory=dict)
    variants: frozenset[str] = frozenset()  # the training variants among the methods


def _judge(value) -> float:
    if isinstance(value, str):
        return {"true": 1.0, "false": 0.0}.get(value.strip().lower(), math.nan)
    return math.nan if value is None or pd.isna(value) else float(bool(value))


def load_questions(folder: str | Path) -> pd.DataFrame:
    """per_question.csv of an evaluation: ``em``, ``f1`` and ``judge_accuracy`` (1/0, NaN unjudged) per question."""
    table = pd.read_csv(Path(folder) / "per_question.csv", dtype={"question_id": str})
    judge = table["judge"].map(_judge) if "judge" in table else pd.Series(math.nan, index=table.index)
    return pd.DataFrame({"em": table["em"].astype(float), "f1": table["f1"].astype(float),
                         "judge_accuracy": judge.astype(float)}).set_index(table["question_id"])


def load_evaluation(method: str, seed: str, folder: str | Path) -> Evaluation:
    folder = Path(folder)
    raw = read_json(folder / "metrics.json")
    metrics = {k: float(v) for k, v in raw.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    return Evaluation(method=method, seed=seed, folder=folder, questions=load_questions(folder), metrics=metrics)


def health_figures(steps: pd.DataFrame, health: Sequence[HealthMetric],
                   final: Mapping[str, object] | None = None) -> dict[str, float]:
    """``health.<label>`` -> each figure over the run's steps, or from its ``final`` metrics.json (a figure the run
    never logged, or logged as NaN, is left out)."""
    figures = {}
    for metric in health:
        over = metric.over_steps
        if over == "final":
            value = (final or {}).get(metric.column)
            if isinstance(value, (int, float)) and not isinstance(value, bool) and not math.isnan(value):
                figures[f"health.{metric.label}"] = float(value)
            continue
        if metric.column not in steps:
            continue
        logged = steps[metric.column].dropna().astype(float)
        if logged.empty:
            continue
        figures[f"health.{metric.label}"] = float(logged.iloc[-1] if over == "last" else getattr(logged, over)())
    return figures


def training_compute(folder: str | Path, health: Sequence[HealthMetric] = ()) -> dict[str, float]:
    """Steps, wall time, policy tokens trained and the reward's model calls and tokens of one training run, and
    the ``health`` figures of its method's mechanism (:func:`health_figures`)."""
    folder = Path(folder)
    csv = folder / "metrics.csv"
    steps = pd.read_csv(csv) if csv.is_file() and csv.stat().st_size else pd.DataFrame()
    final = read_json(folder / "metrics.json") if (folder / "metrics.json").is_file() else {}
    timings = folder / "timings.json"
    calls = [c for c in steps.columns if _CALLS.search(c)]
    role_tokens = [c for c in steps.columns if c.endswith("/tokens")]
    def total(columns: list[str]) -> float:
        """The columns' sum over steps; a step that left a cell empty (no update, so no tokens) adds nothing."""
        values = steps[columns].to_numpy(dtype=float) if columns else np.empty(0)
        return float(np.nansum(values)) if not np.isnan(values).all() else math.nan

    return {"train.steps": float(len(steps)),
            "train.wall_s": float(read_json(timings)["wall_s"]) if timings.is_file() else math.nan,
            "train.tokens": total(["tokens"] if "tokens" in steps else []),
            "train.judge_calls": total(calls), "train.judge_tokens": total(role_tokens),
            **health_figures(steps, health, final)}


def seed_folders(out_dir: str | Path, stage: str, sweep_name: str | None, main_seed: int | str,
                 needs: str = "metrics.json") -> dict[str, list[tuple[str, Path]]]:
    """Name -> [(seed label, folder)] of ``stage`` (``eval`` or ``train``): ``<out_dir>/<stage>/<name>/`` as seed
    ``main_seed``, then a sweep's ``<sweep_name>/seed_<S>/<stage>/<name>/`` as seed S (skipped when S is the main
    seed: the same settings, the same run). Only folders holding ``needs`` count."""
    out_dir, found = Path(out_dir), {}
    for path in sorted((out_dir / stage).glob(f"*/{needs}")):
        found.setdefault(path.parent.name, []).append((str(main_seed), path.parent))
    if sweep_name:
        for name, folders in discover_runs(out_dir / sweep_name, stage=stage).items():
            for folder in folders:
                label = folder.parent.parent.name.removeprefix(SEED_PREFIX)
                mine = found.setdefault(name, [])
                if (folder / needs).is_file() and label not in {s for s, _ in mine}:
                    mine.append((label, folder))
    return dict(sorted(found.items()))


def scope_name(out_dir: str | Path) -> str:
    """The data a run.out_dir was prepared from (data/summary.json's ``source``), else the folder's name."""
    summary = Path(out_dir) / "data" / "summary.json"
    if summary.is_file():
        source = read_json(summary).get("source")
        if source:
            return str(source)
    return Path(out_dir).name


def collect_scope(out_dir: str | Path, sweep_name: str | None = "sweep", main_seed: int | str = 0,
                  variants: Collection[str] = (), name: str | None = None,
                  health: Mapping[str, Sequence[HealthMetric]] | None = None,
                  components: Mapping[str, Sequence[tuple[str, Sequence[HealthMetric]]]] | None = None) -> Scope:
    """Every evaluation (and, for ``variants``, every training run) under ``out_dir``, with all their seeds;
    ``health``: variant -> its method's health figures (:attr:`MethodSpec.health`). ``components``: an
    inference-time method -> the models it serves that a stage of its own trained, each as (the stage's run
    folder relative to ``out_dir``, e.g. ``train_rubric_generator/listwise``; its health figures): those runs
    are the method's training compute, seed by seed as a variant's are; a seed folder that links to a run already
    counted (a sweep's seeds serve the main job's generator) is that one run, counted once. A variant's training
    run for a seed is the one beside that seed's evaluation (``<folder>/train/<v>`` for ``<folder>/eval/<v>``), the
    run whose policy it evaluated, though the main job's folder holds a run of that seed too (a run extended to more
    steps keeps its key, so a sweep's seed of the main seed may be another run of it)."""
    evaluations = {m: [load_evaluation(m, s, f) for s, f in runs]
                   for m, runs in seed_folders(out_dir, "eval", sweep_name, main_seed, "per_question.csv").items()
                   if all((f / "metrics.json").is_file() for _, f in runs)}
    trained = {v: dict(runs) for v, runs in seed_folders(out_dir, "train", sweep_name, main_seed, "timings.json").items()
               if v in variants}
    for v in variants:  # a seed's run is the one whose policy its evaluation served: the one beside it
        for e in evaluations.get(v, []):
            beside = e.folder.parent.parent / "train" / v
            if (beside / "timings.json").is_file():
                trained.setdefault(v, {})[e.seed] = beside
    trainings = {v: [Training(v, s, f, training_compute(f, (health or {}).get(v, ()))) for s, f in runs.items()]
                 for v, runs in sorted(trained.items())}
    for method, trained in (components or {}).items():
        if method not in evaluations or method in variants:
            continue
        for relative, figures in trained:
            stage, run = Path(relative).parent.as_posix(), Path(relative).name
            counted: set[Path] = set()
            for seed, folder in seed_folders(out_dir, stage, sweep_name, main_seed, "timings.json").get(run, []):
                if (resolved := folder.resolve()) in counted:
                    continue
                counted.add(resolved)
                trainings.setdefault(method, []).append(Training(method, seed, folder, training_compute(folder, figures)))
    return Scope(name=name or scope_name(out_dir), out_dir=Path(out_dir), evaluations=evaluations,
                 trainings=trainings, variants=frozenset(variants))


# ------------------------------------------------------------------------------------------- the table


def _per_question(runs: Sequence[Evaluation], metric: str) -> tuple[pd.Series, pd.Series]:
    """(score per question averaged over seeds, each seed's mean over its questions)."""
    matrix = pd.concat({r.seed: r.questions[metric] for r in runs}, axis=1)
    return matrix.mean(axis=1, skipna=True), matrix.mean(axis=0, skipna=True)


def _role_cost(metrics: Mapping[str, float], prices: Mapping[str, tuple[float, float]]) -> dict[str, float]:
    """cost.<role>.{calls,tokens,usd} and their totals for one evaluation (per question, from metrics.json)."""
    roles = sorted({k.split(".")[1] for k in metrics if k.startswith("cost.") and k.count(".") == 2})
    out: dict[str, float] = {}
    for role in roles:
        prompt, completion = metrics.get(f"cost.{role}.prompt_tokens", 0.0), metrics.get(f"cost.{role}.completion_tokens", 0.0)
        p_in, p_out = prices.get(role, (0.0, 0.0))
        out[f"cost.{role}.calls"] = metrics.get(f"cost.{role}.calls", math.nan)
        out[f"cost.{role}.tokens"] = prompt + completion
        out[f"cost.{role}.usd"] = prompt / 1000 * p_in + completion / 1000 * p_out
    out["cost.calls"] = sum(out[f"cost.{r}.calls"] for r in roles) if roles else metrics.get("cost.calls", math.nan)
    out["cost.tokens"] = sum(out[f"cost.{r}.tokens"] for r in roles) if roles else metrics.get("cost.tokens", math.nan)
    out["cost.usd"] = sum(out[f"cost.{r}.usd"] for r in roles) if roles else math.nan
    return out


def method_row(runs: Sequence[Evaluation], baseline: Sequence[Evaluation] | None,
               prices: Mapping[str, tuple[float, float]] | None = None) -> dict[str, float | str]:
    """One method's statistics over its seeds' evaluations, paired with ``baseline``'s (None: no pairing)."""
    seeds = [r.seed for r in runs]
    row: dict[str, float | str] = {"seeds": float(len(runs)), "seed_list": " ".join(seeds),
                                   "questions": float(len(set().union(*(r.questions.index for r in runs))))}
    paired: set[str] | None = None
    for metric in METRICS:
        scores, seed_means = _per_question(runs, metric)
        row[metric] = float(seed_means.mean()) if seed_means.notna().any() else math.nan
        row[f"{metric}.sd"] = float(seed_means.std(ddof=1)) if seed_means.notna().sum() > 1 else math.nan
        row[f"{metric}.ci_low"], row[f"{metric}.ci_high"] = bootstrap_interval(scores.dropna().to_numpy())
        diff = low = high = p = math.nan
        if baseline is not None:
            base, _ = _per_question(baseline, metric)
            both = pd.concat([scores, base], axis=1, join="inner").dropna()
            d = (both.iloc[:, 0] - both.iloc[:, 1]).to_numpy()
            if metric == "em":
                paired = set(both.index)
            if len(d):
                diff, p = float(d.mean()), paired_permutation_p(d)
                low, high = bootstrap_interval(d)
        row.update({f"{metric}.diff": diff, f"{metric}.diff_low": low, f"{metric}.diff_high": high, f"{metric}.p": p})
    row["paired_questions"] = float(len(paired)) if paired is not None else math.nan
    costs = pd.DataFrame([_role_cost(r.metrics, prices or {}) for r in runs])
    row.update({k: float(v) for k, v in costs.mean(axis=0, skipna=True).items()})
    return row


def _ordered(names: Iterable[str], order: Sequence[str]) -> list[str]:
    rank = {n: i for i, n in enumerate(order)}
    return sorted(names, key=lambda n: (rank.get(n, len(rank)), n))


def head_to_head(scopes: Sequence[Scope], order: Sequence[str] = (), baselines: Mapping[str, str] = BASELINES,
                 prices: Mapping[str, Mapping[str, tuple[float, float]]] | None = None,
                 pairs: Mapping[str, Sequence[str]] | None = None) -> pd.DataFrame:
    """One row per (scope, method): inference-time methods first, then trained policies, each kind in ``order``
    (then by name). ``prices``: method -> role -> (USD per 1k prompt tokens, per 1k completion tokens). ``pairs``:
    method -> the baselines it is paired with, in order of preference, the first one evaluated in the scope taken
    (``components.method_registry.paired_baselines``: ``arbor`` -> ``["grpo_arbor", "grpo"]``); an empty list makes
    the row a baseline; a method not in it is paired with its kind's baseline (``baselines``).

    Columns (``<m>``: ``em``, ``f1``, ``judge_accuracy``): ``seeds``, ``seed_list``, ``questions``; ``<m>`` and
    ``<m>.sd``, the mean over seeds of each seed's mean and its sample sd over seeds (NaN for one seed);
    ``<m>.ci_low``/``.ci_high``, a 95% percentile bootstrap over questions of the seed-averaged per-question scores
    (:func:`bootstrap_interval`: 9999 resamples, fixed seed; unjudged questions left out of ``judge_accuracy``);
    ``baseline``, ``baseline_matched`` (the first choice: a row whose ``baseline`` differs was paired with a
    fallback), ``paired_questions``, ``<m>.diff`` with ``.diff_low``/``.diff_high`` and ``<m>.p`` (the mean
    per-question difference from the baseline, its bootstrap interval, a paired sign-flip permutation p:
    :func:`paired_permutation_p`); ``cost.calls``, ``cost.tokens``, ``cost.usd`` and ``cost.<role>.*`` per question,
    the answer judge not counted; ``train.seeds``, ``.steps``, ``.wall_s``, ``.tokens``, ``.judge_calls``,
    ``.judge_tokens`` (summed over metrics.csv's steps); ``health.<label>`` (:class:`HealthMetric`). Every figure
    over seeds is their mean."""
    rows = []
    for scope in scopes:
        kinds = {m: "trained" if m in scope.variants else "inference" for m in scope.evaluations}
        for kind in ("inference", "trained"):
            base = baselines.get(kind)
            for method in _ordered([m for m, k in kinds.items() if k == kind], [base, *order] if base else order):
                if pairs is not None and method in pairs:
                    wanted = [b for b in pairs[method] if b != method]
                else:
                    wanted = [base] if base and method != base else []
                chosen = next((b for b in wanted if b in scope.evaluations), None)
                row: dict[str, float | str] = {"scope": scope.name, "method": method, "kind": kind,
                                               "baseline": chosen or "", "baseline_matched": wanted[0] if wanted else ""}
                paired = scope.evaluations[chosen] if chosen is not None else None
                row.update(method_row(scope.evaluations[method], paired, (prices or {}).get(method)))
                trainings = scope.trainings.get(method, [])
                if trainings:
                    compute = pd.DataFrame([t.compute for t in trainings]).mean(axis=0, skipna=True)
                    row["train.seeds"] = float(len(trainings))
                    row.update({k: float(v) for k, v in compute.items()})
                rows.append(row)
    if not rows:
        raise ValueError("no evaluations to compare (no eval/<method>/ folder with per_question.csv and metrics.json)")
    table = pd.DataFrame(rows)
    first = ["scope", "method", "kind", "seeds", "seed_list", "questions"]
    accuracy = [f"{m}{s}" for m in METRICS for s in ("", ".sd", ".ci_low", ".ci_high")]
    pairing = ["baseline", "baseline_matched", "paired_questions",
               *(f"{m}{s}" for m in METRICS for s in (".diff", ".diff_low", ".diff_high", ".p"))]
    cost = ["cost.calls", "cost.tokens", "cost.usd"]
    roles = sorted(c for c in table.columns if c.startswith("cost.") and c not in cost)
    train = [c for c in ("train.seeds", "train.steps", "train.wall_s", "train.tokens", "train.judge_calls",
                         "train.judge_tokens") if c in table.columns]
    health = [c for c in table.columns if c.startswith("health.")]  # in the order the methods declare them
    return table[[*first, *accuracy, *pairing, *[c for c in cost if c in table], *roles, *train, *health]]


def sizes(table: pd.DataFrame) -> dict[str, dict[str, object]]:
    """Per scope: methods, questions, seeds per method and training steps, as the header states them."""
    out = {}
    for scope, rows in table.groupby("scope", sort=False):
        steps = rows["train.steps"].dropna() if "train.steps" in rows else pd.Series(dtype=float)
        out[str(scope)] = {
            "methods": len(rows), "inference": int((rows["kind"] == "inference").sum()),
            "trained": int((rows["kind"] == "trained").sum()),
            "questions": sorted({int(q) for q in rows["questions"]}),
            "seeds": sorted({int(s) for s in rows["seeds"]}),
            "seed_labels": sorted({s for labels in rows["seed_list"] for s in labels.split()}, key=_seed_order),
            "training_steps": sorted({int(s) for s in steps}),
        }
    return out


def _seed_order(label: str) -> tuple[int, str]:
    return (int(label), "") if label.lstrip("-").isdigit() else (0, label)


# ------------------------------------------------------------------------------------------- rendering


def _span(values: Sequence[int]) -> str:
    if not values:
        return "none"
    return str(values[0]) if len(values) == 1 else f"{values[0]}–{values[-1]}"


def header(scope: str, size: Mapping[str, object]) -> str:
    """The sizes line of one scope's section."""
    seeds = size["seeds"]
    methods = f"{size['methods']} method{'s' if size['methods'] != 1 else ''}"
    text = (f"{methods} ({size['inference']} inference-time, {size['trained']} trained) · "
            f"{_span(size['questions'])} questions · {_span(seeds)} seed{'s' if seeds != [1] else ''} per method "
            f"(labels: {', '.join(size['seed_labels'])})")
    if size["trained"]:
        text += f" · training steps: {_span(size['training_steps'])}"
    return text


def _num(value: float, digits: int = 3, sign: bool = False) -> str:
    if value is None or pd.isna(value):
        return "–"
    return f"{value:+.{digits}f}" if sign else f"{value:.{digits}f}"


def _accuracy_cell(row: Mapping, metric: str) -> str:
    if pd.isna(row[metric]):
        return "–"
    cell = _num(row[metric])
    if not pd.isna(row[f"{metric}.sd"]):
        cell += f" ± {_num(row[f'{metric}.sd'])}"
    if not pd.isna(row[f"{metric}.ci_low"]):
        cell += f" [{_num(row[f'{metric}.ci_low'])}, {_num(row[f'{metric}.ci_high'])}]"
    return cell


def _paired_cell(row: Mapping) -> str:
    """Whom the row is paired with: its matched baseline, a fallback (saying which one it lacked), or none."""
    chosen, wanted = row["baseline"], row.get("baseline_matched", row["baseline"])
    if not wanted:
        return "baseline"
    if not chosen:
        return f"– (no {wanted})"
    return chosen if chosen == wanted else f"{chosen} (no {wanted})"


def _diff_cell(row: Mapping, metric: str) -> str:
    if not row["baseline"]:
        return "–" if row.get("baseline_matched", row["method"] != BASELINES.get(row["kind"])) else "baseline"
    if pd.isna(row[f"{metric}.diff"]):
        return "–"
    cell = _num(row[f"{metric}.diff"], sign=True)
    if not pd.isna(row[f"{metric}.diff_low"]):
        cell += f" [{_num(row[f'{metric}.diff_low'], sign=True)}, {_num(row[f'{metric}.diff_high'], sign=True)}]"
    p = row[f"{metric}.p"]
    return cell + (f" p={p:.3g}" if not pd.isna(p) else "")


def _count(value: float, digits: int = 1) -> str:
    return "–" if value is None or pd.isna(value) else f"{value:,.{digits}f}"


def _figure(value: float) -> str:
    """A health figure: a count as a whole number, anything else to 2 decimals."""
    return f"{value:,.0f}" if float(value).is_integer() else f"{value:.2f}"


def _usd(value: float) -> str:
    return "–" if value is None or pd.isna(value) else f"${value:.4g}"


def _markdown_table(columns: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(columns) + " |", "|" + "|".join("---" for _ in columns) + "|"]
    lines += ["| " + " | ".join(str(c).replace("|", "\\|") for c in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def scope_markdown(rows: pd.DataFrame) -> str:
    """One scope's three tables: accuracy with intervals and paired differences, cost per role, training compute."""
    records = rows.to_dict("records")
    priced = "cost.usd" in rows and bool((rows["cost.usd"].fillna(0) > 0).any())
    accuracy = _markdown_table(
        ["method", "kind", "seeds", "questions", *METRICS.values(), "paired with",
         *(f"Δ {label} vs baseline" for label in METRICS.values()), "calls/q", "tokens/q", *(["$/q"] if priced else [])],
        [[r["method"], r["kind"], f"{int(r['seeds'])}", f"{int(r['questions'])}", *(_accuracy_cell(r, m) for m in METRICS),
          _paired_cell(r), *(_diff_cell(r, m) for m in METRICS), _count(r.get("cost.calls")), _count(r.get("cost.tokens"), 0),
          *([_usd(r.get("cost.usd"))] if priced else [])] for r in records])
    roles = sorted({c.split(".")[1] for c in rows.columns  # the roles this scope's methods called
                    if c.startswith("cost.") and c.count(".") == 2 and rows[c].notna().any()})
    per_role = ""
    if roles:
        def role_cell(r: Mapping, role: str) -> str:
            if pd.isna(r.get(f"cost.{role}.calls", math.nan)):
                return ""
            cell = f"{_count(r[f'cost.{role}.calls'])} calls · {_count(r[f'cost.{role}.tokens'], 0)} tok"
            return cell + (f" · {_usd(r[f'cost.{role}.usd'])}" if priced else "")
        per_role = "\nCost per question per role (mean over seeds):\n\n" + _markdown_table(
            ["method", *roles], [[r["method"], *(role_cell(r, role) for role in roles)] for r in records])
    trained = [r for r in records if not pd.isna(r.get("train.seeds", math.nan))]
    training = ""
    if trained:
        training = "\nTraining compute (mean over the training runs found):\n\n" + _markdown_table(
            ["method", "runs", "steps", "wall time (h)", "tokens trained", "reward model calls",
             "reward model tokens"],
            [[r["method"], f"{int(r['train.seeds'])}", _count(r["train.steps"], 0),
              _count(r["train.wall_s"] / 3600, 2), _count(r["train.tokens"], 0), _count(r["train.judge_calls"], 0),
              _count(r["train.judge_tokens"], 0)] for r in trained])
    health = [c for c in rows.columns if c.startswith("health.")]
    healthy = [(r, [f"{c.removeprefix('health.')} {_figure(r[c])}" for c in health if not pd.isna(r.get(c, math.nan))])
               for r in trained]
    mechanism = ""
    if any(cells for _, cells in healthy):
        mechanism = ("\nEach method's own mechanism in its training runs (the figures its package declares; mean "
                     "over the training runs found):\n\n" + _markdown_table(
                         ["method", "steps", "figures"],
                         [[r["method"], _count(r["train.steps"], 0), " · ".join(cells)] for r, cells in healthy if cells]))
    return accuracy + per_role + training + mechanism


def to_markdown(table: pd.DataFrame, out_dirs: Mapping[str, str] | None = None) -> str:
    """The report: per scope a heading, its sizes, and its tables; then the statistics used."""
    parts = []
    size = sizes(table)
    for scope, rows in table.groupby("scope", sort=False):
        where = f" (`{out_dirs[scope]}`)" if out_dirs and scope in out_dirs else ""
        parts.append(f"## {scope}{where}\n\n{header(str(scope), size[str(scope)])}\n\n{scope_markdown(rows)}")
    notes = (f"Cells: mean over seeds ± sd over seeds [{STATISTICS['interval'].split(' (')[0]}]. "
             f"Δ: mean paired difference from the row's baseline (\"paired with\": a trained method's matched baseline, "
             "GRPO trained under the method's own settings, e.g. `grpo_arbor`, else a fallback named with the matched "
             f"one it lacks; otherwise the baseline of its kind, inference-time: `{BASELINES['inference']}`, the warm "
             f"start; trained: `{BASELINES['trained']}`) [bootstrap interval] and the p-value of a "
             f"{STATISTICS['paired_test'].split(' (')[0]}. Cost: per question, the method's own model calls "
             "(the answer judge is left out).\n")
    return "\n".join(parts) + "\n" + notes


# ------------------------------------------------------------------------------------------- plot


def point_labels(xs, ys, names, tolerance: float = 0.04) -> list[tuple[float, float, str]]:
    """One label per cluster of points: methods whose points lie within ``tolerance`` of the x range and of the
    EM axis share one label ("sft, arbor"), placed at the first, so labels of coinciding methods do not print
    over each other. Points with a missing coordinate get none."""
    points = [(float(x), float(y), str(n)) for x, y, n in zip(xs, ys, names) if not (pd.isna(x) or pd.isna(y))]
    if not points:
        return []
    x_span = (max(p[0] for p in points) - min(p[0] for p in points)) or max(abs(points[0][0]), 1.0)
    groups: list[tuple[float, float, list[str]]] = []
    for x, y, name in points:
        near = next((g for g in groups if abs(g[0] - x) <= tolerance * x_span and abs(g[1] - y) <= tolerance),
                    None)
        if near:
            near[2].append(name)
        else:
            groups.append((x, y, [name]))
    return [(x, y, ", ".join(names)) for x, y, names in groups]


def label_offsets(labels: list[tuple[float, float, str]], near_x: float = 0.15,
                  near_em: float = 0.1) -> list[tuple[float, float, str, int]]:
    """A vertical offset in points for each label, so that labels of nearby points do not overlap: taken along
    the cost axis, the k-th label within ``near_x`` of the x range and ``near_em`` of EM of one already placed
    goes k steps away from its point, alternately above and below (above only near EM 0, below only near 1)."""
    labels = sorted(labels)
    xs = [x for x, _, _ in labels]
    span = (max(xs) - min(xs)) or 1.0 if xs else 1.0
    steps = [4, -11, 15, -22, 26, -33, 37, -44]
    placed: list[tuple[float, float]] = []
    out = []
    for x, e, label in labels:
        k = sum(abs(px - x) <= near_x * span and abs(pe - e) <= near_em for px, pe in placed)
        allowed = [d for d in steps if (d > 0 or e >= 0.1) and (d < 0 or e <= 0.9)]
        out.append((x, e, label, allowed[min(k, len(allowed) - 1)]))
        placed.append((x, e))
    return out


ROW_IN = 0.32
"""Inches of plot height per method in the EM panels, so every scope's rows are spaced alike."""
FRAME_IN = 1.5
"""Inches of a scope's panel taken by its title and axis labels."""


def panel_height(methods: int) -> float:
    """Inches of one scope's row of panels: its methods' rows and the frame, at least 3 for the cost plot."""
    return max(3.0, ROW_IN * methods + FRAME_IN)


def figure(table: pd.DataFrame) -> Figure:
    """Per scope: EM with its 95% interval per method (inference-time and trained coloured apart), and EM
    against the cost per question (dollars when any method has a price, else tokens)."""
    scopes = list(dict.fromkeys(table["scope"]))
    sizes = table.groupby("scope", sort=False).size()
    heights = [panel_height(sizes[scope]) for scope in scopes]  # each scope as tall as its list of methods
    fig = Figure(figsize=(12, sum(heights)), layout="constrained")
    FigureCanvasAgg(fig)
    axes = np.atleast_2d(fig.subplots(len(scopes), 2, width_ratios=[3, 2], height_ratios=heights))
    colours = {"inference": "tab:blue", "trained": "tab:orange"}
    for (ax_em, ax_cost), scope in zip(axes, scopes):
        rows = table[table["scope"] == scope].reset_index(drop=True)
        y = np.arange(len(rows))[::-1]
        for kind, colour in colours.items():
            mine = rows["kind"] == kind
            if not mine.any():
                continue
            em = rows.loc[mine, "em"].to_numpy(dtype=float)
            low = rows.loc[mine, "em.ci_low"].to_numpy(dtype=float)
            high = rows.loc[mine, "em.ci_high"].to_numpy(dtype=float)
            err = np.nan_to_num(np.vstack([em - low, high - em]), nan=0.0)
            ax_em.errorbar(em, y[mine.to_numpy()], xerr=err, fmt="o", color=colour, capsize=3,
                           label="inference-time methods" if kind == "inference" else "trained policies")
        bases = [b for b in dict.fromkeys(BASELINES.get(k) for k in colours)
                 if (rows["method"] == b).any() and not pd.isna(rows.loc[rows["method"] == b, "em"].iloc[0])]
        for i, base in enumerate(bases):
            ax_em.axvline(rows.loc[rows["method"] == base, "em"].iloc[0], color="grey", linestyle=":", linewidth=1,
                          label=f"baseline EM ({', '.join(bases)})" if i == 0 else None)
        ax_em.set_yticks(y, [f"{m} ({int(s)})" for m, s in zip(rows["method"], rows["seeds"])])
        units = max(len(rows) + 0.5, (panel_height(len(rows)) - FRAME_IN) / ROW_IN)  # a short list stays on top
        ax_em.set(xlabel="exact match (95% interval over questions)", xlim=(0, 1),
                  ylim=(len(rows) - 0.25 - units, len(rows) - 0.25), title=f"{scope}: EM per method (seeds in brackets)")
        ax_em.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.0, 1.0))  # outside: never over a bar
        dollars = "cost.usd" in rows and bool((rows["cost.usd"].fillna(0) > 0).any())
        cost_column = "cost.usd" if dollars else "cost.tokens"
        for kind, colour in colours.items():
            mine = rows[rows["kind"] == kind]
            if mine.empty or cost_column not in mine:
                continue
            em = mine["em"].to_numpy(dtype=float)
            err = np.nan_to_num(np.vstack([em - mine["em.ci_low"].to_numpy(dtype=float),
                                           mine["em.ci_high"].to_numpy(dtype=float) - em]), nan=0.0)
            ax_cost.errorbar(mine[cost_column], em, yerr=err, fmt="o", color=colour, capsize=3, label=kind)
        if cost_column in rows:
            for x, e, label, dy in label_offsets(point_labels(rows[cost_column], rows["em"], rows["method"])):
                ax_cost.annotate(label, (x, e), fontsize=7, xytext=(4, dy), textcoords="offset points")
        ax_cost.set(xlabel="USD per question" if dollars else "model tokens per question", ylabel="exact match",
                    ylim=(0, 1), title=f"{scope}: EM against cost")
        if not dollars:  # "12k", not "12000": five-digit ticks ran into each other on the narrow panel
            ax_cost.xaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{x / 1000:g}k" if x else "0"))
        costs = rows[cost_column].dropna() if cost_column in rows else pd.Series(dtype=float)
        if len(costs):  # from 0, so that horizontal distance reads as a cost ratio; room on the right for labels
            ax_cost.set_xlim(0, float(costs.max()) * 1.3 or 1.0)
    return fig


# ------------------------------------------------------------------------------------------- files


@dataclass
class HeadToHead:
    table: pd.DataFrame
    markdown: str
    sizes: dict[str, dict[str, object]]
    paths: dict[str, Path]  # json, csv, markdown, plot


def _jsonable(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def write_head_to_head(table: pd.DataFrame, out_dir: str | Path, out_dirs: Mapping[str, str] | None = None) -> HeadToHead:
    """Write head_to_head.{json,csv,md,png} for ``table`` into ``out_dir`` (atomically; no wall-clock content,
    so the same inputs give the same files). ``out_dirs``: scope -> the run.out_dir it was read from."""
    out = Path(out_dir)
    paths = {"json": out / "head_to_head.json", "csv": out / "head_to_head.csv", "markdown": out / "head_to_head.md",
             "plot": out / "head_to_head.png"}
    markdown = to_markdown(table, out_dirs)
    size = sizes(table)
    record = {"scopes": {scope: {**s, "out_dir": (out_dirs or {}).get(scope)} for scope, s in size.items()},
              "statistics": STATISTICS, "baselines": BASELINES,
              "rows": [{k: _jsonable(v) for k, v in row.items()} for row in table.to_dict("records")]}
    with atomic_path(paths["json"]) as fh:
        fh.write(json.dumps(record, indent=2) + "\n")
    with atomic_path(paths["csv"]) as fh:
        table.to_csv(fh, index=False)
    with atomic_path(paths["markdown"]) as fh:
        fh.write(markdown)
    with atomic_path(paths["plot"], "wb") as fh:
        figure(table).savefig(fh, format="png", dpi=110)
    return HeadToHead(table=table, markdown=markdown, sizes=size, paths=paths)


def document(report: HeadToHead, command: str, date: str, commit: str | None, figures: str | None = None) -> str:
    """docs/results/head_to_head.md: a dated header (command, sizes, commit, and the sentence naming the figures
    file beside it when given: :func:`components.reporting.figures.figures_line`) over the report's markdown."""
    scopes = "; ".join(f"{scope}: {header(scope, s)}" for scope, s in report.sizes.items())
    return (f"# Head-to-head: every method on one harness\n\n"
            f"Generated {date} by `{command}` at commit `{commit or 'unknown'}` (written by the `head_to_head` stage "
            f"from `{report.paths['markdown']}`; do not edit by hand).\n\n"
            + (f"{figures}\n\n" if figures else "") + f"Sizes: {scopes}.\n\n{report.markdown}")
