"""The outcome reward every policy-training variant shares: token F1 of the final answer when the episode is
format-valid, else a format penalty (ARBOR 3.4: R_base = F1 if format valid, else -1).

An episode is format-valid when it ended with an answer the parser read (``finish_reason == "answer"``, or
a forced answer that parsed) and none of its turns was unparseable. The reward reads
``episode.info["trajectory"]`` and the question (``episode.prompt``), so it works for any agent.

    reward = OutcomeReward(format_penalty=-1.0)
    scores = reward(episodes, ctx).scores        # one float per episode
    reward = outcome_reward(params.grpo)         # a run's: grpo.format_penalty (unset: -1)
"""

from __future__ import annotations

from dataclasses import dataclass

from components.evaluation.metrics import exact_match, f1_score
from components.schemas import Question, Trajectory
from components.training.grpo.episodes import Episode, RewardOutput, StepContext
from components.training.params import GRPOParams

__all__ = ["DEFAULT_FORMAT_PENALTY", "OutcomeReward", "format_valid", "outcome_reward"]

DEFAULT_FORMAT_PENALTY = -1.0


def format_valid(trajectory: Trajectory) -> bool:
    """Answered, and every turn parsed."""
    return trajectory.final_answer is not None and all(s.parse_error is None for s in trajectory.steps)


@dataclass
class OutcomeReward:
    format_penalty: float = DEFAULT_FORMAT_PENALTY
    metric: str = "f1"  # or "em"

    def score(self, trajectory: Trajectory, question: Question) -> float:
        if not format_valid(trajectory):
            return self.format_penalty
        fn = f1_score if self.metric == "f1" else exact_match
        return float(fn(trajectory.final_answer, question.answers))

    def __call__(self, episodes: list[Episode], ctx: StepContext | None = None) -> RewardOutput:
        scores, valid, em = [], 0, 0.0
        for e in episodes:
            t: Trajectory = e.info["trajectory"]
            scores.append(self.score(t, e.prompt))
            valid += format_valid(t)
            em += exact_match(t.final_answer, e.prompt.answers) if t.final_answer else 0.0
        n = max(len(episodes), 1)
        return RewardOutput(scores, metrics={"format_valid": valid / n, "em": em / n, "outcome": sum(scores) / n})


def outcome_reward(grpo: GRPOParams) -> OutcomeReward:
    """The outcome reward of a run whose grpo block is ``grpo``: its ``format_penalty`` when set, else -1."""
    penalty = grpo.format_penalty
    return OutcomeReward(format_penalty=DEFAULT_FORMAT_PENALTY if penalty is None else penalty)
