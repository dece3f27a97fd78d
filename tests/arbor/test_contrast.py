"""Contrastive induction anchors and every corner case of ARBOR appendix A.1, on hand-made groups."""

import pytest

from components.methods.arbor.induction import induction_messages
from components.methods.arbor.contrast import plan_induction

ALL_VALID = [True] * 4


def test_anchors_positive_worst_and_hard_with_both_pairs():
    plan = plan_induction([1.0, 0.5, 0.0, 0.5], [10, 8, 5, 6], ALL_VALID)
    assert (plan.kind, plan.reason) == ("pairs", "contrast")
    # tau-hard is the best strictly below tau+; the two 0.5s tie and the shorter (index 3) wins
    assert (plan.positive, plan.worst, plan.hard) == (0, 2, 3)
    assert plan.pairs == [(0, 2), (0, 3)]


def test_ties_on_the_top_score_go_to_the_shortest_and_the_other_top_is_not_hard():
    plan = plan_induction([1.0, 1.0, 0.0, 0.5], [9, 4, 7, 3], ALL_VALID)
    assert plan.positive == 1  # shorter of the two F1=1 trajectories
    assert plan.hard == 3 and plan.worst == 2  # index 0 shares tau+'s F1: no contrast, never tau-hard


def test_ties_on_the_lowest_score_go_to_the_shortest():
    plan = plan_induction([1.0, 0.0, 0.0, 0.5], [5, 9, 4, 6], ALL_VALID)
    assert plan.worst == 2 and plan.hard == 3 and plan.pairs == [(0, 2), (0, 3)]


def test_one_trajectory_below_the_top_collapses_to_one_pair():
    plan = plan_induction([1.0, 1.0, 0.5], [6, 5, 9], [True] * 3)
    assert plan.reason == "collapsed" and plan.positive == 1
    assert plan.hard == plan.worst == 2 and plan.pairs == [(1, 2)]


def test_everything_below_sharing_one_score_collapses_too():
    plan = plan_induction([1.0, 0.0, 0.0], [5, 3, 7], [True] * 3)
    assert plan.reason == "collapsed" and plan.pairs == [(0, 1)]


@pytest.mark.parametrize("f1,valid,reason", [
    ([1.0, 1.0, 1.0, 1.0], ALL_VALID, "all_correct"),
    ([0.0, 0.0, 0.0, 0.0], ALL_VALID, "all_wrong"),
    ([0.0, 0.0, 0.0, 0.0], [True, True, False, False], "all_wrong"),  # format-invalid ones count as F1 0
    ([1.0, 0.0, 0.0, 0.0], [True, False, False, False], "too_few_valid"),
    ([0.5, 0.0], [True, False], "too_few_valid"),
])
def test_groups_without_contrast_are_skipped(f1, valid, reason):
    plan = plan_induction(f1, [1] * len(f1), valid)
    assert (plan.kind, plan.reason, plan.pairs) == ("skip", reason, [])


def test_a_shared_intermediate_score_sends_every_trajectory_unlabelled():
    plan = plan_induction([0.5, 0.5, 0.5], [3, 2, 1], [True] * 3)
    assert (plan.kind, plan.reason, plan.members, plan.pairs) == ("unlabelled", "uniform_partial", [0, 1, 2], [])


def test_format_invalid_trajectory_is_a_low_anchor_not_a_positive():
    # gated F1: the invalid trajectory (index 2) counts 0, so it is the only one below tau+
    plan = plan_induction([0.5, 0.5, 0.0], [9, 3, 1], [True, True, False])
    assert plan.positive == 1 and plan.pairs == [(1, 2)]


def test_prompts_show_the_anchor_pairs_or_every_trajectory():
    texts = ["T0", "T1", "T2", "T3"]
    plan = plan_induction([1.0, 0.5, 0.0, 0.5], [10, 8, 5, 6], ALL_VALID)
    user = induction_messages("Q?", ["Ans"], texts, [1.0, 0.5, 0.0, 0.5], plan, [], 3)[1].content
    assert user.count("Higher-scoring attempt ---\nT0") == 2 and "Lower-scoring attempt ---\nT2" in user
    assert "Lower-scoring attempt ---\nT3" in user and "T1" not in user and "Reference answer: Ans" in user
    flat = plan_induction([0.5] * 4, [1] * 4, ALL_VALID)
    user = induction_messages("Q?", None, texts, [0.5] * 4, flat, [], 3)[1].content
    assert all(t in user for t in texts) and "Higher-scoring" not in user and "Reference answer" not in user
    with pytest.raises(ValueError, match="all_wrong"):
        induction_messages("Q?", None, texts, [0.0] * 4, plan_induction([0.0] * 4, [1] * 4, ALL_VALID), [], 3)
