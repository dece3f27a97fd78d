"""ARCO's losses, dense advantages and diagnostics against hand-computed values, and the yes/no EM variant."""

import math

import pytest
import torch

from components.evaluation.metrics import exact_match, exact_match_yes_no_first3
from components.methods.arco.criteria import trajectory_steps
from components.methods.arco.decomposition import (
    class_balanced_weights,
    criteria_diversity,
    decomposition_loss,
    oracle_step_quality,
    per_step_outcome_loss,
    position_bucket_advantages,
    reward_to_go,
    step_advantages,
    step_buckets,
    step_diagnostics,
    terminal_reward,
)
from components.schemas import Question
from tests.arco.helpers import BAD, GOOD, Q, trajectory

NAN = math.nan


def test_decomposition_loss_by_hand():
    # trajectory 0: 0.2 + 0.5 + 0.1 = 0.8 vs R = 1 -> 0.04; trajectory 1: 0.3 - 0.1 = 0.2 vs R = 0 -> 0.04
    r = [torch.tensor([0.2, 0.5, 0.1]), torch.tensor([0.3, -0.1])]
    outcomes = torch.tensor([1.0, 0.0])
    assert float(decomposition_loss(r, outcomes)) == pytest.approx((0.04 + 0.04) / 2)
    assert float(decomposition_loss(r, outcomes, denominator=4)) == pytest.approx(0.08 / 4)
    # the gradient of (sum - R)^2 is 2 (sum - R), the same for every step of a trajectory
    leaf = torch.tensor([0.2, 0.5, 0.1], requires_grad=True)
    decomposition_loss([leaf], torch.tensor([1.0])).backward()
    assert leaf.grad.tolist() == pytest.approx([-0.4, -0.4, -0.4])


def test_class_balanced_weights_and_the_weighted_fits_by_hand():
    # one success in four: 4 / (2 x 1) = 2 for it, 4 / (2 x 3) for each failure; each class weighs n / 2 = 2
    w = class_balanced_weights([1.0, 0.0, 0.3, 0.5])
    assert w.tolist() == pytest.approx([2.0, 2 / 3, 2 / 3, 2 / 3])  # 0.5 is not above the threshold
    assert class_balanced_weights([0.0, 0.0]).tolist() == pytest.approx([0.5, 0.5])  # no success: n_pos counts 1
    r = [torch.tensor([0.2, 0.5, 0.1]), torch.tensor([0.3, -0.1])]
    outcomes = torch.tensor([1.0, 0.0])
    w = class_balanced_weights(outcomes)  # one of each: 1, 1
    assert float(decomposition_loss(r, outcomes, weights=w)) == pytest.approx(float(decomposition_loss(r, outcomes)))
    w = torch.tensor([3.0, 0.5])
    assert float(decomposition_loss(r, outcomes, weights=w)) == pytest.approx((3 * 0.04 + 0.5 * 0.04) / 2)
    per = [(0.64 + 0.25 + 0.81) / 3, 0.05]
    assert float(per_step_outcome_loss(r, outcomes, weights=w)) == pytest.approx((3 * per[0] + 0.5 * per[1]) / 2)
    with pytest.raises(ValueError, match="weights"):
        decomposition_loss(r, outcomes, weights=torch.ones(3))


def test_per_step_outcome_loss_by_hand():
    r = [torch.tensor([0.2, 0.5, 0.1]), torch.tensor([0.3, -0.1])]
    # traj 0: ((0.8^2 + 0.5^2 + 0.9^2) / 3) = 0.5667; traj 1: (0.09 + 0.01) / 2 = 0.05
    expected = ((0.64 + 0.25 + 0.81) / 3 + 0.05) / 2
    assert float(per_step_outcome_loss(r, torch.tensor([1.0, 0.0]))) == pytest.approx(expected)


def test_reward_to_go_masks_absent_and_missing_steps():
    r = torch.tensor([[0.2, 0.5, 0.1], [0.1, NAN, 0.4], [0.3, 0.0, NAN]])
    g = reward_to_go(r, [3, 3, 2], gamma=0.5)
    assert g[0].tolist() == pytest.approx([0.2 + 0.5 * (0.5 + 0.5 * 0.1), 0.5 + 0.05, 0.1])
    assert math.isnan(g[1, 0]) and math.isnan(g[1, 1]) and g[1, 2] == pytest.approx(0.4)  # missing: no 0 filled in
    assert g[2, :2].tolist() == pytest.approx([0.3, 0.0]) and math.isnan(g[2, 2])


def test_step_advantages_per_step_baseline_by_hand():
    r = torch.tensor([[0.2, 0.5], [0.1, NAN], [0.9, NAN]])
    # group 0 = rows 0, 1. G = [[0.7, 0.5], [0.1, -]]: column 0 baseline 0.4; column 1 has one value -> pooled
    # mean (0.7 + 0.5 + 0.1) / 3. Group 1 (row 2) has a single value -> 0.
    a = step_advantages(r, [2, 1, 1], [0, 0, 1], normalize_std=False)
    assert a[0].tolist() == pytest.approx([0.3, 0.5 - 1.3 / 3])
    assert a[1, 0] == pytest.approx(-0.3) and math.isnan(a[1, 1])
    assert a[2, 0] == 0.0 and math.isnan(a[2, 1])
    std = torch.tensor([0.7, 0.5, 0.1]).std(unbiased=False)
    scaled = step_advantages(r, [2, 1, 1], [0, 0, 1])
    assert scaled[0, 0] == pytest.approx(0.3 / (float(std) + 1e-6))
    assert step_advantages(r, [2, 1, 1], [0, 0, 1], normalize_std=False, scale=0.5)[0, 0] == pytest.approx(0.15)


def test_step_buckets_rank_searches_and_call_the_rest_terminal():
    assert step_buckets(trajectory_steps(trajectory(GOOD))) == ["search_1", "search_2", "terminal"]
    # out of turns after two searches: the forced answer is the last step; a trajectory that ends on a search
    # ends on a terminal step; an unreadable action mid-way is terminal and does not count as a search
    forced = trajectory(GOOD[:2], forced=True)
    assert step_buckets(trajectory_steps(forced)) == ["search_1", "search_2", "terminal"]
    assert step_buckets(trajectory_steps(trajectory(GOOD[:2]))) == ["search_1", "terminal"]
    steps = trajectory_steps(trajectory(GOOD))
    unreadable = [steps[0], type(steps[1])(index=1, thought="", action="(unreadable)"), *steps[1:]]
    assert step_buckets(unreadable) == ["search_1", "terminal", "search_2", "terminal"]


def test_position_bucket_advantages_by_hand():
    r = torch.tensor([[0.2, 0.5, 0.1], [0.4, 0.0, NAN], [0.6, NAN, NAN]])
    buckets = [["search_1", "search_2", "terminal"], ["search_1", "terminal"], ["terminal"]]
    # G = [[0.8, 0.6, 0.1], [0.4, 0.0], [0.6]]; batch mean 2.5 / 6; search_1 mean 0.6; search_2 alone -> the
    # batch mean; terminal mean (0.1 + 0.0 + 0.6) / 3
    a = position_bucket_advantages(r, [3, 2, 1], buckets, scale=0.5)
    mean, terminal = 2.5 / 6, 0.7 / 3
    assert a[0].tolist() == pytest.approx([0.1, (0.6 - mean) / 2, (0.1 - terminal) / 2])
    assert a[1, :2].tolist() == pytest.approx([-0.1, -terminal / 2]) and math.isnan(a[1, 2])
    assert a[2, 0] == pytest.approx((0.6 - terminal) / 2) and math.isnan(a[2, 1])
    std = torch.tensor([0.8, 0.6, 0.1, 0.4, 0.0, 0.6]).std(unbiased=False)
    scaled = position_bucket_advantages(r, [3, 2, 1], buckets, normalize_std=True)
    assert scaled[0, 0] == pytest.approx(0.2 / (float(std) + 1e-6))
    # a missing reward leaves its step and the steps before it out of the buckets
    gap = position_bucket_advantages(torch.tensor([[NAN, 0.5], [0.1, 0.3]]), [2, 2], [["search_1", "terminal"]] * 2)
    assert math.isnan(gap[0, 0]) and gap[1, 0] == pytest.approx(0.4 - (0.5 + 0.4 + 0.3) / 3)
    assert position_bucket_advantages(torch.full((1, 1), NAN), [1], [["terminal"]]).isnan().all()


def test_terminal_reward_and_oracle_step_quality():
    good, bad = trajectory(GOOD), trajectory(BAD, answer="Nowhere")
    assert terminal_reward(good, Q) == 1.0 and terminal_reward(bad, Q, "em") == 0.0
    assert oracle_step_quality(Q, trajectory_steps(good)) == [1.0, 1.0, 1.0]
    assert oracle_step_quality(Q, trajectory_steps(bad)) == [0.0, 0.0, 0.0]
    # skipping the first hop: the second gold paragraph is found but is not the next one, and answering
    # before the first paragraph was seen is premature
    skip = trajectory([GOOD[1], GOOD[0], GOOD[2]])
    assert oracle_step_quality(Q, trajectory_steps(skip)) == [0.0, 1.0, 1.0]
    early = trajectory([GOOD[0], GOOD[2]])
    assert oracle_step_quality(Q, trajectory_steps(early)) == [1.0, 0.0]
    plain = Question(id="h", question="?", answers=["x"], source="hotpotqa")
    assert oracle_step_quality(plain, trajectory_steps(good)) is None


def test_step_diagnostics_by_hand():
    rewards = [[0.1, 0.5, 0.4], [0.2, 0.2], [None, 0.3]]
    qualities = [[0.0, 1.0, 1.0], [1.0, 0.0], None]
    d = step_diagnostics(rewards, [1.0, 0.0, 0.0], qualities)
    assert d["var_within"] == pytest.approx((torch.tensor([0.1, 0.5, 0.4]).var(unbiased=False).item() + 0.0) / 2)
    assert d["decomp_gap"] == pytest.approx((0.0 + 0.4) / 2)  # the third is not fully scored
    xs, ys = [0.1, 0.5, 0.4, 0.2, 0.2], [0.0, 1.0, 1.0, 1.0, 0.0]
    assert d["oracle_corr"] == pytest.approx(float(torch.corrcoef(torch.tensor([xs, ys]))[0, 1]))
    assert d["oracle_good_fraction"] == pytest.approx(0.6)
    flat = step_diagnostics([[0.2, 0.2]], [0.0], [[1.0, 0.0]])
    assert "oracle_corr" not in flat and flat["var_within"] == 0.0  # undefined, so absent (never 0)


def test_criteria_diversity():
    d = criteria_diversity([["a b", "a b", "c d"], ["x"]])
    assert d["criteria_distinct"] == pytest.approx(2 / 3)
    assert d["criteria_spread"] == pytest.approx(1 - (1 + 0 + 0) / 3)
    assert criteria_diversity([["only"]]) == {}


@pytest.mark.parametrize("prediction,golds,standard,variant", [
    ("Yes, both are American", ["yes"], 0.0, 1.0),
    ("I think the answer is yes", ["yes"], 0.0, 0.0),  # normalised: i think answer is yes; yes is 5th
    ("no they are not", ["yes"], 0.0, 0.0),
    ("No.", ["no"], 1.0, 1.0),
    ("Kestrow Bay", ["Kestrow Bay"], 1.0, 1.0),
    (None, ["yes"], 0.0, 0.0),
    ("yes or no", ["no"], 0.0, 0.0),               # the first yes/no word decides
])
def test_yes_no_first_three_tokens_em_beside_standard_em(prediction, golds, standard, variant):
    assert exact_match(prediction, golds) == standard
    assert exact_match_yes_no_first3(prediction, golds) == variant
