"""The built-in training variants: the outcome reward (F1 or the format penalty), DAPO's dropping of
outcome-homogeneous groups and its overlong reward shaping (hand-computed penalties), on hand-made episodes."""

import pytest

from components.rewards.outcome import OutcomeReward, format_valid
from components.rewards.overlong import OverlongShaping, overlong_penalty
from components.schemas import Question, Step, Trajectory
from components.training.engines.rollout import RolloutSegment
from components.training.grpo.episodes import Episode, StepContext
from components.variants import VARIANTS, drop_homogeneous_groups, get_variant

Q = Question(id="q", question="Where?", answers=["Kestrow Bay"], source="world")


def episode(group, answer, parse_error=None):
    steps = [Step(index=0, raw="x", action="search[a]", parse_error=parse_error)]
    t = Trajectory(question_id="q", question="Where?", steps=steps, final_answer=answer,
                   finish_reason="answer" if answer else "max_turns")
    return Episode(prompt=Q, group=group, rows=[], info={"trajectory": t})


def test_outcome_reward_is_f1_when_format_valid_else_the_penalty():
    eps = [episode(0, "Kestrow Bay"), episode(0, "Kestrow"), episode(0, None), episode(0, "Kestrow", "bad")]
    out = OutcomeReward()(eps, StepContext(step=1, groups=[0] * 4))
    assert out.scores == pytest.approx([1.0, 2 / 3, -1.0, -1.0])
    assert out.metrics["format_valid"] == 0.5 and out.metrics["em"] == 0.25
    assert not format_valid(eps[3].info["trajectory"])


def test_dapo_drops_homogeneous_groups_and_counts_them():
    eps = [episode(0, None), episode(0, None), episode(1, "Kestrow Bay"), episode(1, "Elsewhere")]
    out = drop_homogeneous_groups(OutcomeReward())(eps, StepContext(step=1, groups=[0, 0, 1, 1]))
    assert out.scores[:2] == [None, None] and out.scores[2:] == [1.0, 0.0]
    assert out.metrics["homogeneous_groups"] == 1 and out.metrics["homogeneous_fraction"] == 0.5


def test_variants_are_registered():
    assert {"grpo", "dapo"} <= set(VARIANTS.names())
    assert get_variant("grpo") is VARIANTS.get("grpo")


def long_episode(group, answer, generated, observed=5):
    """An episode whose policy generated ``generated`` tokens over two turns, around ``observed`` tool tokens."""
    e = episode(group, answer)
    first = generated // 2
    e.rows = [[RolloutSegment(list(range(3)), False), RolloutSegment(list(range(first)), True),
               RolloutSegment(list(range(observed)), False), RolloutSegment(list(range(generated - first)), True)]]
    return e


@pytest.mark.parametrize(("length", "factor", "penalty"), [
    (0, 1.0, 0.0), (6, 1.0, 0.0),        # up to L_max - L_cache = 6: none
    (7, 1.0, -0.25), (8, 1.0, -0.5),     # (6 - |y|) / 4 inside the buffer
    (10, 1.0, -1.0), (13, 1.0, -1.0),    # -1 at L_max and beyond it (Eq. 13)
    (9, 0.5, -0.375),                    # scaled by the penalty factor
])
def test_the_overlong_penalty_by_hand(length, factor, penalty):
    assert overlong_penalty(length, max_tokens=10, buffer_tokens=4, penalty_factor=factor) == pytest.approx(penalty)


def test_overlong_shaping_counts_the_policys_tokens_of_every_turn_and_leaves_unscored_episodes_alone():
    eps = [long_episode(0, "Kestrow Bay", 6), long_episode(0, "Kestrow Bay", 8, observed=50),
           long_episode(1, None, 12), long_episode(1, None, 12)]
    assert [len(e.response_ids) for e in eps] == [6, 8, 12, 12]  # tool and prompt tokens are not counted
    shaped = OverlongShaping(drop_homogeneous_groups(OutcomeReward()), max_tokens=10, buffer_tokens=4)
    out = shaped(eps, StepContext(step=1, groups=[0, 0, 1, 1]))
    # the filter reads the outcome before the length penalty (verl's metric "acc"): group 0's two 1.0s are dropped
    assert out.scores == [None, None, None, None]
    eps[1] = long_episode(0, "Kestrow", 8)  # F1 2/3
    out = shaped(eps, StepContext(step=1, groups=[0, 0, 1, 1]))
    assert out.scores[:2] == pytest.approx([1.0, 2 / 3 - 0.5]) and out.scores[2:] == [None, None]
    assert out.metrics["overlong/fraction"] == 0.5 and out.metrics["overlong/penalty_mean"] == pytest.approx(-0.25)
    assert out.metrics["homogeneous_groups"] == 1  # the filter's own metrics pass through


def test_overlong_shaping_refuses_a_buffer_past_the_budget_and_a_per_stage_score():
    with pytest.raises(ValueError, match="buffer_tokens"):
        OverlongShaping(OutcomeReward(), max_tokens=4, buffer_tokens=8)
    shaped = OverlongShaping(lambda eps, ctx: [[0.5, 1.0]], max_tokens=10, buffer_tokens=4)
    with pytest.raises(TypeError, match="scalar score"):
        shaped([long_episode(0, "x", 2)], StepContext(step=1, groups=[0]))


def test_dapos_budget_is_the_agents_turns_unless_set(repo_root, tmp_path):
    from components.params_load import load_params
    from components.variants import VariantContext, variant_params

    for profile, budget in (("embedded", 256 * 6), ("paper", 1024 * 12)):
        params = variant_params(load_params(repo_root / "params.yaml", profile), "dapo")
        shaped = get_variant("dapo")(VariantContext(params, lambda role: None, None, tmp_path)).reward_fn
        assert (shaped.max_tokens, shaped.buffer_tokens) == (budget, params.dapo.overlong_buffer_tokens)
    off = load_params(repo_root / "params.yaml", overrides=["dapo.overlong_buffer_tokens=null"])
    assert not isinstance(get_variant("dapo")(VariantContext(off, lambda role: None, None, tmp_path)).reward_fn,
                          OverlongShaping)
