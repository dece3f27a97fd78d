"""The texts a judge (or a writer of rubrics or reflections) is shown for an agent's steps: one home for the
renderers, each named for the view it gives.

- :func:`render_prefix`: Co-ReAct's committed steps as numbered action / observation lines (council, rubric
  generator, rubric evaluator, verifier, and the agents that show their own history the same way);
- :func:`trajectory_text`: ARBOR's and RaR's turn-by-turn view: thought, action, truncated observation, an
  unreadable turn marked, then the final answer or how the episode ended;
- :func:`scaffold_text`: RubricEM's episode as the policy wrote it, each observation in a ``<tool_output>``
  block (:func:`tool_output`), which the stage parser cuts into stages; :func:`clip_tool_outputs` shortens the
  tool outputs of such a text.

    prefix = render_prefix(point.prefix, 400)
    text = trajectory_text(episode.info["trajectory"], observation_chars=300)
    attempt = clip_tool_outputs(scaffold_text(trajectory), 600)
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from components.clipping import clip
from components.schemas import Step, Trajectory

__all__ = ["clip_tool_outputs", "render_prefix", "scaffold_text", "tool_output", "trajectory_text"]


def render_prefix(steps: Sequence[Step], max_observation_chars: int = 600) -> str:
    """The committed steps as numbered action / observation lines."""
    lines = []
    for s in steps:
        lines.append(f"Step {s.index + 1} action: {s.action or s.raw.strip()}")
        if s.tool_call is not None:
            lines.append(f"Step {s.index + 1} observation: {clip(s.tool_call.observation, max_observation_chars)}")
    return "\n".join(lines)


def _cut(text: str, limit: int) -> str:
    return clip(" ".join(text.split()), limit)


def trajectory_text(trajectory: Trajectory, observation_chars: int = 300) -> str:
    """Each turn's thought, action and observation (whitespace collapsed, cut to ``observation_chars``), then
    the final answer or the reason the episode ended."""
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


def tool_output(observation: str) -> str:
    """A tool's result as the scaffold shows it."""
    return f"\n<tool_output>\n{observation}\n</tool_output>\n"


def scaffold_text(trajectory: Trajectory) -> str:
    """The episode as one text: each turn as the policy wrote it, each observation in ``<tool_output>``."""
    return "".join(s.raw + (tool_output(s.observation) if s.final_answer is None and s.observation else "")
                   for s in trajectory.steps)


_TOOL_OUTPUT = re.compile(r"(<tool_output>\n?)(.*?)(\n?</tool_output>)", re.DOTALL)


def clip_tool_outputs(text: str, chars: int | None) -> str:
    """``text`` (see :func:`scaffold_text`) with each ``<tool_output>`` cut to ``chars`` characters and marked
    ``[...]``; None leaves it whole."""
    if chars is None:
        return text

    def cut(m: re.Match) -> str:
        body = m.group(2)
        return m.group(0) if len(body) <= chars else m.group(1) + clip(body, chars) + m.group(3)

    return _TOOL_OUTPUT.sub(cut, text)
