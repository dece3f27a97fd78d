"""The sweep's comparison table and plot, on hand-made run folders: values, seed aggregation, files."""

from __future__ import annotations

import math

import matplotlib.image
import numpy as np
import pandas as pd
import pytest

from components.reporting.compare import (
    comparison_figure,
    comparison_table,
    discover_runs,
    load_run,
    seed_dir,
    summarize,
    write_report,
)
from tests.reporting.helpers import dev, make_run


@pytest.fixture
def sweep(tmp_path):
    """grpo with seeds 1 and 2, dapo with seed 1 only (and a dapo seed-2 run that never finished)."""
    root = tmp_path / "sweep"
    make_run(seed_dir(root, 1) / "train" / "grpo", [0.1, 0.2, 0.3, 0.4], [0.2, 0.2, 0.4, 0.6],
             final=dev(0.2, 0.3, 0.25, 0.40), wall_s=100.0)
    make_run(seed_dir(root, 2) / "train" / "grpo", [0.0, 0.2, 0.5, 0.6], [0.1, 0.1, 0.2, 0.2],
             final=dev(0.2, 0.5, 0.25, 0.50), wall_s=140.0)
    make_run(seed_dir(root, 1) / "train" / "dapo", [0.3, 0.1, 0.2, 0.9],
             final={**dev(0.2, 0.2, 0.25, 0.30), "reward/homogeneous_fraction": 0.25}, wall_s=90.0)
    (seed_dir(root, 2) / "train" / "dapo").mkdir(parents=True)
    return root


def test_discover_runs_lists_finished_runs_in_seed_order(tmp_path):
    for seed in (10, 2, 1):
        make_run(seed_dir(tmp_path, seed) / "train" / "grpo", [0.0])
    (seed_dir(tmp_path, 3) / "train" / "grpo").mkdir(parents=True)  # crashed: no metrics.json
    runs = discover_runs(tmp_path)
    assert list(runs) == ["grpo"]
    assert [p.parents[1].name for p in runs["grpo"]] == ["seed_1", "seed_2", "seed_10"]


def test_one_run_summary_values(sweep):
    row = summarize(load_run("dapo", seed_dir(sweep, 1) / "train" / "dapo"), final_steps=2)
    assert row["dev_before.em"] == 0.2 and row["dev_after.f1"] == 0.30
    assert row["delta.em"] == pytest.approx(0.0) and row["delta.f1"] == pytest.approx(0.05)
    assert row["reward_final"] == pytest.approx((0.2 + 0.9) / 2)  # the last 2 steps only
    assert row["reward_std_final"] == pytest.approx(0.1)
    assert row["steps"] == 4 and row["wall_s"] == 90.0
    assert row["reward/homogeneous_fraction"] == 0.25  # the method's own metric
    assert "kl" not in row and "loss" not in row and "dev_after.answered" not in row  # the trainer's / not asked


def test_seeds_are_aggregated_to_mean_and_sample_sd(sweep):
    report = write_report(discover_runs(sweep), sweep, final_steps=2)
    table = report.table
    assert list(table.index) == ["dapo", "grpo"]
    grpo, dapo = table.loc["grpo"], table.loc["dapo"]
    assert grpo["seeds"] == 2 and dapo["seeds"] == 1
    assert grpo["dev_after.em"] == pytest.approx(0.4)
    assert grpo["dev_after.em.sd"] == pytest.approx(math.sqrt(0.02))  # ddof=1 over 0.3 and 0.5
    assert grpo["delta.em"] == pytest.approx((0.1 + 0.3) / 2)
    assert grpo["reward_final"] == pytest.approx(((0.3 + 0.4) / 2 + (0.5 + 0.6) / 2) / 2)
    assert grpo["reward_std_final"] == pytest.approx(((0.4 + 0.6) / 2 + 0.2) / 2)
    assert grpo["wall_s"] == 120.0 and grpo["wall_s.sd"] == pytest.approx(math.sqrt(800))
    assert math.isnan(dapo["dev_after.em.sd"])  # one seed: no spread
    assert math.isnan(grpo["reward/homogeneous_fraction"]) and dapo["reward/homogeneous_fraction"] == 0.25
    assert len(report.runs) == 3


def test_files_hold_the_table(sweep):
    report = write_report(discover_runs(sweep), sweep, final_steps=2)
    back = pd.read_csv(report.paths["comparison_csv"], index_col=0)
    pd.testing.assert_frame_equal(back, report.table, check_dtype=False, check_names=False)
    md = report.paths["comparison_md"].read_text()
    grpo_line = next(line for line in md.splitlines() if line.startswith("| grpo"))
    assert "0.400 ± 0.141" in grpo_line and "120 ± 28" in grpo_line
    dapo_line = next(line for line in md.splitlines() if line.startswith("| dapo"))
    assert "±" not in dapo_line and "0.250" in dapo_line
    assert sorted(pd.read_csv(report.paths["runs_csv"])["variant"]) == ["dapo", "grpo", "grpo"]
    image = matplotlib.image.imread(report.paths["plot"])
    assert image.shape[0] > 300 and image.shape[1] > 800
    assert len(np.unique(image.reshape(-1, image.shape[-1]), axis=0)) > 10  # something is drawn


def test_figure_plots_the_seed_mean_curve_and_the_em_bars(sweep):
    runs = [load_run(v, p) for v, ps in discover_runs(sweep).items() for p in ps]
    table = comparison_table(pd.DataFrame([summarize(r, 2) for r in runs]))
    ax_reward, ax_dev = comparison_figure(runs, table).axes
    curves = {line.get_label(): line for line in ax_reward.lines}
    assert set(curves) == {"dapo (1 seed)", "grpo (2 seeds)"}
    np.testing.assert_allclose(curves["grpo (2 seeds)"].get_ydata(), [0.05, 0.2, 0.4, 0.5])
    np.testing.assert_allclose(curves["grpo (2 seeds)"].get_xdata(), [1, 2, 3, 4])
    heights = [bar.get_height() for bar in ax_dev.patches]
    np.testing.assert_allclose(heights, [0.2, 0.2, 0.2, 0.4])  # before: dapo, grpo; after: dapo, grpo


def test_an_unfinished_run_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="grpo run did not finish"):
        load_run("grpo", tmp_path / "nothing")
