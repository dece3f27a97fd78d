"""The head-to-head table from hand-made evaluation folders (as evaluate@<method> writes them) with known
per-question EM: the means and seed spread, the bootstrap interval against a direct computation, the paired
difference and its permutation p-value against an exhaustive enumeration of sign flips, the seed count, and
that a new seed folder changes only its own row (and, for a baseline, only the paired columns of its kind)."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from components.method_registry import HealthMetric
from components.reporting.compare import seed_dir
from components.reporting.head_to_head import (
    RESAMPLES,
    STATS_SEED,
    bootstrap_interval,
    collect_scope,
    document,
    head_to_head,
    paired_permutation_p,
    scope_markdown,
    write_head_to_head,
)
from tests.reporting.helpers import make_run, write_evaluation

MAIN_SEED = 1234
EM = {  # method -> seed -> per-question EM of questions q0..q7
    "sft": {"1234": [1, 0, 1, 0, 0, 0, 1, 0], "7": [1, 0, 0, 0, 1, 0, 1, 0]},
    "coreact": {"1234": [1, 1, 1, 0, 1, 0, 1, 0], "7": [1, 1, 0, 1, 1, 0, 1, 1]},
    "grpo": {"1234": [0, 0, 1, 0, 0, 0, 0, 0], "7": [0, 0, 1, 0, 0, 1, 0, 0]},
    "arbor": {"1234": [1, 0, 1, 0, 0, 1, 0, 0], "7": [1, 1, 1, 0, 0, 1, 0, 0]},
}
VARIANTS = {"grpo", "arbor"}
COST = {"policy": {"calls": 4, "failures": 0, "prompt_tokens": 300, "completion_tokens": 60},
        "verifier": {"calls": 2, "failures": 0, "prompt_tokens": 100, "completion_tokens": 20}}


def folder(out, method, seed):
    return out / "eval" / method if seed == str(MAIN_SEED) else seed_dir(out / "sweep", int(seed)) / "eval" / method


@pytest.fixture
def out(tmp_path):
    root = tmp_path / "out"
    for method, seeds in EM.items():
        for seed, em in seeds.items():
            write_evaluation(folder(root, method, seed), em, cost=COST if method == "coreact" else None)
    for seed, wall in ((str(MAIN_SEED), 100.0), ("7", 300.0)):
        train = root / "train" / "arbor" if seed == str(MAIN_SEED) else seed_dir(root / "sweep", 7) / "train" / "arbor"
        make_run(train, [0.1, 0.2, 0.3], wall_s=wall)
        steps = pd.read_csv(train / "metrics.csv").assign(tokens=[100, 200, 300], **{"judge/calls": [4, 4, 4],
                                                                                     "judge/tokens": [10, 10, 10]})
        steps.to_csv(train / "metrics.csv", index=False)
    return root


def table_of(out, **kwargs):
    return head_to_head([collect_scope(out, "sweep", MAIN_SEED, VARIANTS, **kwargs)],
                        order=["sft", "coreact", "grpo", "arbor"]).set_index("method")


def averaged(method):
    return np.mean([EM[method][s] for s in EM[method]], axis=0)


def test_rows_kinds_seeds_and_means(out):
    table = table_of(out)
    assert list(table.index) == ["sft", "coreact", "grpo", "arbor"]
    assert list(table["kind"]) == ["inference", "inference", "trained", "trained"]
    assert list(table["seeds"]) == [2, 2, 2, 2] and table.loc["coreact", "seed_list"] == "1234 7"
    assert (table["questions"] == 8).all()
    assert table.loc["coreact", "em"] == pytest.approx((5 / 8 + 6 / 8) / 2)
    assert table.loc["coreact", "em.sd"] == pytest.approx(np.std([5 / 8, 6 / 8], ddof=1))
    assert table.loc["coreact", "f1"] == pytest.approx(table.loc["coreact", "em"])  # right answers are exact
    assert table.loc["coreact", "judge_accuracy"] == pytest.approx(table.loc["coreact", "em"])


def test_interval_is_a_percentile_bootstrap_over_questions_of_the_seed_averaged_scores(out):
    row = table_of(out).loc["coreact"]
    scores = averaged("coreact")
    direct = stats.bootstrap((scores,), np.mean, confidence_level=0.95, n_resamples=RESAMPLES, method="percentile",
                             random_state=np.random.default_rng(STATS_SEED)).confidence_interval
    assert (row["em.ci_low"], row["em.ci_high"]) == pytest.approx((direct.low, direct.high))
    # an independent numpy resampling agrees up to Monte Carlo error
    rng = np.random.default_rng(12345)
    means = scores[rng.integers(0, len(scores), (20000, len(scores)))].mean(axis=1)
    assert row["em.ci_low"] == pytest.approx(np.percentile(means, 2.5), abs=0.04)
    assert row["em.ci_high"] == pytest.approx(np.percentile(means, 97.5), abs=0.04)
    assert row["em.ci_low"] < row["em"] < row["em.ci_high"]


def exhaustive_p(d):
    """Two-sided p of the sign-flip test by enumerating every flip."""
    flips = np.array(list(itertools.product([1, -1], repeat=len(d))))
    return float(np.mean(np.abs((flips * d).mean(axis=1)) >= abs(d.mean()) - 1e-12))


def test_paired_difference_and_test_against_the_baseline_of_its_kind(out):
    table = table_of(out)
    d = averaged("coreact") - averaged("sft")
    assert table.loc["coreact", "baseline"] == "sft" and table.loc["coreact", "paired_questions"] == 8
    assert table.loc["coreact", "em.diff"] == pytest.approx(d.mean()) == pytest.approx(0.3125)
    assert table.loc["coreact", "em.p"] == pytest.approx(exhaustive_p(d))
    assert table.loc["coreact", "em.diff_low"] <= d.mean() <= table.loc["coreact", "em.diff_high"]
    d = averaged("arbor") - averaged("grpo")  # a trained policy is paired with grpo, not sft
    assert table.loc["arbor", "baseline"] == "grpo"
    assert table.loc["arbor", "em.diff"] == pytest.approx(d.mean())
    assert table.loc["arbor", "em.p"] == pytest.approx(exhaustive_p(d))
    for base in ("sft", "grpo"):  # a baseline is not paired with itself
        assert table.loc[base, "baseline"] == "" and math.isnan(table.loc[base, "em.diff"])


def test_a_trained_method_is_paired_with_its_matched_baseline_and_falls_back_to_grpo_saying_so(out):
    grpo_arbor = [1, 1, 1, 0, 0, 0, 0, 0]  # GRPO under ARBOR's settings
    write_evaluation(folder(out, "grpo_arbor", str(MAIN_SEED)), grpo_arbor)
    write_evaluation(folder(out, "dapo_arbor", str(MAIN_SEED)), [1, 1, 1, 1, 0, 0, 0, 0])
    pairs = {"arbor": ["grpo_arbor", "grpo"], "dapo_arbor": ["grpo_arbor", "grpo"], "grpo_arbor": [], "grpo": []}
    scope = collect_scope(out, "sweep", MAIN_SEED, VARIANTS | {"grpo_arbor", "dapo_arbor"})
    table = head_to_head([scope], order=["sft", "coreact", "grpo", "arbor"], pairs=pairs).set_index("method")
    main = [EM["arbor"]["1234"], EM["arbor"]["7"]]
    d = np.mean(main, axis=0) - np.array(grpo_arbor)  # grpo_arbor has one seed: its scores are the seed's
    assert table.loc["arbor", "baseline"] == table.loc["arbor", "baseline_matched"] == "grpo_arbor"
    assert table.loc["arbor", "em.diff"] == pytest.approx(d.mean())
    assert table.loc["dapo_arbor", "baseline"] == "grpo_arbor"  # ARBOR's DAPO against ARBOR's GRPO
    for base in ("grpo", "grpo_arbor"):  # each a baseline: not paired
        assert table.loc[base, "baseline"] == table.loc[base, "baseline_matched"] == ""
    assert table.loc["coreact", "baseline"] == "sft"  # inference-time methods keep the warm start
    markdown = scope_markdown(table.reset_index())
    assert "| paired with |" in markdown
    row = next(line for line in markdown.splitlines() if line.startswith("| grpo_arbor |"))
    assert "| baseline |" in row
    # without its matched baseline's evaluation: grpo, and the table says which one it lacked
    missing = collect_scope(out, "sweep", MAIN_SEED, VARIANTS)
    missing.evaluations.pop("grpo_arbor", None)
    table = head_to_head([missing], pairs=pairs).set_index("method")
    assert table.loc["arbor", "baseline"] == "grpo" and table.loc["arbor", "baseline_matched"] == "grpo_arbor"
    assert table.loc["arbor", "em.diff"] == pytest.approx((averaged("arbor") - averaged("grpo")).mean())
    row = next(line for line in scope_markdown(table.reset_index()).splitlines() if line.startswith("| arbor |"))
    assert "| grpo (no grpo_arbor) |" in row


def test_statistics_edge_cases():
    assert bootstrap_interval([1.0, 1.0, 1.0]) == (1.0, 1.0)
    assert all(math.isnan(v) for v in bootstrap_interval([0.5]))
    assert paired_permutation_p([0.0, 0.0]) == 1.0 and math.isnan(paired_permutation_p([]))
    d = np.array([1.0, 1.0, 1.0, 1.0, 1.0, 0.0])
    assert paired_permutation_p(d) == pytest.approx(exhaustive_p(d)) == pytest.approx(2 / 32)


def test_cost_per_question_per_role_and_training_compute(out):
    table = table_of(out)
    coreact = table.loc["coreact"]
    assert coreact["cost.policy.calls"] == 4 and coreact["cost.verifier.calls"] == 2
    assert coreact["cost.policy.tokens"] == 360 and coreact["cost.tokens"] == 480 and coreact["cost.calls"] == 6
    assert coreact["cost.usd"] == 0  # the embedded backends are free
    assert table.loc["sft", "cost.policy.calls"] == 1  # a plain ReAct trajectory: one call per step
    assert table.loc["sft", "cost.policy.tokens"] == 60 and math.isnan(table.loc["sft", "cost.verifier.calls"])
    arbor = table.loc["arbor"]
    assert arbor["train.seeds"] == 2 and arbor["train.steps"] == 3 and arbor["train.wall_s"] == 200
    assert arbor["train.tokens"] == 600 and arbor["train.judge_calls"] == 12 and arbor["train.judge_tokens"] == 30
    assert math.isnan(table.loc["grpo", "train.seeds"])  # no training folder of grpo here
    priced = head_to_head([collect_scope(out, "sweep", MAIN_SEED, VARIANTS)],
                          prices={"coreact": {"policy": (1.0, 2.0)}}).set_index("method")
    assert priced.loc["coreact", "cost.policy.usd"] == pytest.approx(300 / 1000 * 1.0 + 60 / 1000 * 2.0)


def test_an_added_seed_changes_only_its_own_row(out):
    before = table_of(out)
    write_evaluation(seed_dir(out / "sweep", 8) / "eval" / "coreact", [0, 0, 0, 0, 0, 0, 0, 0])
    after = table_of(out)
    assert after.loc["coreact", "seeds"] == 3 and after.loc["coreact", "seed_list"] == "1234 7 8"
    assert after.loc["coreact", "em"] == pytest.approx((5 / 8 + 6 / 8 + 0) / 3)
    pd.testing.assert_frame_equal(after.drop(index="coreact"), before.drop(index="coreact"))


def test_an_added_baseline_seed_changes_the_baseline_and_the_paired_columns_of_its_kind_only(out):
    before = table_of(out)
    write_evaluation(seed_dir(out / "sweep", 8) / "eval" / "sft", [1, 1, 1, 1, 1, 1, 1, 1])
    after = table_of(out)
    paired = [c for c in after.columns if c.split(".")[-1] in ("diff", "diff_low", "diff_high", "p")]
    own = after.drop(columns=paired)
    pd.testing.assert_frame_equal(own.drop(index="sft"), before.drop(columns=paired).drop(index="sft"))
    pd.testing.assert_frame_equal(after.loc[["grpo", "arbor"]], before.loc[["grpo", "arbor"]])
    assert after.loc["coreact", "em.diff"] < before.loc["coreact", "em.diff"]


def test_a_sweep_folder_of_the_main_seed_is_the_same_run(out):
    write_evaluation(seed_dir(out / "sweep", MAIN_SEED) / "eval" / "coreact", [0] * 8)
    assert table_of(out).loc["coreact", "seeds"] == 2  # not counted twice


def test_a_seed_s_training_compute_is_the_run_beside_its_evaluation(out):
    # the main job's folder holds a 3-step run of arbor's main seed, but the seed's evaluation is a sweep's, of
    # the 2-step run beside it (a run extended to more steps keeps its key): that run is the seed's compute
    sweep = seed_dir(out / "sweep", MAIN_SEED)
    (out / "eval" / "arbor").rename(out / "eval" / "arbor_moved")
    write_evaluation(sweep / "eval" / "arbor", EM["arbor"][str(MAIN_SEED)])
    make_run(sweep / "train" / "arbor", [0.1, 0.2], wall_s=40.0)
    arbor = table_of(out).loc["arbor"]
    assert arbor["train.seeds"] == 2 and arbor["train.steps"] == 2.5  # (2 + 3) / 2 over seeds 1234 and 7
    assert arbor["train.wall_s"] == 170  # (40 + 300) / 2, not the main folder's 100
    # evaluated in the main folder, the main folder's run counts, whatever a sweep's folder holds
    (out / "eval" / "arbor_moved").rename(out / "eval" / "arbor")
    assert table_of(out).loc["arbor", "train.wall_s"] == 200


def test_unjudged_questions_are_left_out_of_judge_accuracy(tmp_path):
    out = tmp_path / "out"
    write_evaluation(out / "eval" / "sft", [1, 0, 1, 0], judge=[True, None, False, None])
    row = head_to_head([collect_scope(out, None, MAIN_SEED)]).iloc[0]
    assert row["judge_accuracy"] == pytest.approx(0.5) and row["em"] == pytest.approx(0.5)


def test_files_and_the_document(out, tmp_path):
    table = head_to_head([collect_scope(out, "sweep", MAIN_SEED, VARIANTS)], order=["sft", "coreact"])
    report = write_head_to_head(table, tmp_path / "h2h", {"out": str(out)})
    assert set(report.paths) == {"json", "csv", "markdown", "plot"}
    saved = pd.read_csv(report.paths["csv"])
    assert list(saved["method"]) == list(table["method"]) and saved["em"].tolist() == pytest.approx(table["em"].tolist())
    import json

    record = json.loads(report.paths["json"].read_text())
    assert record["scopes"]["out"]["questions"] == [8] and record["scopes"]["out"]["seeds"] == [2]
    assert record["scopes"]["out"]["training_steps"] == [3] and "permutation" in record["statistics"]["paired_test"]
    assert report.paths["plot"].stat().st_size > 10_000
    md = report.markdown
    assert "4 methods (2 inference-time, 2 trained) · 8 questions · 2 seeds per method (labels: 7, 1234)" in md
    assert "0.688 ± 0.088 [" in md and "+0.312 [" in md and "p=" in md and "baseline" in md
    assert "Cost per question per role" in md and "Training compute" in md
    doc = document(report, "python -m tasks.head_to_head", "2030-01-01 00:00 UTC", "abc1234")
    assert doc.startswith("# Head-to-head") and "`abc1234`" in doc and "2030-01-01" in doc and md in doc
    # the same inputs write the same files (nothing wall-clock in them)
    again = write_head_to_head(table, tmp_path / "h2h2", {"out": str(out)})
    assert again.paths["json"].read_text() == report.paths["json"].read_text()
    assert again.paths["markdown"].read_text() == md


def test_nothing_to_compare_is_an_error(tmp_path):
    with pytest.raises(ValueError, match="no evaluations"):
        head_to_head([collect_scope(tmp_path, None, MAIN_SEED)])


def test_a_step_without_an_update_adds_no_tokens_and_leaves_the_total(tmp_path):
    from components.reporting.head_to_head import training_compute

    pd.DataFrame({"tokens": [1115.0, None], "judge/calls": [4, 0], "judge/tokens": [3985, 0]}).to_csv(
        tmp_path / "metrics.csv", index=False)  # step 2: both groups flat, nothing to update
    compute = training_compute(tmp_path)
    assert compute["train.steps"] == 2 and compute["train.tokens"] == 1115 and compute["train.judge_calls"] == 4
    pd.DataFrame({"tokens": [None, None]}).to_csv(tmp_path / "metrics.csv", index=False)
    assert math.isnan(training_compute(tmp_path)["train.tokens"])  # never recorded: unknown, not 0


def test_coinciding_points_on_the_cost_plot_share_one_label():
    from components.reporting.head_to_head import point_labels

    # sft and arbor at (1970, 0.52) and (1965, 0.52) printed over each other; react far away keeps its own
    labels = point_labels([1970.0, 1965.0, 2328.0, 5995.0, float("nan")], [0.52, 0.52, 0.54, 0.0, 0.3],
                          ["sft", "arbor", "grpo", "react", "unpriced"])
    assert labels == [(1970.0, 0.52, "sft, arbor"), (2328.0, 0.54, "grpo"), (5995.0, 0.0, "react")]
    # the same cost but a different EM is two labels
    assert [t for _, _, t in point_labels([100.0, 100.0], [0.1, 0.5], ["a", "b"])] == ["a", "b"]


def test_a_method_on_fewer_questions_says_so_in_its_row(out):
    for seed, em in EM["coreact"].items():
        write_evaluation(folder(out, "coreact", seed), em[:4])  # 4 of the 8 questions
    md = scope_markdown(table_of(out).reset_index())
    accuracy = md.split("\n\n")[0].splitlines()  # the first table
    rows = {line.split(" | ")[0].strip("| "): line.split(" | ") for line in accuracy if line.startswith("| ")}
    assert rows["method"][3] == "questions"
    assert rows["coreact"][3] == "4" and rows["sft"][3] == "8"


def test_labels_of_nearby_points_are_moved_apart_and_stay_inside_the_axes():
    from components.reporting.head_to_head import label_offsets

    placed = label_offsets([(2328.0, 0.54, "grpo"), (1968.0, 0.52, "sft, arbor"), (2160.0, 0.44, "arco"),
                            (10268.0, 0.45, "coreact"), (5995.0, 0.0, "react"), (6100.0, 0.95, "oracle")])
    dy = {label: d for _, _, label, d in placed}
    # near 2000 tokens: grpo and arco are each within reach of "sft, arbor" (0.02 and 0.08 EM away), not of each other
    assert dy["sft, arbor"] == 4 and dy["grpo"] != 4 and dy["arco"] != 4
    assert dy["coreact"] == 4  # alone: just above its point
    assert dy["react"] > 0 and dy["oracle"] < 0  # EM 0 labelled above, EM near 1 below


HEALTH = (HealthMetric("method/admitted", "admitted"), HealthMetric("reward/zero_var/rescued_fraction", "rescued",
                                                                     "mean"),
          HealthMetric("reward/rubric/active", "active", "last"), HealthMetric("never/logged", "absent"))


def test_health_figures_sum_average_or_take_the_last_logged_step_and_leave_out_what_was_never_logged(tmp_path):
    from components.reporting.head_to_head import training_compute

    pd.DataFrame({"method/admitted": [1, 0, 2], "reward/zero_var/rescued_fraction": [0.5, 0.0, 0.25],
                  "reward/rubric/active": [1, 3, None]}).to_csv(tmp_path / "metrics.csv", index=False)
    compute = training_compute(tmp_path, HEALTH)
    assert compute["health.admitted"] == 3 and compute["health.rescued"] == pytest.approx(0.25)
    assert compute["health.active"] == 3  # the last step that logged it: the third logged nothing
    assert "health.absent" not in compute


def test_each_trained_method_s_health_is_averaged_over_its_runs_and_reported_beside_it(out):
    for seed, admitted in ((str(MAIN_SEED), [0, 1, 0]), ("7", [1, 1, 1])):
        train = out / "train" / "arbor" if seed == str(MAIN_SEED) else seed_dir(out / "sweep", 7) / "train" / "arbor"
        pd.read_csv(train / "metrics.csv").assign(**{"method/admitted": admitted}).to_csv(train / "metrics.csv",
                                                                                       index=False)
    table = head_to_head([collect_scope(out, "sweep", MAIN_SEED, VARIANTS, health={"arbor": HEALTH})])
    arbor = table.set_index("method").loc["arbor"]
    assert arbor["health.admitted"] == 2  # runs of 1 and 3 admitted
    assert math.isnan(table.set_index("method").loc["grpo", "health.admitted"])
    markdown = scope_markdown(table)
    mechanism = markdown.split("own mechanism", 1)[1]
    assert "| arbor | 3 | admitted 2 |" in mechanism and "grpo" not in mechanism
    assert "own mechanism" not in scope_markdown(head_to_head([collect_scope(out, "sweep", MAIN_SEED, VARIANTS)]))


def test_every_shipped_method_that_trains_a_policy_declares_its_health_figures():
    from components.method_registry import load_methods, variant_health

    specs = {s.name: s for s in load_methods()}
    for name in ("arbor", "rubricem", "arco"):
        assert specs[name].health and all(variant_health(v) == specs[name].health for v in specs[name].variants)
    assert variant_health("grpo") == ()


def test_a_scope_of_one_method_says_method_not_methods():
    from components.reporting.head_to_head import header

    size = {"methods": 1, "inference": 1, "trained": 0, "questions": [20], "seeds": [1], "seed_labels": ["1234"]}
    assert header("musique", size).startswith("1 method (1 inference-time, 0 trained) · 20 questions · 1 seed per")


def test_the_cost_table_of_a_scope_has_only_the_roles_its_methods_called(out, tmp_path):
    other = tmp_path / "other"
    write_evaluation(other / "eval" / "sft", [1, 0, 1, 0])  # its policy only; the main scope's coreact has a verifier
    table = head_to_head([collect_scope(out, "sweep", MAIN_SEED, VARIANTS), collect_scope(other, None, MAIN_SEED,
                                                                                          name="other")])
    main, second = (scope_markdown(rows) for _, rows in table.groupby("scope", sort=False))
    assert "| verifier |" in main.split("per role", 1)[1].splitlines()[2]
    assert "verifier" not in second


def test_the_plot_names_its_baselines_and_starts_the_cost_axis_at_zero(out):
    """The dotted lines are the baselines the paired columns use, said in the legend; the cost axis starts at 0, so
    horizontal distance reads as a cost ratio (a lone point once sat on an axis from 1575 to 1725 tokens)."""
    from components.reporting.head_to_head import figure

    table = head_to_head([collect_scope(out, "sweep", MAIN_SEED, VARIANTS)], order=["sft", "coreact", "grpo", "arbor"])
    ax_em, ax_cost = figure(table).axes
    legend = [t.get_text() for t in ax_em.get_legend().get_texts()]
    assert "baseline EM (sft, grpo)" in legend and "trained policies" in legend
    dotted = sorted(line.get_xdata()[0] for line in ax_em.get_lines() if line.get_linestyle() == ":")
    assert dotted == pytest.approx(sorted([averaged("sft").mean(), averaged("grpo").mean()]))
    assert ax_cost.get_xlim()[0] == 0 and ax_cost.get_xlim()[1] > table["cost.tokens"].max()
    formatter = ax_cost.xaxis.get_major_formatter()
    assert [formatter(x, 0) for x in (0, 500, 12000)] == ["0", "0.5k", "12k"]  # short ticks on a narrow panel


def test_every_scope_spaces_its_methods_alike(out, tmp_path):
    """A scope with 2 methods beside one with 4 once had the same panel height, so its 2 rows sat at the panel's top
    and bottom edges; rows are now the same distance apart (in inches) in every scope's EM panel."""
    from components.reporting.head_to_head import figure

    other = tmp_path / "other"
    write_evaluation(other / "eval" / "sft", [1, 0, 1, 0])
    write_evaluation(other / "eval" / "react", [0, 0, 1, 0])
    table = head_to_head([collect_scope(out, "sweep", MAIN_SEED, VARIANTS), collect_scope(other, None, MAIN_SEED,
                                                                                          name="other")])
    fig = figure(table)
    fig.canvas.draw()
    spacing = []
    for ax in fig.axes[::2]:  # the EM panels
        rows = len(ax.get_yticks())
        y0, y1 = ax.transData.transform([(0, 0), (0, 1)])[:, 1]
        spacing.append((abs(y1 - y0) / fig.dpi, rows))
    assert spacing[0][1] > spacing[1][1] == 2
    assert spacing[0][0] == pytest.approx(spacing[1][0], rel=0.1)


def test_a_final_health_figure_is_read_from_the_run_s_metrics_json_and_a_nan_is_left_out(tmp_path):
    from components.reporting.head_to_head import training_compute

    pd.DataFrame({"reward/rho_mean": [0.1, 0.3]}).to_csv(tmp_path / "metrics.csv", index=False)
    (tmp_path / "metrics.json").write_text('{"heldout_after.spearman": 0.24, "heldout_before.spearman": NaN}')
    compute = training_compute(tmp_path, (HealthMetric("reward/rho_mean", "training rho", "mean"),
                                          HealthMetric("heldout_after.spearman", "after", "final"),
                                          HealthMetric("heldout_before.spearman", "before", "final"),
                                          HealthMetric("reward/rho_mean", "never final", "final")))
    assert compute["health.training rho"] == pytest.approx(0.2)
    assert compute["health.after"] == pytest.approx(0.24)
    assert "health.before" not in compute and "health.never final" not in compute


def test_an_inference_method_s_trained_component_is_its_training_compute_seed_by_seed(out):
    figure = (HealthMetric("heldout_after.spearman", "held-out rho after", "final"),)
    for seed, (wall, rho) in {str(MAIN_SEED): (60.0, 0.2), "7": (180.0, 0.4)}.items():
        base = out if seed == str(MAIN_SEED) else seed_dir(out / "sweep", 7)
        run = base / "train_rubric_generator" / "listwise"
        make_run(run, [0.1, 0.2], wall_s=wall)
        pd.read_csv(run / "metrics.csv").assign(**{"tokens": [50, 70], "reward/evaluator/calls": [8, 8],
                                                   "reward/evaluator/tokens": [900, 1100]}).to_csv(
            run / "metrics.csv", index=False)
        (run / "metrics.json").write_text(f'{{"heldout_after.spearman": {rho}}}')
    table = table_of(out, components={"coreact": [("train_rubric_generator/listwise", figure)],
                                      "sft": [("train_rubric_generator/pairwise", figure)]})
    coreact = table.loc["coreact"]
    assert coreact["kind"] == "inference" and coreact["train.seeds"] == 2
    assert coreact["train.wall_s"] == pytest.approx(120.0) and coreact["train.tokens"] == 120
    assert coreact["train.judge_calls"] == 16 and coreact["train.judge_tokens"] == 2000
    assert coreact["health.held-out rho after"] == pytest.approx(0.3)
    assert math.isnan(table.loc["sft", "train.seeds"])  # no pairwise run exists: no training compute
    markdown = scope_markdown(table.reset_index())
    assert "| coreact | 2 | 2 | 0.03 | 120 | 16 | 2,000 |" in markdown
    assert "| coreact | 2 | held-out rho after 0.30 |" in markdown


def test_a_seed_folder_that_links_to_the_main_job_s_trained_component_counts_it_once(out):
    """flows.sweep's seed folders reach the main job's generator through links: one training run, not one a seed."""
    figure = (HealthMetric("heldout_after.spearman", "held-out rho after", "final"),)
    run = out / "train_rubric_generator" / "listwise"
    make_run(run, [0.1, 0.2], wall_s=60.0)
    linked = seed_dir(out / "sweep", 7) / "train_rubric_generator"
    linked.mkdir(parents=True)
    (linked / "listwise").symlink_to(run, target_is_directory=True)
    coreact = table_of(out, components={"coreact": [("train_rubric_generator/listwise", figure)]}).loc["coreact"]
    assert coreact["train.seeds"] == 1 and coreact["train.wall_s"] == pytest.approx(60.0)
