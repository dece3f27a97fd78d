"""Group-relative advantages and their placement on tokens, against hand-computed values."""

import math

import pytest
import torch

from components.training.grpo.advantages import (
    broadcast_sequence_advantages,
    group_advantages,
    segment_advantages,
)


def test_equal_rewards_give_zero_advantage():
    adv = group_advantages(torch.tensor([0.7, 0.7, 0.7, 0.7]), [0, 0, 0, 0])
    assert torch.equal(adv, torch.zeros(4))
    adv = group_advantages(torch.tensor([0.7, 0.7, 0.7, 0.7]), [0, 0, 0, 0], normalize_std=False)
    assert torch.equal(adv, torch.zeros(4))


def test_std_normalisation_on_and_off():
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0])
    # mean 0.5, population std 0.5
    on = group_advantages(rewards, [0] * 4, eps=0.0)
    assert on.tolist() == pytest.approx([1.0, -1.0, -1.0, 1.0])
    off = group_advantages(rewards, [0] * 4, normalize_std=False)
    assert off.tolist() == pytest.approx([0.5, -0.5, -0.5, 0.5])
    # Bessel-corrected std: sqrt(1/3)
    unbiased = group_advantages(rewards, [0] * 4, eps=0.0, unbiased_std=True)
    a = 0.5 / math.sqrt(1 / 3)
    assert unbiased.tolist() == pytest.approx([a, -a, -a, a])
    # eps is added to the std
    assert group_advantages(rewards, [0] * 4, eps=0.5)[0].item() == pytest.approx(0.5 / 1.0)


def test_groups_are_independent_and_need_not_be_contiguous():
    rewards = torch.tensor([3.0, 10.0, 1.0, 20.0, 5.0])
    groups = [0, 1, 0, 1, 2]
    adv = group_advantages(rewards, groups, normalize_std=False)
    # group 0: mean 2 -> [1, -1]; group 1: mean 15 -> [-5, 5]; group 2 has one sample -> 0
    assert adv.tolist() == pytest.approx([1.0, -5.0, -1.0, 5.0, 0.0])


def test_stagewise_matrix_normalised_per_column():
    # 2 rollouts x 2 stages; column 0: [1, 3] -> mean 2, std 1; column 1: [0.5, 0.5] -> 0
    returns = torch.tensor([[1.0, 0.5], [3.0, 0.5]])
    adv = group_advantages(returns, [0, 0], eps=0.0)
    assert adv.flatten().tolist() == pytest.approx([-1.0, 0.0, 1.0, 0.0])


def test_broadcast_puts_scalar_on_trainable_tokens_only():
    mask = torch.tensor([[0, 1, 1, 0], [0, 0, 1, 1]]).bool()
    out = broadcast_sequence_advantages(torch.tensor([2.0, -1.0]), mask)
    assert out.tolist() == [[0.0, 2.0, 2.0, 0.0], [0.0, 0.0, -1.0, -1.0]]


def test_segment_advantages_per_stage_and_masked_observations():
    values = torch.tensor([[10.0, 20.0, 30.0]])
    segment_ids = torch.tensor([[-1, 0, 0, 1, 1, 2, -1]])
    mask = torch.tensor([[0, 1, 1, 1, 0, 1, 0]]).bool()  # position 4 is an observation inside stage 1
    out = segment_advantages(values, segment_ids, mask)
    assert out.tolist() == [[0.0, 10.0, 10.0, 20.0, 0.0, 30.0, 0.0]]
    with pytest.raises(ValueError, match="out of range"):
        segment_advantages(values, torch.tensor([[3, 0, 0, 0, 0, 0, 0]]), mask)


def test_missing_values_leave_the_group_statistics_and_stay_missing():
    nan = float("nan")
    # column 0 complete; column 1 misses episode 1: its stats come from [0, 1, 1] (mean 2/3)
    rewards = torch.tensor([[1.0, 0.0], [0.0, nan], [1.0, 1.0], [0.0, 1.0]])
    adv = group_advantages(rewards, [0, 0, 0, 0], normalize_std=False)
    assert adv[:, 0].tolist() == pytest.approx([0.5, -0.5, 0.5, -0.5])
    assert math.isnan(adv[1, 1])
    assert [adv[i, 1].item() for i in (0, 2, 3)] == pytest.approx([-2 / 3, 1 / 3, 1 / 3])
    # a column with a single value left has nothing to compare against: 0, not NaN, for the scored one
    lone = group_advantages(torch.tensor([[1.0], [nan]]), [0, 0])
    assert lone[0, 0] == 0 and math.isnan(lone[1, 0])


def test_place_episode_advantages_masks_missing_and_refuses_untagged_tokens():
    from components.training.grpo.advantages import place_episode_advantages

    nan = float("nan")
    values = torch.tensor([[1.0, nan], [-1.0, 2.0]])
    segment_ids = torch.tensor([[-1, 0, 0, 1, 1], [-1, 0, 1, 1, -1]])
    mask = torch.tensor([[0, 1, 1, 1, 1], [0, 1, 1, 1, 0]], dtype=torch.bool)
    adv, keep = place_episode_advantages(values, [0, 1], segment_ids, mask)
    assert adv.tolist() == [[0, 1, 1, 0, 0], [0, -1, 2, 2, 0]]
    assert keep.tolist() == [[False, True, True, False, False], [False, True, True, True, False]]
    # two rows of one episode (scratchpad) share its scalar
    adv, keep = place_episode_advantages(torch.tensor([[0.5]]), [0, 0], segment_ids, mask)
    assert adv[keep].tolist() == [0.5] * int(mask.sum())
    with pytest.raises(ValueError, match="outside"):
        place_episode_advantages(values, [0, 1], torch.tensor([[-1, -1, 0, 1, 1], [-1, 0, 1, 1, -1]]), mask)


def test_adv_std_sample_is_bessels_std_at_every_group_size():
    # G=4: rewards 0..3, mean 1.5, population std sqrt(1.25), sample std sqrt(5/3): advantages x sqrt(3/4)
    rewards = torch.tensor([0.0, 1.0, 2.0, 3.0, 1.0, 0.0, 0.0, 0.0, 0.0, 1.0])
    groups = [0, 0, 0, 0, 1, 1, 1, 1, 1, 1]  # and G=6: one 1 among six
    population = group_advantages(rewards, groups, eps=0.0)
    sample = group_advantages(rewards, groups, eps=0.0, unbiased_std=True)
    assert sample[:4].tolist() == pytest.approx([x / math.sqrt(5 / 3) for x in (-1.5, -0.5, 0.5, 1.5)])
    assert population[:4].tolist() == pytest.approx([x / math.sqrt(1.25) for x in (-1.5, -0.5, 0.5, 1.5)])
    m, var_pop = 2 / 6, (2 / 6) * (4 / 6)  # two 1s among six
    assert population[4].item() == pytest.approx((1 - m) / math.sqrt(var_pop))
    assert sample[4].item() == pytest.approx((1 - m) / math.sqrt(var_pop * 6 / 5))


def test_the_trainer_divides_by_the_std_grpo_adv_std_names():
    from types import SimpleNamespace

    from components.training.grpo.trainer import GRPOTrainer
    from components.training.params import GRPOParams

    episodes = [SimpleNamespace(group=g) for g in (0, 0, 0, 0)]
    scores = torch.tensor([1.0, 0.0, 0.0, 1.0])

    def advantages(adv_std):
        fake = SimpleNamespace(config=GRPOParams(adv_std=adv_std, adv_eps=1e-6))
        return GRPOTrainer._default_advantages(fake, episodes, scores, None)

    assert advantages("population").tolist() == pytest.approx([1.0, -1.0, -1.0, 1.0], abs=1e-5)  # std 0.5
    a = 0.5 / math.sqrt(1 / 3)
    assert advantages("sample").tolist() == pytest.approx([a, -a, -a, a], abs=1e-5)


def test_adv_std_is_left_out_of_dumps_while_population():
    """Runs keyed before the option (all of them divided by the population std) keep their run keys."""
    from pydantic import ValidationError

    from components.training.params import GRPOParams

    assert "adv_std" not in GRPOParams().model_dump()
    assert GRPOParams(adv_std="sample").model_dump()["adv_std"] == "sample"
    assert GRPOParams.model_validate(GRPOParams(adv_std="sample").model_dump()).adv_std == "sample"
    with pytest.raises(ValidationError, match="adv_std"):
        GRPOParams(adv_std="bessel")
