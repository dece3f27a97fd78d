"""SFT rows from agent trajectories, rendered exactly as the agent prompts the policy at evaluation.

A trajectory is replayed step by step through the agent's own :meth:`messages` (so system prompt, history
format, observation truncation and wording are those of evaluation) and the tokenizer's chat template:

- ``chat`` history: one row per episode, ``[prompt | reply 1 | observation 1 | reply 2 | ...]``, where each
  turn's rendered prompt extends the previous one (checked: a template that does not extend raises);
- ``scratchpad`` history: every turn is a fresh prompt, so one row per turn, ``[prompt with history | reply]``.

Replies (``step.raw`` as the agent shows it back, plus the template's end-of-turn tokens, so the policy
learns to stop) are trainable; prompts and observations are not.

    rows = trajectory_rows(agent, trajectory, question, render)     # list of [(text, trainable), ...]
    examples = [build_sft_example(r, tokenizer, max_length=2048) for r in rows]
    examples = warm_start_examples(params.methods["sft"], params.agent, params.sft.max_length, trajectories, tokenizer)

A trajectory written by the ``sft_data`` stage carries the question it answers in its metadata:
``trajectory_question(trajectory)`` gives it back for ``agent.start``.

A single-turn row (e.g. a reflection the meta-policy learns to write) is ``reply_row(messages, reply, render)``:
the rendered prompt, not trainable, then the reply with its end-of-turn tokens, trainable.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from components.llm.base import Message, assistant, user
from components.schemas import Question, Trajectory

if TYPE_CHECKING:
    from components.agents.params import AgentParams, MethodParams
    from components.training.sft.examples import SFTExample

__all__ = ["reply_closing", "reply_row", "trajectory_question", "trajectory_rows", "warm_start_examples"]

Renderer = Callable[[list[Message], bool], str]
_MARK = "\x00REPLY\x00"


def reply_closing(render: Renderer) -> str:
    """What the template writes after an assistant reply's text (``<|im_end|>\\n`` for ChatML)."""
    text = render([user("u"), assistant(_MARK)], False)
    return text[text.index(_MARK) + len(_MARK):]


def reply_row(messages: list[Message], reply: str, render: Renderer) -> list[tuple[str, bool]]:
    return [(render(messages, True), False), (reply.strip() + reply_closing(render), True)]


def trajectory_question(trajectory: Trajectory) -> Question:
    """The question a trajectory answers, as far as the agent's prompts need it (id, text, answers)."""
    stored = trajectory.metadata.get("question")
    if stored is not None:
        return Question.model_validate(stored)
    answers = trajectory.metadata.get("answers") or [trajectory.final_answer or ""]
    return Question(id=trajectory.question_id, question=trajectory.question, answers=answers, source="sft_data")


def trajectory_rows(agent, trajectory: Trajectory, question: Question,
                    render: Renderer) -> list[list[tuple[str, bool]]]:
    """Training rows of one trajectory under ``agent``'s prompts (see the module docstring)."""
    closing = reply_closing(render)
    state = agent.start(question)
    rows: list[list[tuple[str, bool]]] = []
    rendered = ""
    chat = agent.settings.history_format == "chat"
    for step in trajectory.steps:
        prompt = render(agent.messages(state), True)
        reply = step.raw.strip() + closing
        if chat and rows:
            if not prompt.startswith(rendered):
                raise ValueError(f"{trajectory.question_id}: turn {step.index}'s prompt does not extend the "
                                 "previous turn under this chat template")
            rows[-1] += [(prompt[len(rendered):], False), (reply, True)]
        else:
            rows.append([(prompt, False), (reply, True)])
        rendered = prompt + step.raw.strip() + closing
        state.steps.append(step)
    return rows


def warm_start_examples(spec: MethodParams, agent: AgentParams, max_length: int, trajectories: Sequence[Trajectory],
                        tokenizer: Any) -> list[SFTExample]:
    """The tokenized rows of ``trajectories`` under a warm start method's agent and options (``spec``: the prompts
    ``evaluate --method`` uses, e.g. a compact system prompt), cut at ``max_length`` (``sft.max_length``): what the
    sft stage trains on."""
    from components.agents.react import agent_class
    from components.training.grpo.agent_rollout import chat_template_renderer
    from components.training.sft.examples import build_sft_example

    replay = agent_class(spec.agent)(None, None, agent, **spec.options)
    render = chat_template_renderer(tokenizer)
    return [build_sft_example(row, tokenizer, max_length=max_length)
            for t in trajectories for row in trajectory_rows(replay, t, trajectory_question(t), render)]
