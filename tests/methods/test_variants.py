"""The built-in training variants: the outcome reward (F1 or the format penalty) and DAPO's dropping of
outcome-homogeneous groups, on hand-made episodes."""

import pytest

from components.variants import VARIANTS, drop_homogeneous_groups, get_variant
from components.rewards.outcome import OutcomeReward, format_valid
from components.schemas import Question, Step, Trajectory
from components.training.episodes import Episode, StepContext

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
