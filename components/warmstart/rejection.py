"""Rejection sampling for SFT trajectories: keep an episode only when it is one a policy should imitate.
:func:`problems` lists what is wrong with an episode as (reason, detail) in a fixed order (``REASONS``); :func:`select`
keeps the episodes without problems and turns every other one into a ``Rejection`` whose ``reason`` is its first.

    kept, rejected = select([(trajectory, question, "teacher"), ...], min_f1=1.0)
    kept, rejected = select([(trajectory, question, "oracle"), ...], min_f1=1.0, agent="scaffold")
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

from pydantic import Field

from components.agents.parsing import parse_turn
from components.evaluation.metrics import exact_match, f1_score, normalize_answer
from components.schemas import Question, Record, Trajectory
from components.warmstart.formats import FORMATS, WarmStartFormat, warm_start_format

REASONS = ("llm_failure", "no_answer", "forced_answer", "format", "stage_boundary", "tool_syntax", "citation",
           "tool_errors", "repeated_call", "wrong_answer", "ungrounded", "duplicate")
_TURN = re.compile(r"\s*Thought:(?P<thought>.*?)\n[ \t]*Action:[ \t]*(?:search|browse|finish)\[[^\n]*\S[^\n]*\]\s*",
                   re.DOTALL)


class Rejection(Record):
    """A trajectory rejection sampling dropped, and why."""

    question_id: str = Field(description="Question of the episode.")
    source: str = Field(description="Where the episode came from: oracle or teacher.")
    sample: int = Field(default=0, ge=0, description="Sample index among the question's episodes.")
    reason: str = Field(description="First problem found (one of rejection.REASONS).")
    reasons: list[str] = Field(description="Every problem found, in REASONS order.")
    detail: str = Field(default="", description="What exactly was wrong (turn, call, answer).")
    final_answer: str | None = Field(default=None, description="The episode's answer.")
    gold: list[str] = Field(default_factory=list, description="The question's gold answers.")
    trajectory: Trajectory = Field(description="The rejected episode itself, for audit.")


def turn_format_problem(raw: str, action: str) -> str | None:
    """Why a raw turn is not in the taught format (None when it is)."""
    m = _TURN.fullmatch(raw)
    if m is None or not m.group("thought").strip() or raw.lower().count("action:") != 1:
        return "not 'Thought: ...' followed by one 'Action: search|browse|finish[...]' line"
    parsed = parse_turn(raw)
    if parsed.text != action:
        return f"parsed as {parsed.text!r} but recorded as {action!r}"
    return None


def _call_key(name: str, argument: object) -> tuple[str, str]:
    return name, " ".join(str(argument).split()).casefold()


def grounded(answer: str, trajectory: Trajectory) -> bool:
    """Whether ``answer`` (normalised) is written in a successful tool observation, on word boundaries."""
    norm = normalize_answer(answer)
    observations = [normalize_answer(s.tool_call.observation) for s in trajectory.steps
                    if s.tool_call is not None and s.tool_call.error is None]
    if not norm:
        return False
    if norm in ("yes", "no"):
        return bool(observations)
    return any(f" {norm} " in f" {o} " for o in observations)


def _react_format(t: Trajectory) -> list[tuple[str, str]]:
    for step in t.steps:
        why = step.parse_error or turn_format_problem(step.raw, step.action)
        if why:
            return [("format", f"step {step.index}: {why}")]
    if t.finish_reason == "answer" and (not t.steps or t.steps[-1].final_answer != t.final_answer):
        return [("format", "the last turn is not the finish turn")]
    return []


def problems(trajectory: Trajectory, question: Question, min_f1: float, agent: str = "react") -> list[tuple[str, str]]:
    """Everything wrong with an episode of ``agent`` (a registered warm-start format), as (reason, detail) in
    ``REASONS`` order: ``llm_failure`` (a policy call failed after the retries); ``no_answer``; ``forced_answer``
    (answered only when forced after the budget); ``format`` (ReAct: a turn that is not exactly ``Thought: ...``
    and one ``Action: search|browse|finish[...]`` line, read otherwise by the parser, or a last turn that is not
    ``finish``); for scaffold episodes instead ``stage_boundary``, ``tool_syntax``, ``citation``
    (:func:`components.methods.rubricem.scaffold_format.scaffold_problems`, B.2.3) and ``tool_errors`` (two or more
    failed tool calls in a row, RubricEM's filter only); ``repeated_call`` (the same tool and argument twice, case
    and spacing ignored); ``wrong_answer`` (neither EM nor token F1 >= ``min_f1``); ``ungrounded`` (the answer is
    in no observation; a yes/no needs one successful tool call instead); ``duplicate`` (:func:`select`)."""
    check = warm_start_format(agent).problems
    out: list[tuple[str, str]] = []
    t = trajectory
    if t.finish_reason == "llm_failure":
        out.append(("llm_failure", str(t.metadata.get("error", ""))[:200]))
    if t.final_answer is None:
        out.append(("no_answer", f"finish_reason={t.finish_reason}"))
    elif t.finish_reason != "answer":
        out.append(("forced_answer", f"answered after {t.finish_reason}"))
    out.extend(check(t))
    seen: dict[tuple[str, str], int] = {}
    for step in t.steps:
        if step.tool_call is None:
            continue
        key = _call_key(step.tool_call.name, next(iter(step.tool_call.arguments.values()), ""))
        if key in seen:
            out.append(("repeated_call", f"step {step.index} repeats step {seen[key]}: {step.action}"))
            break
        seen[key] = step.index
    if t.final_answer is not None:
        em, f1 = exact_match(t.final_answer, question.answers), f1_score(t.final_answer, question.answers)
        if em < 1.0 and f1 < min_f1:
            out.append(("wrong_answer", f"{t.final_answer!r} vs {question.answers} (F1 {f1:.2f} < {min_f1})"))
        if not grounded(t.final_answer, t):
            out.append(("ungrounded", f"{t.final_answer!r} is in no tool observation"))
    return sorted(out, key=lambda p: REASONS.index(p[0]))


def _signature(t: Trajectory) -> tuple:
    return tuple(s.action for s in t.steps), normalize_answer(t.final_answer or "")


def select(
    episodes: Iterable[tuple[Trajectory, Question, str]], min_f1: float,
    kept_before: Sequence[Trajectory] = (), agent: str = "react",
) -> tuple[list[Trajectory], list[Rejection]]:
    """Split ``(trajectory, question, source)`` episodes of ``agent`` into kept trajectories (``metadata.source``
    set) and rejections; an episode equal to one kept (here or in ``kept_before``) is a ``duplicate``."""
    kept: list[Trajectory] = []
    rejected: list[Rejection] = []
    signatures = {(t.question_id, _signature(t)) for t in kept_before}
    counts: dict[str, int] = {}
    for t, q, source in episodes:
        sample = counts.get(q.id, 0)
        counts[q.id] = sample + 1
        found = problems(t, q, min_f1, agent)
        signature = (q.id, _signature(t))
        if not found and signature in signatures:
            found = [("duplicate", "same actions and answer as a kept episode")]
        if found:
            rejected.append(Rejection(
                question_id=q.id, source=source, sample=sample, reason=found[0][0], reasons=[r for r, _ in found],
                detail="; ".join(d for _, d in found), final_answer=t.final_answer, gold=q.answers, trajectory=t))
            continue
        signatures.add(signature)
        kept.append(t.model_copy(update={"metadata": {**t.metadata, "source": source, "sample": sample}}))
    return kept, rejected


FORMATS.register("react")(WarmStartFormat(replies=lambda question, turns: [turn.raw for turn in turns],
                                          problems=_react_format))
