"""DAPO's overlong reward shaping (Yu et al. 2025, Sec. 3.4, Eq. 13, "soft overlong punishment"): an episode
whose length passes ``max_tokens - buffer_tokens`` loses ``penalty_factor`` times the fraction of the buffer it
used, so the penalty grows linearly from 0 to ``penalty_factor`` over the last ``buffer_tokens`` of the budget,
and stays there beyond it (the paper's -1 case; verl's DAPO reward manager never sees a response past its cap).

The length of a multi-turn agent episode is the tokens the policy generated in it, every turn together
(``Episode.response_ids``: its trainable tokens; prompts and tool observations are the environment's, not the
policy's), against the agent's budget for the whole episode: the analogue of a single-turn response's length
against the rollout's ``max_response_length``.

    shaped = OverlongShaping(OutcomeReward(), max_tokens=12288, buffer_tokens=4096, penalty_factor=1.0)
    shaped(episodes, ctx).scores        # each scored episode's outcome plus its (non-positive) length penalty
"""

from __future__ import annotations

from dataclasses import dataclass

from components.training.grpo.episodes import Episode, RewardFn, RewardOutput, StepContext, call_reward

__all__ = ["OverlongShaping", "overlong_penalty"]


def overlong_penalty(length: int, max_tokens: int, buffer_tokens: int, penalty_factor: float = 1.0) -> float:
    """The soft overlong punishment of an episode of ``length`` tokens: 0 up to ``max_tokens - buffer_tokens``,
    then ``-penalty_factor * (length - (max_tokens - buffer_tokens)) / buffer_tokens``, at most ``-penalty_factor``."""
    if not 0 < buffer_tokens <= max_tokens:
        raise ValueError(f"overlong shaping: buffer_tokens ({buffer_tokens}) must be in (0, max_tokens={max_tokens}]")
    exceed = length - (max_tokens - buffer_tokens)
    return -penalty_factor * min(max(exceed, 0) / buffer_tokens, 1.0)


@dataclass
class OverlongShaping:
    """A scalar reward plus each episode's :func:`overlong_penalty`; an episode without a score (a dropped group,
    a failed judge) keeps none. Adds ``overlong/penalty_mean`` (over the scored episodes) and
    ``overlong/fraction`` (the share of them that were penalised) to the reward's metrics."""

    reward_fn: RewardFn
    max_tokens: int
    buffer_tokens: int
    penalty_factor: float = 1.0

    def __post_init__(self) -> None:
        overlong_penalty(0, self.max_tokens, self.buffer_tokens)  # refuses a buffer the budget cannot hold

    def __call__(self, episodes: list[Episode], ctx: StepContext) -> RewardOutput:
        out = call_reward(self.reward_fn, episodes, ctx)
        scores, penalties = list(out.scores), []
        for i, (episode, score) in enumerate(zip(episodes, scores, strict=True)):
            if score is None:
                continue
            if not isinstance(score, (int, float)):
                raise TypeError(f"overlong shaping adds to a scalar score; episode {i} scored {score!r} (one value "
                                "per stage or step)")
            penalty = overlong_penalty(len(episode.response_ids), self.max_tokens, self.buffer_tokens,
                                       self.penalty_factor)
            scores[i] = float(score) + penalty
            penalties.append(penalty)
        n = max(len(penalties), 1)
        return RewardOutput(scores, {**out.metrics, "overlong/penalty_mean": sum(penalties) / n,
                                     "overlong/fraction": sum(p < 0 for p in penalties) / n})
