"""ARCO's step criteria: the step view of a trajectory, the prompt mu's generation head answers, the teacher's
warm-up annotation (prompt, structured output, strict parse, a result or a failure) and the warm-up rows.

A *step* is one policy turn of a ReAct episode (its thought, action and observation), plus the forced final
answer when the agent had to be asked for one: the tokens of step ``t`` carry segment id ``t`` in the
training rows (:meth:`components.agents.react.ReActAgent.call_policy`), so a score per step lands on them.

- :func:`trajectory_steps` turns a :class:`Trajectory` into :class:`ArcoStep` views;
- :func:`step_messages` is mu's prompt for one step: the question, the steps before it, the step itself
  (thought and action), asking for K numbered criteria; :func:`parse_criteria` reads mu's reply;
- :func:`annotate` asks the teacher for K criteria per step of a whole trajectory in one judgment call
  (:mod:`components.judges.call`, JSON); a failed call or a reply that does not give exactly K criteria for
  every step is a failure (``None`` and the reason), never an invented rubric;
- :func:`warmup_rows` pairs each annotated step's prompt with the teacher's criteria, and
  :func:`sft_segments` renders one as the project's SFT row format ``[(text, trainable), ...]``.

    steps = trajectory_steps(trajectory)
    criteria = asyncio.run(annotate(teacher, question, steps, k=3))      # list per step, or None
    rows = warmup_rows(question, steps, criteria, k=3)
    segments = sft_segments(rows[0], render)                           # for build_sft_example
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from components.clipping import clip
from components.judges.call import JudgeCall, Unparsed, ask
from components.judges.render import untrusted
from components.llm.base import ChatModel, Message, Sampling, system, user
from components.llm.json_reply import NoJSONObject, outer_json
from components.schemas import Question, Trajectory
from components.training.sft.trajectories import Renderer, reply_closing

__all__ = [
    "Annotation",
    "ArcoStep",
    "CriteriaParseError",
    "WarmupRow",
    "annotate",
    "format_criteria",
    "parse_criteria",
    "parse_teacher_reply",
    "sft_segments",
    "step_messages",
    "teacher_messages",
    "teacher_schema",
    "trajectory_steps",
    "warmup_rows",
]


@dataclass(frozen=True)
class ArcoStep:
    """One step as ARCO sees it. ``query`` is the tool argument of a search/browse, ``doc_ids`` what the tool
    returned; ``finish`` marks the answering step (``forced`` when the agent was made to answer)."""

    index: int
    thought: str
    action: str
    observation: str = ""
    query: str | None = None
    doc_ids: tuple[str, ...] = ()
    finish: bool = False
    forced: bool = False


def trajectory_steps(trajectory: Trajectory) -> list[ArcoStep]:
    """The trajectory's turns, then the forced answer as a step of its own when the agent was asked for one."""
    out = []
    for s in trajectory.steps:
        call = s.tool_call
        query = None if call is None else str(next(iter(call.arguments.values()), "")) or None
        out.append(ArcoStep(index=s.index, thought=s.thought, action=s.action or "(unreadable)",
                            observation=s.observation, query=query, doc_ids=tuple(call.doc_ids) if call else (),
                            finish=s.final_answer is not None))
    if trajectory.metadata.get("forced_answer"):
        answer = trajectory.final_answer
        out.append(ArcoStep(index=len(trajectory.steps), thought="",
                            action=f"finish[{answer}]" if answer is not None else "(no readable answer)",
                            finish=True, forced=True))
    return out


def _clip(text: str, chars: int) -> str:
    return untrusted(clip(" ".join(text.split()), chars, " ...", marker_within=True))


def _history(steps: list[ArcoStep], chars: int) -> str:
    if not steps:
        return "(none yet)"
    lines = []
    for s in steps:
        lines.append(f"{s.index + 1}. Action: {untrusted(s.action)}")
        if not s.finish:
            lines.append(f"   Observation: {_clip(s.observation, chars)}")
    return "\n".join(lines)


MU_SYSTEM = (
    "You grade the steps of a search agent that answers multi-hop questions by looking facts up one entity at a "
    "time. For the step you are shown, write the criteria a good step at that point meets: whether it looks up "
    "the entity the question or the latest result points to, whether it uses the names already found instead "
    "of repeating a search, whether it answers as soon as the facts are in hand. Criteria are short, checkable "
    "sentences about this one step."
)


def step_messages(question: str, steps: list[ArcoStep], t: int, k: int, observation_chars: int = 300) -> list[Message]:
    """mu's prompt for step ``t``: the question, the steps before it with their observations, the step itself."""
    step = steps[t]
    body = (f"Question: {question}\n\nSteps so far:\n{_history(steps[:t], observation_chars)}\n\n"
            f"Step to grade (step {t + 1}):\nThought: {untrusted(step.thought) or '(none)'}\n"
            f"Action: {untrusted(step.action)}\n\n"
            f"Write exactly {k} criteria for this step, one per line, numbered 1 to {k}.")
    return [system(MU_SYSTEM), user(body)]


def format_criteria(criteria: list[str]) -> str:
    """``1. a\\n2. b\\n3. c``: the reply format of mu and of the warm-up targets."""
    return "\n".join(f"{i + 1}. {c}" for i, c in enumerate(criteria))


_NUMBERED = re.compile(r"^[ \t]*(\d+)[ \t]*[.)][ \t]*(\S[^\n]*?)[ \t]*$", re.MULTILINE)


def parse_criteria(text: str, k: int) -> list[tuple[str, int]]:
    """The numbered criteria of a reply, in order 1, 2, ... (at most ``k``), each with the character offset
    just past its text. Numbering that skips or restarts ends the list; other lines are ignored."""
    out: list[tuple[str, int]] = []
    for m in _NUMBERED.finditer(text):
        if int(m.group(1)) != len(out) + 1:
            break
        out.append((m.group(2), m.end(2)))
        if len(out) == k:
            break
    return out


# ------------------------------------------------------------------------------------------ teacher


TEACHER_SYSTEM = (
    "You write grading criteria for the steps of a search agent's attempt at a multi-hop question. For each "
    "step you write criteria that separate a good step at that point from a poor one: the entity it should "
    "look up given the question and what earlier results revealed, whether it reuses names already found, "
    "whether it should already answer and with what. Each criterion must be checkable from the question, the "
    "earlier steps and that step alone, never from later steps, and must be specific to that step rather "
    "than generic advice. Reply with JSON only."
)


def teacher_schema(k: int) -> dict[str, Any]:
    item = {"type": "object", "properties": {"step": {"type": "integer"}, "criteria": {
        "type": "array", "items": {"type": "string"}, "minItems": k, "maxItems": k}}, "required": ["step", "criteria"]}
    return {"type": "object", "properties": {"steps": {"type": "array", "items": item}}, "required": ["steps"]}


def teacher_messages(question: Question, steps: list[ArcoStep], k: int, observation_chars: int = 300) -> list[Message]:
    lines = []
    for s in steps:
        label = " (the agent was told to answer now)" if s.forced else ""
        lines.append(f"Step {s.index + 1}{label}:\nThought: {untrusted(s.thought) or '(none)'}\n"
                     f"Action: {untrusted(s.action)}")
        if not s.finish:
            lines.append(f"Observation: {_clip(s.observation, observation_chars)}")
    example = ", ".join(f'"criterion {j + 1}"' for j in range(k))
    body = (f"Question: {question.question}\nReference answer: {' | '.join(question.answers)}\n\n"
            f"The attempt:\n" + "\n".join(lines) + "\n\n"
            f"Write exactly {k} criteria for each of the {len(steps)} steps. Reply as "
            f'{{"steps": [{{"step": 1, "criteria": [{example}]}}, ...]}} with one entry per step, in order.')
    return [system(TEACHER_SYSTEM), user(body)]


class CriteriaParseError(Unparsed):
    """A teacher reply that does not give exactly K usable criteria for every step."""


def parse_teacher_reply(text: str, n_steps: int, k: int) -> list[list[str]]:
    """Criteria per step from the teacher's JSON (the outermost ``{...}`` of the reply); raises
    :class:`CriteriaParseError` naming what is wrong."""
    try:
        data = outer_json(text)
    except NoJSONObject as exc:
        raise CriteriaParseError(str(exc)) from None
    except json.JSONDecodeError as exc:
        raise CriteriaParseError(f"invalid JSON: {exc.msg}") from None
    entries = data.get("steps") if isinstance(data, dict) else None
    if not isinstance(entries, list) or len(entries) != n_steps:
        got = len(entries) if isinstance(entries, list) else "no"
        raise CriteriaParseError(f"expected {n_steps} step entries, got {got}")
    out = []
    for t, entry in enumerate(entries):
        if not isinstance(entry, dict) or entry.get("step") != t + 1:
            raise CriteriaParseError(f"entry {t}: expected step {t + 1}")
        criteria = entry.get("criteria")
        if not isinstance(criteria, list) or len(criteria) != k:
            raise CriteriaParseError(f"step {t + 1}: expected {k} criteria")
        cleaned = [" ".join(c.split()) for c in criteria if isinstance(c, str)]
        if len(cleaned) != k or not all(cleaned):
            raise CriteriaParseError(f"step {t + 1}: criteria must be {k} non-empty strings")
        out.append(cleaned)
    return out


async def annotate(teacher: ChatModel, question: Question, steps: list[ArcoStep], k: int, *,
                   max_tokens: int = 1024, observation_chars: int = 300) -> tuple[list[list[str]] | None, str | None]:
    """``(criteria per step, None)``, or ``(None, why)`` when the call fails or the reply does not parse."""
    if not steps:
        return None, "no steps"
    call = JudgeCall(teacher_messages(question, steps, k, observation_chars),
                     lambda text: parse_teacher_reply(text, len(steps), k),
                     Sampling(temperature=0.0, max_tokens=max_tokens), schema=teacher_schema(k))
    result = await ask(teacher, call)
    if not result.ok:
        return None, f"{'call failed' if result.kind == 'call_failed' else 'unparsed'}: {result.reason}"
    return result.value, None


@dataclass
class Annotation:
    """A trajectory the teacher annotated: the question, the trajectory and K criteria per step."""

    question: Question
    trajectory: Trajectory
    criteria: list[list[str]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"question": self.question.model_dump(mode="json"),
                "trajectory": self.trajectory.model_dump(mode="json"), "criteria": self.criteria}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Annotation:
        return cls(Question.model_validate(data["question"]), Trajectory.model_validate(data["trajectory"]),
                   [list(c) for c in data["criteria"]])


@dataclass
class WarmupRow:
    """One step's warm-up example: mu's prompt for the step and the teacher's criteria as its target."""

    messages: list[Message]
    criteria: list[str]


def warmup_rows(question: Question, steps: list[ArcoStep], criteria: list[list[str]], k: int,
                observation_chars: int = 300) -> list[WarmupRow]:
    """One row per step of an annotated trajectory, in step order."""
    if len(criteria) != len(steps):
        raise ValueError(f"{len(criteria)} criteria lists for {len(steps)} steps")
    return [WarmupRow(step_messages(question.question, steps, t, k, observation_chars), list(c))
            for t, c in enumerate(criteria)]


def sft_segments(row: WarmupRow, render: Renderer) -> list[tuple[str, bool]]:
    """``[(prompt, False), ("1. ...", True), ("\\n", True), ..., (closing, True)]``: each criterion is a segment
    of its own, so its last token (where the score head reads) is a token boundary."""
    segments: list[tuple[str, bool]] = [(render(row.messages, True), False)]
    for i, c in enumerate(row.criteria):
        if i:
            segments.append(("\n", True))
        segments.append((f"{i + 1}. {c}", True))
    segments.append((reply_closing(render), True))
    return segments
