"""The text an LLM judge, inducer or rater is shown for one agent trajectory: each turn's thought, action and
(truncated) observation, unparseable turns marked, then the final answer or how the episode ended.

    text = trajectory_text(episode.info["trajectory"], observation_chars=300)
"""

from __future__ import annotations

from components.clipping import clip
from components.schemas import Trajectory

__all__ = ["trajectory_text"]


def _cut(text: str, limit: int) -> str:
    return clip(" ".join(text.split()), limit)


def trajectory_text(trajectory: Trajectory, observation_chars: int = 300) -> str:
    lines = []
    for step in trajectory.steps:
        lines.append(f"Turn {step.index + 1}")
        if step.parse_error is not None:
            lines.append(f"Unreadable output: {_cut(step.raw, observation_chars)}")
            continue
        if step.thought:
            lines.append(f"Thought: {_cut(step.thought, observation_chars)}")
        if step.action:
            lines.append(f"Action: {step.action}")
        observation = step.tool_call.observation if step.tool_call is not None else step.observation
        if observation:
            lines.append(f"Observation: {_cut(observation, observation_chars)}")
    if trajectory.final_answer is not None:
        lines.append(f"Final answer: {trajectory.final_answer}")
    else:
        lines.append(f"No final answer (episode ended: {trajectory.finish_reason})")
    return "\n".join(lines)
