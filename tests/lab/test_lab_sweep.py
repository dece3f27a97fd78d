"""The lab sweep's reading (components/lab/sweep.py): the grid runs outcome-only variants under one judge, each cell
gets its dial, seed and folder, and the table's paired difference against the matched baseline, its t interval, the area under the
curve, the steps to a threshold and the break-even judge are the hand-computed ones."""

from __future__ import annotations

import math

import pytest
from scipy import stats

from components.lab.params import LabGrid, LabSweepParams
from components.lab.sweep import (
    Cell,
    area_under_curve,
    break_even,
    cell_folder,
    cell_params,
    grid,
    panel_cells,
    steps_to,
    summarise,
    sweep_root,
)
from components.params_load import load_params

SETTINGS = LabSweepParams(seeds=[0, 1, 2], grids={"session": LabGrid(
    variants=["grpo", "arbor"], dials={"perfect": {}, "noisy": {"flip_rate": 0.25},
                                       "biased": {"bias": "length", "bias_rate": 0.5}})})


def _cell(variant, dial, seed, test_em, curve=((0, 0.0), (10, 0.1), (20, 0.2))):
    return {"variant": variant, "dial": dial, "seed": seed, "steps": 20, "test_em": test_em, "judge_calls": 0.0,
            "curve": [{"step": float(s), "em": e, "calls": 0.0} for s, e in curve], "health": {},
            "gaming_suspected": dial == "biased", "wall_s": 60.0}


def test_outcome_only_variants_run_under_the_first_judge_only():
    cells = grid(SETTINGS)
    assert [c for c in cells if c.variant == "grpo"] == [Cell("grpo", "perfect", s) for s in (0, 1, 2)]
    assert len([c for c in cells if c.variant == "arbor"]) == 9


def test_a_cell_gets_its_dial_seed_steps_and_folder(repo_root):
    params = load_params(repo_root / "params.yaml", overlays=["lab"],
                         overrides=["lab.sweep.overrides=[train_policy.first_question=150]"])
    cell = Cell("arbor", "noisy", 2)
    mine = cell_params(params, cell)
    assert mine.lab.judge.flip_rate == 0.25 and mine.seed == 2 and mine.grpo.steps == params.lab.sweep.steps
    assert mine.train_policy.eval_every == params.lab.sweep.eval_every and mine.train_policy.first_question == 150
    folder = cell_folder(sweep_root(params.run.out_dir, params.lab.sweep), cell)
    assert mine.run.out_dir == str(folder) and folder.name == "seed_2"
    assert cell_params(params, Cell("arbor", "perfect", 2)).lab.judge.flip_rate == 0.0


def test_curve_figures_are_the_hand_computed_ones():
    curve = _cell("grpo", "perfect", 0, 0.1)["curve"]
    assert area_under_curve(curve) == pytest.approx((0.05 * 10 + 0.15 * 10) / 20)
    assert steps_to(curve, 0.1) == 10 and steps_to(curve, 0.15) == 20 and math.isnan(steps_to(curve, 0.5))
    assert math.isnan(steps_to([{"step": 0.0, "em": 0.14}, {"step": 10.0, "em": 0.12}], 0.0))  # a fall is no gain


def test_the_paired_difference_is_against_grpo_of_the_same_seed_with_a_t_interval():
    grpo = [0.10, 0.20, 0.15]
    arbor_perfect = [0.20, 0.26, 0.27]  # +0.10, +0.06, +0.12
    cells = [_cell("grpo", "perfect", s, e) for s, e in enumerate(grpo)]
    cells += [_cell("arbor", "perfect", s, e) for s, e in enumerate(arbor_perfect)]
    cells += [_cell("arbor", "noisy", s, e) for s, e in enumerate([0.05, 0.25, 0.10])]  # -0.05, +0.05, -0.05
    table = summarise(cells, SETTINGS).set_index(["variant", "dial"])
    diffs = [0.10, 0.06, 0.12]
    half = stats.t.ppf(0.975, 2) * stats.sem(diffs)
    row = table.loc[("arbor", "perfect")]
    assert row["diff_vs_baseline"] == pytest.approx(sum(diffs) / 3)
    assert (row["diff_low"], row["diff_high"]) == pytest.approx((sum(diffs) / 3 - half, sum(diffs) / 3 + half))
    assert table.loc[("arbor", "noisy")]["diff_vs_baseline"] == pytest.approx(-0.05 / 3)  # grpo's perfect cells serve it
    assert not isinstance(table.loc[("grpo", "perfect")]["baseline"], str) and math.isnan(table.loc[("grpo", "perfect")]["diff_vs_baseline"])
    assert break_even(summarise(cells, SETTINGS), SETTINGS) == {"arbor": "beats grpo up to perfect (flip rate 0)"}
    worse = [c for c in cells if not (c["variant"] == "arbor" and c["dial"] == "perfect")]
    worse += [_cell("arbor", "perfect", s, e) for s, e in enumerate([0.1, 0.1, 0.2])]
    assert "under no judge" in break_even(summarise(worse, SETTINGS), SETTINGS)["arbor"]


def test_a_method_is_paired_with_its_matched_baseline_when_the_grid_has_it():
    grids = {"session": LabGrid(variants=["grpo", "scaffold_grpo", "ss_grpo"],
                                dials={"perfect": {}, "biased": {"bias": "length", "bias_rate": 0.5}},
                                variant_dials={"ss_grpo": ["biased"]})}
    settings = SETTINGS.model_copy(update={"grids": grids})
    assert {(c.variant, c.dial) for c in grid(settings)} == {("grpo", "perfect"), ("scaffold_grpo", "perfect"),
                                                              ("ss_grpo", "biased")}
    cells = [_cell("grpo", "perfect", s, 0.10) for s in (0, 1, 2)]
    cells += [_cell("scaffold_grpo", "perfect", s, e) for s, e in enumerate([0.30, 0.40, 0.35])]
    cells += [_cell("ss_grpo", "biased", s, e) for s, e in enumerate([0.20, 0.30, 0.25])]  # 0.10 below its own
    table = summarise(cells, settings).set_index(["variant", "dial"])
    row = table.loc[("ss_grpo", "biased")]
    assert row["baseline"] == "scaffold_grpo" and row["diff_vs_baseline"] == pytest.approx(-0.10)
    assert not isinstance(table.loc[("scaffold_grpo", "perfect")]["baseline"], str)  # a matched GRPO is itself a baseline
    without = summarise([c for c in cells if c["variant"] != "scaffold_grpo"], settings.model_copy(update={
        "grids": {"session": grids["session"].model_copy(update={"variants": ["grpo", "ss_grpo"]})}}))
    assert without.set_index("variant").loc["ss_grpo"]["baseline"] == "grpo"
    assert without.set_index("variant").loc["ss_grpo"]["diff_vs_baseline"] == pytest.approx(0.15)
    with pytest.raises(ValueError, match="variant_dials.ss_grpo"):
        LabGrid(variants=["ss_grpo"], dials={"perfect": {}}, variant_dials={"ss_grpo": ["noisy"]})


def test_a_slow_variant_runs_on_its_own_seeds_and_the_table_counts_them():
    session = SETTINGS.grids["session"].model_copy(update={"variants": ["grpo", "arco"], "variant_seeds": {"arco": [0]}})
    settings = SETTINGS.model_copy(update={"grids": {"session": session}})
    assert [c.seed for c in grid(settings) if c.variant == "arco"] == [0, 0, 0]
    cells = [_cell("grpo", "perfect", s, 0.1) for s in (0, 1, 2)] + [_cell("arco", "perfect", 0, 0.3)]
    row = summarise(cells, settings).set_index(["variant", "dial"]).loc[("arco", "perfect")]
    assert row["seeds"] == 1 and row["diff_vs_baseline"] == pytest.approx(0.2) and math.isnan(row["diff_low"])


def test_the_sweep_refuses_to_train_on_questions_its_start_was_fitted_to(repo_root):
    from components.params_section import ParamsError
    from flows.lab import check_lab

    params = load_params(repo_root / "params.yaml", overlays=["lab"])
    cell = Cell("grpo", "perfect", 0)
    check_lab(params, cell_params(params, cell))  # the defaults train on the held-out questions
    fitted = load_params(repo_root / "params.yaml", overlays=["lab"], overrides=["lab.sweep.overrides=[]"])
    with pytest.raises(ParamsError, match="first_question=150"):
        check_lab(fitted, cell_params(fitted, cell))
    with pytest.raises(ParamsError, match="--overlay lab"):
        check_lab(load_params(repo_root / "params.yaml"), cell_params(params, cell))


def test_a_record_is_read_back_only_under_its_cells_settings(repo_root, tmp_path):
    """A cell finished under one judge dial (or reward) is run again, not read back, once its settings change; the
    dial is in the training run's key under the lab overlay and nowhere else."""
    from components.io import write_json
    from components.lab.sweep import cell_done, sweep_root
    from components.training.grpo.policy_run_key import run_settings
    from tasks.lab_cell import cell_key, finished_cell

    params = load_params(repo_root / "params.yaml", overlays=["lab"], overrides=[f"run.out_dir={tmp_path}"])
    cell = Cell("arbor", "noisy", 0)
    mine = cell_params(params, cell)
    assert finished_cell(params, cell, mine) is None
    root = sweep_root(params.run.out_dir, params.lab.sweep)
    cell_done(root, cell).parent.mkdir(parents=True)
    write_json(cell_done(root, cell), {"test_em": 0.1, "run_key": cell_key(mine, cell), "steps": 40})
    assert finished_cell(params, cell, mine)["test_em"] == 0.1
    longer = cell_params(params.model_copy(update={"lab": params.lab.model_copy(update={"sweep": params.lab.sweep.model_copy(
        update={"steps": 100})})}), cell)
    assert cell_key(longer, cell) == cell_key(mine, cell) and finished_cell(params, cell, longer) is None  # steps apart
    for change in ("lab.sweep.grids.session.dials.noisy.flip_rate=0.4", "grpo.format_penalty=-0.5"):
        other = load_params(repo_root / "params.yaml", overlays=["lab"],
                            overrides=[f"run.out_dir={tmp_path}", change])
        assert finished_cell(other, cell, cell_params(other, cell)) is None, change
    write_json(cell_done(root, cell), {"test_em": 0.1})  # a record from before records were keyed
    assert finished_cell(params, cell, mine) is None
    assert run_settings(mine, "arbor")["lab_judge"]["flip_rate"] == 0.25
    assert "lab_judge" not in run_settings(load_params(repo_root / "params.yaml"), "arbor")


def test_a_named_grid_has_its_own_cells_and_seeds_and_an_unknown_one_is_named(repo_root):
    """The main job's comparison (intro) is one seed of grpo and one variant of each trained method under a perfect
    and a noisy judge; its cells share their folders with the session grid's where variant, dial and seed agree."""
    settings = load_params(repo_root / "params.yaml", overlays=["lab"]).lab.sweep
    intro = grid(settings, "intro")
    assert {c.seed for c in intro} == {0} and {c.dial for c in intro} == {"perfect", "noisy"}
    assert [c for c in intro if c.variant == "grpo"] == [Cell("grpo", "perfect", 0)]
    assert len(intro) == 1 + 2 * (len(settings.grids["intro"].variants) - 1)
    assert Cell("arbor", "noisy", 0) in set(intro) & set(grid(settings, "session"))
    with pytest.raises(ValueError, match="no grid 'nightly'.*session, intro, learning, process, diversity, arco, worlds, full"):
        grid(settings, "nightly")
    params = load_params(repo_root / "params.yaml", overlays=["lab"])
    learning = grid(settings, "learning")  # a grid of its own length; the others keep lab.sweep.steps
    assert cell_params(params, learning[0], "learning").grpo.steps == 100
    assert cell_params(params, intro[0], "intro").grpo.steps == settings.steps == 40


def test_another_worlds_page_is_named_by_its_world_seed(repo_root):
    """The default world's page keeps its name; with lab.world_seed set the page is the grid's plus _world<seed>, so
    a run in another world never overwrites the default world's table."""
    from flows.lab import page_name
    lab = load_params(repo_root / "params.yaml", overlays=["lab"])
    assert page_name(lab, "session") == "lab_sweep" and page_name(lab, "intro") == "lab_sweep_intro"
    other = load_params(repo_root / "params.yaml", overlays=["lab"], overrides=["lab.world_seed=2"])
    assert page_name(other, "worlds") == "lab_sweep_worlds_world2"
    assert [c.variant for c in grid(other.lab.sweep, "worlds")] == ["grpo", "arbor"] * 3  # seed by seed
    from components.training.grpo.policy_run_key import run_settings
    cell = Cell("arbor", "perfect", 1)
    mine = cell_params(other, cell, "worlds")
    assert mine.lab.world_seed == 2 and mine.seed == 1  # the cell's own seed, the sweep's world
    assert run_settings(mine, "arbor")["lab_world_seed"] == 2
    assert "lab_world_seed" not in run_settings(cell_params(lab, cell, "worlds"), "arbor")


def test_a_cells_gaming_flag_counts_only_the_reward_beyond_the_outcome():
    """A cell's flag is recomputed from its metrics: an outcome-only cell whose train reward rose while dev EM fell is
    not flagged; a cell whose judge bonus rose is; before reward/outcome was logged, reward/em stands in."""
    import pandas as pd

    from components.lab.sweep import _gaming

    last = {"dev_before.em": 0.26, "dev_after.em": 0.20}
    up = [0.1, 0.15, 0.2, 0.25, 0.3, 0.35]
    honest = pd.DataFrame({"step": range(1, 7), "reward/mean": up, "reward/outcome": up})
    assert not _gaming(honest, last).suspected
    judged = pd.DataFrame({"step": range(1, 7), "reward/mean": up, "reward/outcome": [0.1] * 6})
    assert _gaming(judged, last).suspected
    older = pd.DataFrame({"step": range(1, 7), "reward/mean": up, "reward/em": up})
    assert not _gaming(older, last).suspected


def test_a_grids_own_overrides_apply_to_its_cells_after_the_sweeps(repo_root):
    params = load_params(repo_root / "params.yaml", overlays=["lab"], overrides=[
        "lab.sweep.overrides=[grpo.lr=1.0e-4,train_policy.first_question=150]",
        "lab.sweep.grids.learning.overrides=[grpo.lr=3.0e-5]"])
    cell = Cell("grpo", "perfect", 0)
    assert cell_params(params, cell, "learning").grpo.lr == 3e-5  # the grid's, over the sweep's
    assert cell_params(params, cell, "session").grpo.lr == 1e-4  # another grid keeps the sweep's
    assert cell_params(params, cell, "learning").train_policy.first_question == 150


def test_a_panel_draws_the_variants_that_ran_under_its_judge():
    """An outcome-only baseline's one judge is drawn in every panel; a variant kept to some judges
    (``variant_dials``) is drawn only in theirs."""
    cells = [{"variant": "grpo", "dial": "perfect", "seed": 0}, {"variant": "arco", "dial": "perfect", "seed": 0},
             {"variant": "arbor", "dial": "perfect", "seed": 0}, {"variant": "arbor", "dial": "noisy", "seed": 0}]
    noisy = panel_cells(cells, "noisy", outcome_only=["grpo"])
    assert {v: [c["dial"] for c in mine] for v, mine in noisy.items()} == {"grpo": ["perfect"], "arbor": ["noisy"]}
    assert list(panel_cells(cells, "perfect", outcome_only=["grpo"])) == ["grpo", "arco", "arbor"]
