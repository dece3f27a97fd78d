"""The gaming detector: the judge's reward rising while dev EM/F1 falls is suspected, and nothing else is."""

from __future__ import annotations

import math

from components.evaluation.gaming import gaming_check


def history(rewards, before=(0.40, 0.50), after=(0.40, 0.50)):
    rows = [{"step": 0, "em": before[0], "f1": before[1]}]
    rows += [{"step": i + 1, "reward/mean": r} for i, r in enumerate(rewards)]
    rows.append({"step": len(rewards), "em": after[0], "f1": after[1]})
    return rows


def test_reward_up_and_dev_down_is_suspected_with_a_message():
    check = gaming_check(history([0.30, 0.35, 0.50, 0.60, 0.70, 0.75], after=(0.30, 0.45)))
    assert check.suspected and check.metrics["gaming.suspected"] == 1.0
    assert math.isclose(check.metrics["gaming.reward_trend"], (0.70 + 0.75) / 2 - (0.30 + 0.35) / 2)
    assert math.isclose(check.metrics["gaming.dev_em_change"], -0.10)
    assert "dev em -0.100" in check.message and "dev f1 -0.050" in check.message


def test_honest_progress_and_flat_rewards_are_not_suspected():
    assert not gaming_check(history([0.3, 0.5, 0.7], after=(0.50, 0.60))).suspected  # both rose
    assert not gaming_check(history([0.5, 0.5, 0.5, 0.5], after=(0.30, 0.40))).suspected  # reward flat
    assert not gaming_check(history([0.7, 0.5, 0.3], after=(0.30, 0.40))).suspected  # both fell
    small = gaming_check(history([0.3, 0.6], after=(0.39, 0.49)))  # a drop within the noise margin
    assert not small.suspected and small.message == ""


def test_one_noisy_step_decides_nothing():
    """The trend compares the first and last thirds of the steps, not the two ends."""
    rewards = [0.5] * 8 + [0.62]
    diluted = gaming_check(history(rewards, after=(0.30, 0.40)))  # windows of 3: +0.04
    assert not diluted.suspected and math.isclose(diluted.metrics["gaming.reward_trend"], 0.04)
    assert gaming_check(history(rewards, after=(0.30, 0.40)), window=1).suspected  # the ends alone: +0.12


def test_missing_measurements_are_nan_not_a_verdict():
    no_dev = gaming_check([{"step": 1, "reward/mean": 0.1}, {"step": 2, "reward/mean": 0.9}])
    assert not no_dev.suspected and math.isnan(no_dev.metrics["gaming.dev_em_change"])
    no_reward = gaming_check([{"em": 0.5}, {"em": 0.1}])
    assert not no_reward.suspected and math.isnan(no_reward.metrics["gaming.reward_trend"])
    skipped = gaming_check(history([0.2, float("nan"), 0.9], after=(0.2, 0.3)))  # a step without rewards
    assert skipped.suspected


def with_outcome(rewards, outcomes, after=(0.30, 0.40)):
    rows = history(rewards, after=after)
    for row, outcome in zip(rows[1:-1], outcomes):
        row["reward/outcome"] = outcome
    return rows


def test_an_outcome_only_run_is_never_suspected_of_pleasing_a_judge():
    """Its reward is the exact answer check: rising on train while dev falls is overfitting, not gaming."""
    rewards = [0.30, 0.35, 0.50, 0.60, 0.70, 0.75]
    check = gaming_check(with_outcome(rewards, rewards))
    assert not check.suspected and check.metrics["gaming.beyond_outcome_trend"] == 0.0
    assert gaming_check(history(rewards, after=(0.30, 0.40))).suspected  # without the outcome: the reward's trend


def test_a_judges_share_rising_while_dev_falls_is_suspected():
    outcomes = [0.30, 0.30, 0.31, 0.30, 0.29, 0.30]
    bonus = [0.00, 0.02, 0.10, 0.20, 0.25, 0.30]
    check = gaming_check(with_outcome([o + b for o, b in zip(outcomes, bonus)], outcomes))
    assert check.suspected and "beyond reward/outcome" in check.message
    assert math.isclose(check.metrics["gaming.beyond_outcome_trend"], (0.25 + 0.30) / 2 - (0.00 + 0.02) / 2)
    rose = gaming_check(with_outcome([o + b for o, b in zip(outcomes, bonus)], outcomes, after=(0.55, 0.60)))
    assert not rose.suspected  # the judge's share rose and so did dev accuracy: honest progress
