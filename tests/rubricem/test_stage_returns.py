"""SS-GRPO: Lambda returns and per-stage group normalisation, checked against values computed by hand, with
missing stage scores masked (never 0)."""

import math

import pytest
import torch

from components.methods.rubricem.stage_returns import StageReturns, check_lambda, stage_returns
from components.training.grpo.advantages import place_episode_advantages
from components.training.grpo.episodes import Episode, StepContext

PAPER = [[1.0, 0.4, 0.6, 0.8], [0.0, 1.0, 0.4, 0.8], [0.0, 0.0, 1.0, 0.8], [0.0, 0.0, 0.0, 1.0]]
R = torch.tensor([[1.0, 0.5, 0.0, 1.0],
                  [0.5, 0.5, 0.5, 0.0],
                  [0.0, 1.0, 1.0, 0.5]])


def test_lambda_returns_by_hand():
    g = stage_returns(R, check_lambda(PAPER))
    # G_k = sum_{j>=k} lambda_kj R_j
    expected = [[1 + .4 * .5 + .6 * 0 + .8 * 1, .5 + .4 * 0 + .8 * 1, 0 + .8 * 1, 1.0],   # 2.0, 1.3, 0.8, 1.0
                [.5 + .4 * .5 + .6 * .5 + 0, .5 + .4 * .5 + 0, .5 + 0, 0.0],            # 1.0, 0.7, 0.5, 0.0
                [0 + .4 * 1 + .6 * 1 + .8 * .5, 1 + .4 * 1 + .8 * .5, 1 + .8 * .5, .5]]   # 1.4, 1.8, 1.4, 0.5
    assert torch.allclose(g, torch.tensor(expected))
    # the identity is plain per-stage scores; an all-ones upper triangle is the undiscounted return-to-go
    assert torch.equal(stage_returns(R, torch.eye(4)), R)
    assert stage_returns(R, torch.ones(4, 4).triu())[:, 0].tolist() == pytest.approx([2.5, 1.5, 2.5])


def episodes(groups):
    return [Episode(prompt=None, group=g, rows=[]) for g in groups]


def test_per_stage_normalisation_by_hand():
    adv = StageReturns(PAPER, eps=0.0)(episodes([0, 0, 0]), R, StepContext(step=1, groups=[0, 0, 0]))
    g0 = [2.0, 1.0, 1.4]  # stage-0 returns of the group
    mean = sum(g0) / 3
    std = math.sqrt(sum((x - mean) ** 2 for x in g0) / 3)  # population std, as the paper's Std
    assert adv[:, 0].tolist() == pytest.approx([(x - mean) / std for x in g0])
    assert adv[:, 0].tolist() == pytest.approx([1.2978, -1.1356, -0.1622], abs=1e-4)
    assert adv[:, 3].tolist() == pytest.approx([1.2247, -1.2247, 0.0], abs=1e-4)  # answer returns 1, 0, .5
    for k in range(4):  # each stage column is normalised on its own
        assert float(adv[:, k].mean()) == pytest.approx(0.0, abs=1e-6)
    # the stage ranking can differ from the final-score ranking: episode 2 has the best research return
    assert int(adv[:, 1].argmax()) == 2 and int(adv[:, 3].argmax()) == 0


def test_groups_are_normalised_separately():
    scores = torch.cat([R, R[:2] * 0.5])
    adv = StageReturns(PAPER)(episodes([0, 0, 0, 1, 1]), scores)
    assert adv[3:, 0].tolist() == pytest.approx([1.0, -1.0], abs=1e-4)  # two members: +-1 whatever the scale
    assert adv[:3, 0].tolist() == pytest.approx([1.2978, -1.1356, -0.1622], abs=1e-4)


def test_a_missing_stage_score_is_masked_not_zero():
    scores = R.clone()
    scores[1, 2] = float("nan")  # the review of episode 1 was not scored
    g = stage_returns(scores, check_lambda(PAPER))
    assert torch.isnan(g[1, :3]).all() and g[1, 3] == 0.0  # every return weighing R_{1,2}; the answer's does not
    adv = StageReturns(PAPER, eps=0.0)(episodes([0, 0, 0]), scores)
    assert adv[[0, 2], 0].tolist() == pytest.approx([1.0, -1.0])  # stage 0 compares episodes 0 and 2 only
    assert torch.isnan(adv[1, :3]).all()
    assert adv[:, 3].tolist() == pytest.approx([1.2247, -1.2247, 0.0], abs=1e-4)
    # zero-filling instead would have ranked episode 1 differently
    zero = R.clone()
    zero[1, 2] = 0.0
    assert not torch.allclose(StageReturns(PAPER)(episodes([0, 0, 0]), zero)[[0, 2], 0], adv[[0, 2], 0])
    # on tokens: stage k's tokens get A_{i,k}; the masked stages leave the loss
    segment_ids = torch.tensor([[0, 1, 2, 3], [0, 1, 2, 3]])
    token_adv, mask = place_episode_advantages(adv[:2], [0, 1], segment_ids, torch.ones(2, 4, dtype=torch.bool))
    assert token_adv[0].tolist() == pytest.approx(adv[0].tolist())
    assert mask[1].tolist() == [False, False, False, True] and token_adv[1, 3] == pytest.approx(float(adv[1, 3]))


@pytest.mark.parametrize("matrix, message", [
    ([[1, 0], [0.5, 1]], r"stage_lambda\[1\]\[0\] must be 0"),
    ([[1, 0], [0, 0.9]], r"stage_lambda\[1\]\[1\] must be 1"),
    ([[1, 0, 0], [0, 1, 0]], "square"),
])
def test_lambda_must_be_causal(matrix, message):
    with pytest.raises(ValueError, match=message):
        check_lambda(matrix)


def test_scores_must_match_lambda():
    with pytest.raises(ValueError, match="do not fit a 4-stage Lambda"):
        StageReturns(PAPER)(episodes([0]), torch.ones(1, 3))
