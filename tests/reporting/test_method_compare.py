"""The method comparison (an evaluation sweep's table): one row per method with the mean and sample standard
deviation over seeds of accuracy, behaviour, retries and per-role cost, NaN where a method has no such
metric, and the files it writes."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from components.reporting.compare import discover_runs, seed_dir
from components.reporting.methods import write_method_report
from tests.reporting.helpers import make_evaluation


def evaluation(em: float, f1: float, judge: float, calls: float, **extra: float) -> dict[str, float]:
    return {"n": 10.0, "em": em, "f1": f1, "judge_accuracy": judge, "judge_failures": 0.0,
            "tool_calls_total_per_question": 2.0, "unique_docs_retrieved": 5.0, "unique_docs_cited": 1.0,
            "utilisation": 0.2, "cost.calls": calls, "cost.tokens": 100 * calls, "cost.policy.calls": calls,
            "cost.policy.completion_tokens": 20 * calls, "cost.policy.prompt_tokens": 80 * calls, **extra}


@pytest.fixture
def sweep(tmp_path):
    root = tmp_path / "sweep"
    make_evaluation(seed_dir(root, 1) / "eval" / "sft", evaluation(0.4, 0.5, 0.5, 3.0), s_per_question=5.0)
    make_evaluation(seed_dir(root, 2) / "eval" / "sft", evaluation(0.4, 0.5, 0.5, 3.0), s_per_question=7.0)
    guided = {"verification_failure_rate": 0.25, "retry_rate": 0.2, "cost.verifier.calls": 2.0,
              "cost.verifier.failures": 0.1, "cost.rubric_generator.calls": 3.0}
    make_evaluation(seed_dir(root, 1) / "eval" / "coreact", evaluation(0.3, 0.35, 0.4, 8.0, **guided))
    make_evaluation(seed_dir(root, 2) / "eval" / "coreact",
                    evaluation(0.5, 0.55, 0.6, 10.0, **{**guided, "retry_rate": 0.4}))
    make_evaluation(seed_dir(root, 1) / "train" / "grpo", {"em": 1.0})  # a training run is not a method
    return root


def test_one_row_per_method_with_mean_and_spread_over_seeds(sweep):
    runs = discover_runs(sweep, stage="eval")
    assert list(runs) == ["coreact", "sft"] and [len(v) for v in runs.values()] == [2, 2]
    report = write_method_report(runs, sweep)
    table = report.table
    assert list(table["seeds"]) == [2, 2]
    assert table.loc["coreact", "em"] == pytest.approx(0.4)
    assert table.loc["coreact", "em.sd"] == pytest.approx(math.sqrt(0.02))  # sample sd of 0.3, 0.5
    assert table.loc["coreact", "retry_rate"] == pytest.approx(0.3)
    assert table.loc["coreact", "cost.verifier.calls"] == pytest.approx(2.0)
    assert table.loc["sft", "em.sd"] == pytest.approx(0.0)
    assert math.isnan(table.loc["sft", "retry_rate"]) and math.isnan(table.loc["sft", "cost.verifier.calls"])
    assert table.loc["sft", "s_per_question"] == pytest.approx(6.0)
    assert "cost.policy.prompt_tokens" not in table  # prompt tokens are in cost.tokens
    assert "0.400 ± 0.141" in report.markdown


def test_the_files_hold_the_table_each_run_and_the_plot(sweep):
    report = write_method_report(discover_runs(sweep, stage="eval"), sweep)
    saved = pd.read_csv(report.paths["methods_csv"], index_col=0)
    assert saved.loc["coreact", "f1"] == pytest.approx(0.45)
    per_run = pd.read_csv(report.paths["method_runs_csv"])
    assert len(per_run) == 4 and set(per_run["variant"]) == {"sft", "coreact"}
    assert report.paths["methods_md"].read_text() == report.markdown
    assert report.paths["methods_plot"].stat().st_size > 10_000


def test_nothing_to_compare_is_an_error(tmp_path):
    with pytest.raises(ValueError, match="no evaluations"):
        write_method_report({}, tmp_path)
