"""Reward shaping on hand-made groups (ARBOR Eq. 3-4) and the Table 2 zero-variance report."""

import pytest

from components.methods.arbor.shaping import homogeneity_metrics, outcome_pattern, shape_group

KW = {"lam": 0.1, "alpha": 0.25, "delta_v": 0.05}


def test_an_all_wrong_group_gets_non_zero_variance():
    shaped = shape_group([0.0] * 4, [True] * 4, [[1.0, 0.5, 0.5, 0.0]], **KW)
    # centred [0.5, 0, 0, -0.5]; the negative one attenuated by alpha
    assert shaped.total == pytest.approx([0.05, 0.0, 0.0, -0.0125])
    assert max(shaped.total) > min(shaped.total) and shaped.kept == [0]


def test_format_invalid_keeps_the_penalty_and_still_counts_in_the_centring():
    shaped = shape_group([1.0, 0.5, -1.0, 0.0], [True, True, False, True], [[1.0, 0.5, 1.0, 0.0]], **KW)
    # mean 0.625 over all four; centred [.375, -.125, (invalid), -.625]
    assert shaped.total == pytest.approx([1.0375, 0.5 - 0.003125, -1.0, -0.015625])
    assert shaped.term[2] == 0.0


def test_rubrics_below_the_variance_threshold_are_dropped_for_the_group():
    flat = [0.5, 0.5, 0.5, 0.75]  # variance 0.0117
    shaped = shape_group([0.0] * 4, [True] * 4, [flat], **KW)
    assert shaped.total == [0.0] * 4 and shaped.kept == [] and shaped.term == [None] * 4
    both = shape_group([0.0] * 4, [True] * 4, [flat, [1.0, 0.0, 1.0, 0.0]], **KW)
    assert both.kept == [1] and both.total == pytest.approx([0.05, -0.0125, 0.05, -0.0125])


def test_composite_averages_the_kept_rubrics_that_scored_each_trajectory():
    shaped = shape_group([0.0] * 3, [True] * 3, [[1.0, 0.0, None], [1.0, 0.5, 0.0]], **KW)
    assert shaped.composite == pytest.approx([1.0, 0.25, 0.0])


def test_a_trajectory_no_judge_scored_keeps_its_base_reward_not_a_zero_score():
    shaped = shape_group([0.5] * 4, [True] * 4, [[1.0, 0.0, None, 0.5]], **KW)
    assert shaped.composite[2] is None and shaped.unscored == 1
    # centring over the three scored: mean 0.5; the unscored one sits at the mean, not below everyone
    assert shaped.total == pytest.approx([0.55, 0.5 - 0.0125, 0.5, 0.5])


def test_lambda_and_alpha_scale_the_term():
    shaped = shape_group([0.0, 0.0], [True, True], [[1.0, 0.0]], lam=1.0, alpha=1.0, delta_v=0.0)
    assert shaped.total == pytest.approx([0.5, -0.5])


def test_outcome_patterns():
    assert outcome_pattern([1, 1], [True, True]) == "all_correct"
    assert outcome_pattern([0, 0], [True, False]) == "all_wrong"
    assert outcome_pattern([0.5, 0.5], [True, True]) == "mixed_uniform"
    assert outcome_pattern([1, 0], [True, True]) == "mixed"


def test_zero_variance_fractions_under_base_and_total_and_the_rescued_fraction():
    groups = [
        ([1, 1], [True, True], [1, 1], [1.05, 0.99]),                # all-correct, rescued
        ([0, 0], [True, True], [0, 0], [0.05, -0.01]),               # all-wrong, rescued
        ([0, 0], [False, False], [-1, -1], [-1, -1]),                # all-wrong (format), not rescued
        ([0.5, 0.5], [True, True], [0.5, 0.5], [0.5, 0.5]),          # mixed-uniform, not rescued
        ([1, 0], [True, True], [1, 0], [1.05, -0.01]),               # mixed: never zero-variance
    ]
    m = homogeneity_metrics(groups)
    assert m["groups"] == 5
    assert (m["zero_var/base/all_correct"], m["zero_var/base/all_wrong"], m["zero_var/base/mixed_uniform"]) == \
        (0.2, 0.4, 0.2)
    assert m["zero_var/base/all"] == 0.8 and m["zero_var/total/all"] == 0.4
    assert (m["zero_var/total/all_correct"], m["zero_var/total/all_wrong"]) == (0.0, 0.2)
    assert m["zero_var/rescued_fraction"] == 0.5
    assert "zero_var/rescued_fraction" not in homogeneity_metrics([groups[-1]])
