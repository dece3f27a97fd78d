"""``perf/bench_train_step.py`` (issue 49.3) without a model: reading the trainer's ``metrics.csv`` into a step's
breakdown, the ratios against the baseline, the side's cache folder and the recorded command. Under a second.

    .venv/bin/python -m pytest -q tests/test_perf_train_step.py
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path

import pytest

from tests.test_perf_suite import load

bench = load("bench_train_step")

COLUMNS = ["step", "reward/mean", "response_length", "time/rollout", "time/reward", "time/update",
           "memory/peak_rss_gb", "note", "loss", "grad_norm"]


def write_metrics(path: Path, rows: list[list]) -> Path:
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(COLUMNS)
        w.writerows(rows)
    return path


def test_a_step_is_its_phases_and_tokens_are_length_times_episodes(tmp_path):
    steps = bench.step_rows(write_metrics(tmp_path / "m.csv", [
        [1, 0.25, 100, 60.0, 2.0, 300.0, 11.0, "x", -0.2, 0.5],
        [2, 0.75, 140, 80.0, 4.0, 100.0, 13.5, "", 0.1, 0.7],
        [3, 0.50, 120, 70.0, 0.0, 200.0, 12.0, "", 0.3, 0.6],
    ]))
    s = bench.summarize(steps, group_size=4, prompts=2)
    assert (s["rollout_s"], s["reward_s"], s["update_s"]) == (70.0, 2.0, 200.0)
    assert s["step_s"] == 270.0  # the median of the per-step sums (362, 184, 270), not the sum of medians (272)
    assert s["generated_tokens"] == 120 * 4 * 2
    assert s["rollout_tok_per_s"] == pytest.approx(960 / 70)
    assert s["peak_rss_gb"] == 13.5 and s["steps"] == 3
    assert (s["reward_mean"], s["loss"], s["grad_norm"]) == (0.5, 0.1, 0.6)


def test_the_method_time_counts_in_the_update_as_older_revisions_counted_it(tmp_path):
    path = tmp_path / "m.csv"
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["step", "time/rollout", "time/reward", "time/update", "time/method", "time/checkpoint"])
        w.writerows([[1, 60.0, 2.0, 300.0, 40.0, 0.0], [2, 50.0, 1.0, 200.0, 10.0, 8.0]])
    s = bench.summarize(bench.step_rows(path), group_size=4, prompts=1)
    assert s["update_s"] == 275.0 and s["method_s"] == 25.0   # medians of (340, 210) and (40, 10)
    assert s["checkpoint_s"] == 4.0                            # reported, not counted in the step
    assert s["step_s"] == pytest.approx((402 + 261) / 2)
    old = bench.summarize(bench.step_rows(write_metrics(tmp_path / "o.csv", [[1, 0.5, 100, 60.0, 2.0, 300.0, 11.0,
                                                                              "", 0.1, 0.5]])), 4, 1)
    assert old["method_s"] is None and old["checkpoint_s"] is None and old["update_s"] == 300.0


def test_rows_without_the_phase_times_are_not_steps(tmp_path):
    path = write_metrics(tmp_path / "m.csv", [[1, 0.5, 100, "", "", "", 1.0, "dev only", "", ""]])
    with pytest.raises(ValueError, match=r"m\.csv: no row with time/rollout"):
        bench.step_rows(path)


def test_ratios_are_new_over_the_first_baseline_and_skip_what_is_missing():
    old = {"rollout_s": 100.0, "reward_s": 0.0, "update_s": 900.0, "step_s": 1000.0, "stage_wall_s": 1200.0,
           "peak_rss_gb": 10.0}
    new = {**old, "rollout_s": 80.0, "update_s": 220.0, "step_s": 300.0, "peak_rss_gb": 12.5}
    r = bench.ratios(new, old)
    assert r["rollout_s"] == pytest.approx(0.8) and r["update_s"] == pytest.approx(220 / 900)
    assert r["step_s"] == pytest.approx(0.3) and r["peak_rss_gb"] == pytest.approx(1.25)
    assert r["reward_s"] is None           # 0 s on the baseline: no ratio rather than a division by zero


def test_a_side_links_the_models_but_not_the_response_cache(tmp_path, monkeypatch):
    repo = tmp_path / "repo"
    (repo / ".cache" / "models").mkdir(parents=True)
    (repo / ".cache" / "llm_responses.sqlite").write_text("")
    (repo / ".cache" / "dev_before").mkdir()
    monkeypatch.setattr(bench, "REPO", repo)
    bench.side_cache(tmp_path / "side")
    assert sorted(p.name for p in (tmp_path / "side").iterdir()) == ["models"]
    assert (tmp_path / "side" / "models").resolve() == (repo / ".cache" / "models").resolve()


def test_the_recorded_command_names_no_machine_path(tmp_path, monkeypatch):
    monkeypatch.setattr(bench, "REPO", tmp_path)
    args = argparse.Namespace(adapter=tmp_path / "outputs" / "sft" / "adapter", baseline_rev=["fbc3f92"],
                              variant="grpo", steps=1, prompts=1, seed=1234, side=["int8:grpo.int8_base=true"])
    shown = bench.shown_command(args)
    assert str(tmp_path) not in shown
    assert shown.startswith("python perf/bench_train_step.py --adapter outputs/sft/adapter --baseline-rev fbc3f92 "
                            "--side int8:grpo.int8_base=true")


def test_the_suite_reads_one_target_row_per_later_side():
    suite = load("suite")
    side = {"rollout_s": 100.0, "update_s": 900.0, "step_s": 1000.0, "generated_tokens": 800.0}
    rows = [{"code": "fbc3f92", **side}, {"code": "working tree", **side, "update_s": 300.0, "step_s": 400.0}]
    ratio_rows = [{"code": "working tree", **bench.ratios(rows[1], rows[0])}]
    found = suite.target_rows({"targets": bench.target_rows(rows, ratio_rows)})
    assert [(r["measure"], r["value"], r["target"], r["met"]) for r in found] == [
        ("GRPO step, working tree / fbc3f92", pytest.approx(0.4), "<= 0.5", True)]
    rows[1]["step_s"] = 600.0
    ratio_rows = [{"code": "working tree", **bench.ratios(rows[1], rows[0])}]
    assert suite.target_rows({"targets": bench.target_rows(rows, ratio_rows)})[0]["met"] is False
