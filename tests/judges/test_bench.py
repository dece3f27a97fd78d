"""The judge bench: the trajectory set's oracle labels on a small world, the agreement metrics on a hand-made
verdict table, and a judge that always says "A" (through the bench's own call, on a scripted backend)."""

from __future__ import annotations

import asyncio
import math
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from components.judges.bench import metrics
from components.judges.bench.trajectories import build_set, labels, pairs, preference, write_set
from components.llm.backends.scripted import ScriptedChatModel
from tests.judges.conftest import SETTINGS, small_world

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def bench_set():
    questions, toolbox, titles = small_world()
    return build_set(questions, toolbox, SETTINGS, titles, n_questions=4, seed=5), (questions, toolbox, titles)


def test_labels_of_each_variant(bench_set):
    items, _ = bench_set
    by = {(i.question.id, i.variant): i for i in items}
    golds = [i for i in items if i.variant == "gold"]
    assert len(golds) == 4
    for g in golds:
        gl = g.labels
        assert gl["em"] == 1.0 and gl["hops_found"] == gl["n_hops"] == len(g.question.gold_chain)
        assert gl["facts_found"] == gl["n_hops"] and None not in gl["hop_steps"]
        assert labels(g.trajectory, g.question) == gl
        qid = g.question.id
        wrong = by.get((qid, "wrong_answer"))
        if wrong:
            assert wrong.labels["em"] == 0.0 and wrong.labels["hops_found"] == gl["hops_found"]
            assert preference(gl, wrong.labels) == "A" and preference(wrong.labels, gl) == "B"
        skip = by.get((qid, "skip_hop"))
        if skip:
            assert skip.labels["hops_found"] == gl["hops_found"] - 1
            assert len(skip.trajectory.steps) == len(g.trajectory.steps) - 1
            assert [s.index for s in skip.trajectory.steps] == list(range(len(skip.trajectory.steps)))
            assert preference(gl, skip.labels) == "A"
        cut = by[(qid, "truncated")]
        assert cut.labels["em"] == 0.0 and not cut.labels["answered"] and cut.trajectory.final_answer is None
        assert cut.labels["hops_found"] <= gl["hops_found"]
        extra = by.get((qid, "irrelevant_search"))
        if extra:
            assert extra.labels["em"] == 1.0 and extra.labels["hops_found"] == gl["hops_found"]
            assert len(extra.trajectory.steps) == len(g.trajectory.steps) + 1
            assert preference(gl, extra.labels) is None
    assert {i.variant for i in items} >= {"wrong_answer", "skip_hop", "truncated", "irrelevant_search"}
    assert len(pairs(items)) == len(items) - len(golds)


def test_the_set_is_fixed_and_digested(bench_set, tmp_path):
    items, (questions, toolbox, titles) = bench_set
    again = build_set(questions, toolbox, SETTINGS, titles, n_questions=4, seed=5)
    first = write_set(items, tmp_path / "a" / "set.jsonl", {"world_seed": 3})
    second = write_set(again, tmp_path / "b" / "set.jsonl", {"world_seed": 3})
    assert first == second and len(first) == 64
    assert (tmp_path / "a" / "set.manifest.json").exists()


# a hand-made verdict table: (pair, order, preferred in the shown positions, winner, expected for A)
TABLE = [
    ("p1", "AB", "A", "A", 1.0), ("p1", "BA", "B", "B", 0.0),      # right both ways
    ("p2", "AB", "A", "A", 1.0), ("p2", "BA", "B", "A", 1.0),      # follows the position
    ("p3", "AB", "A", "TIE", 0.5), ("p3", "BA", "B", "B", 0.0),    # flat once, right once
    ("p4", "AB", None, "TIE", 0.5), ("p4", "BA", None, "TIE", 0.5),  # the oracle has no preference
    ("p5", "AB", "A", None, None), ("p5", "BA", "B", "B", 0.0),    # one failed judgment
]
ROWS = [{"pair": p, "order": o, "preferred": pref, "winner": w, "expected": e} for p, o, pref, w, e in TABLE]


def test_pairwise_metrics_match_hand_computed_values():
    s = metrics.pairwise_summary(ROWS, seed=0)
    assert s["accuracy_n"] == 7 and s["accuracy"] == pytest.approx(5 / 7)      # 7 judged rows with a preference
    assert s["flat_rate"] == pytest.approx(1 / 7)
    assert s["failure_rate"] == pytest.approx(1 / 10)
    assert s["position_effect"] == pytest.approx(1 / 4) and s["position_effect_n"] == 4   # p2 of p1-p4
    assert s["auc"] == pytest.approx(10 / 12)  # positives 1, 1, 0.5 against negatives 0, 1, 0, 0
    assert s["tie_when_oracle_ties"] == 1.0 and s["no_preference_rows"] == 2
    low, high = s["accuracy_ci"]
    assert 0.0 <= low < 5 / 7 < high <= 1.0
    right = [1, 1, 1, 0, 0, 1, 1]
    expected = stats.bootstrap((np.array(right, dtype=float),), np.mean, confidence_level=0.95, n_resamples=2000,
                               method="percentile", vectorized=False, random_state=np.random.default_rng(0))
    assert (low, high) == pytest.approx((expected.confidence_interval.low, expected.confidence_interval.high))
    assert metrics.pairwise_summary(ROWS, seed=0)["accuracy_ci"] == s["accuracy_ci"]   # a fixed seed


def test_answer_metrics_and_interval_edges():
    rows = [{"label": True, "verdict": 1.0}, {"label": False, "verdict": 0.0}, {"label": True, "verdict": 0.4},
            {"label": False, "verdict": None}, {"label": False, "verdict": 0.7}]
    s = metrics.answer_summary(rows)
    assert s["accuracy"] == 0.5 and s["accuracy_n"] == 4 and s["failure_rate"] == pytest.approx(0.2)
    assert s["auc"] == pytest.approx(0.75)
    assert metrics.bootstrap_interval([1.0, 1.0, 1.0]) == (1.0, 1.0)
    assert metrics.bootstrap_interval([1.0]) is None
    assert math.isnan(metrics.auc([0.2, 0.3], [True, True]))
    cost = metrics.cost_summary([{"calls": 1, "prompt_tokens": 100, "completion_tokens": 5, "seconds": 2.0,
                                  "asked_first": True},
                                 {"calls": 1, "prompt_tokens": 100, "completion_tokens": 7, "seconds": 1.0,
                                  "asked_first": False}])
    assert cost["tokens_per_judgment"] == 106 and cost["seconds_per_judgment"] == 1.5
    assert cost["seconds_per_judgment_cold"] == 2.0


def test_a_judge_that_always_says_A_has_position_effect_one(bench_set):
    from components.judges.bench.registry import Context, load_judgments
    from components.judges.call import Tally
    from components.params_load import load_params

    items, _ = bench_set
    pairwise = {j.name: j for j in load_judgments()}["arbor_pairwise"]
    params = load_params()
    judge = ScriptedChatModel(lambda messages, sampling: '{"winner": "A"}')
    rows = []
    for unit in pairwise.units(items, params):
        tally = Tally()
        row = asyncio.run(pairwise.ask(judge, unit, Context(False, tally, params)))
        rows.append({**unit.label, **row, "calls": tally.calls})
    assert len(rows) == 2 * len(pairs(items))
    s = metrics.pairwise_summary(rows)
    assert s["position_effect"] == 1.0 and s["attempt_effect"] == 0.0
    assert s["failure_rate"] == 0.0 and s["flat_rate"] == 0.0
    assert s["accuracy"] == pytest.approx(0.5) and s["auc"] == pytest.approx(0.5)
    assert all(r["calls"] == 1 and r["winner"] == "A" and r["expected"] == 1.0 for r in rows)


def test_report_writes_a_table_and_a_recommendation():
    from components.judges.bench import report
    base = {"accuracy_n": 4, "accuracy_ci": None, "auc_ci": (0.1, 0.9), "flat_rate": None, "position_effect": None,
            "failure_rate": 0.0, "calls_per_judgment": 1.0, "tokens_per_judgment": 100.0,
            "seconds_per_judgment": 1.0, "seconds_per_judgment_cold": 1.0}
    summaries = [{**base, "judgment": "answer_judge", "role": "answer_judge", "mode": "text", "accuracy": 0.5,
                  "auc": 0.6},
                 {**base, "judgment": "answer_judge", "role": "answer_judge", "mode": "probability",
                  "accuracy": 0.5, "auc": 0.8}]
    assert report.table(summaries).count("\n") == 3
    rec = report.recommend(summaries)
    assert rec["answer_judge"]["mode"] == "probability" and not rec["answer_judge"]["separated"]
    assert report.scoring_setting(rec) == "llm.scoring: {answer_judge: probability}"


def test_recommendation_names_a_methods_own_scoring_key_not_its_role():
    """ARBOR's pairwise judge reads arbor.judge_scoring, not llm.scoring of its role: the setting must say so."""
    from components.judges.bench import report
    base = {"accuracy_n": 4, "accuracy_ci": None, "auc_ci": (0.1, 0.9), "accuracy": 0.5, "seconds_per_judgment": 1.0}
    summaries = [{**base, "judgment": "arbor_pairwise", "role": "rubric_evaluator", "mode": "text", "auc": 0.6,
                  "scoring_key": "arbor.judge_scoring"},
                 {**base, "judgment": "arbor_pairwise", "role": "rubric_evaluator", "mode": "probability",
                  "auc": 0.8, "scoring_key": "arbor.judge_scoring"},
                 {**base, "judgment": "answer_judge", "role": "answer_judge", "mode": "text", "auc": 0.9},
                 {**base, "judgment": "answer_judge", "role": "answer_judge", "mode": "probability", "auc": 0.7}]
    setting = report.scoring_setting(report.recommend(summaries)).splitlines()
    assert setting == ["llm.scoring: {}   # text for every role (the default)",
                       "arbor.judge_scoring: probability   # arbor_pairwise"]
