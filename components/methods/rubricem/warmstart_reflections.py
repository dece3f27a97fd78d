"""Reflection rows of a warm start (``sft.reflection_rows``, embedded profile only): the teacher reflects on the
warm start's own attempts in the meta-policy's format (:mod:`components.methods.rubricem.reflection`), under
structured output as a ``ReflectionDraft`` rendered into the two blocks (:func:`render_draft`), and rejection
sampling keeps the valid reflections, each SFT row under the meta-policy's own prompt. Why the embedded warm start
needs them, and why the teacher answers in JSON: docs/methods/rubricem.md.

    rows, rejected = asyncio.run(teacher_reflections(pool.role("teacher"), attempts, n=24, samples=2,
                                                     temperature=0.7, seed=params.seed, max_tokens=256))
    segments = reflection_sft_row(rows[0], render)    # [(prompt, False), (reflection + end of turn, True)]
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Sequence
from typing import Literal, get_args

from pydantic import BaseModel, Field, ValidationError

from components.evaluation.metrics import exact_match
from components.judges.render import scaffold_text
from components.llm.base import ChatModel, Sampling
from components.llm.json_schema import json_schema_of
from components.methods.rubricem.reflection import (
    DRAFT_REQUEST,
    InvalidReason,
    ReflectionDraft,
    parse_reflection,
    reflection_messages,
    render_draft,
)
from components.schemas import Question, Trajectory
from components.training.sft.trajectories import Renderer, reply_row

__all__ = ["REFLECTIONS_FILE", "REFLECTION_REASONS", "ReflectionRejection", "ReflectionRow", "reflection_sft_row",
           "teacher_reflections"]

RejectReason = Literal["call_failed"] | InvalidReason
REFLECTION_REASONS: tuple[str, ...] = ("call_failed", *get_args(InvalidReason))
REFLECTIONS_FILE = "reflections.jsonl"
"""The kept rows in the sft_data folder; the sft stage reads them from there."""


class ReflectionRow(BaseModel):
    """One SFT row of the meta-policy: the attempt as the policy is shown it, and the reflection it learns to write."""

    question: Question
    attempt: str = Field(description="scaffold_text of the attempt reflected on, tool outputs whole")
    reflection: str = Field(description="the kept reflection, both blocks, as the teacher wrote it")
    source: str = Field(description="where the attempt came from: oracle | teacher")
    attempt_correct: bool


class ReflectionRejection(BaseModel):
    question_id: str
    sample: int
    reason: RejectReason
    detail: str
    text: str = ""


def _withheld(trajectory: Trajectory, question: Question) -> list[str]:
    return [*question.answers, *([trajectory.final_answer] if trajectory.final_answer else [])]


async def _reflect(teacher: ChatModel, trajectory: Trajectory, question: Question, source: str, index: int, *,
                   samples: int, temperature: float, seed: int, max_tokens: int,
                   observation_chars: int | None) -> tuple[ReflectionRow | None, list[ReflectionRejection]]:
    attempt = scaffold_text(trajectory)
    system, prompt = reflection_messages(question, attempt, example=False, observation_chars=observation_chars)
    messages = [system, prompt.model_copy(update={"content": f"{prompt.content} {DRAFT_REQUEST}"})]
    schema = json_schema_of(ReflectionDraft)
    rejected: list[ReflectionRejection] = []
    for s in range(samples):
        sampling = (Sampling(temperature=0.0, max_tokens=max_tokens, json_schema=schema) if s == 0 else
                    Sampling(temperature=temperature, max_tokens=max_tokens, seed=seed + 1000 * index + s,
                             json_schema=schema))
        outcome = await teacher.chat(messages, sampling)
        if not outcome.ok:
            rejected.append(ReflectionRejection(question_id=question.id, sample=s, reason="call_failed",
                                                detail=f"{outcome.error_type}: {outcome.message}"))
            continue
        try:
            text = render_draft(ReflectionDraft.model_validate_json(outcome.text))
        except ValidationError as exc:
            err = exc.errors()[0]
            rejected.append(ReflectionRejection(
                question_id=question.id, sample=s, reason="format", text=outcome.text,
                detail=f"not a reflection draft: {'.'.join(map(str, err['loc'])) or 'reply'}: {err['msg']}"))
            continue
        parsed = parse_reflection(text, _withheld(trajectory, question))
        if parsed.valid:
            correct = exact_match(trajectory.final_answer, question.answers) == 1.0
            row = ReflectionRow(question=question, attempt=attempt, reflection=text, source=source,
                                attempt_correct=correct)
            return row, rejected
        rejected.append(ReflectionRejection(question_id=question.id, sample=s, reason=parsed.reason,
                                            detail=parsed.error, text=text))
    return None, rejected


async def teacher_reflections(
    teacher: ChatModel, attempts: Sequence[tuple[Trajectory, Question, str]], *, n: int, samples: int,
    temperature: float, seed: int, max_tokens: int, observation_chars: int | None = None, progress=None,
) -> tuple[list[ReflectionRow], list[ReflectionRejection]]:
    """Reflections on ``n`` of the ``(trajectory, question, source)`` attempts, drawn with ``seed`` (all of them
    when there are fewer), at most one per attempt, in draw order; and every rejected sample. The middleware
    bounds how many calls run at once; ``progress`` (a tqdm bar) advances by one per attempt reflected on.

    The attempts are the warm start's episodes, oracle and teacher, kept or rejected (a failed attempt is what a
    reflection is most useful for). Each is shown as the meta-policy is shown one in training
    (``reflection_messages`` over ``scaffold_text``), without the prompt's worked example and with one sentence
    more. Sample 0 is greedy, samples 1.. at ``temperature``; the first rendered reflection ``parse_reflection``
    accepts is kept (both blocks, no placeholder or line of the example, neither the gold answer nor the attempt's
    own named), and every rejected sample is recorded with its reason (not a valid draft: ``format``)."""
    if n <= 0 or not attempts:
        return [], []
    drawn = random.Random(seed).sample(range(len(attempts)), min(n, len(attempts)))

    async def reflected(i: int):
        result = await _reflect(teacher, *attempts[i], i, samples=samples, temperature=temperature, seed=seed,
                                max_tokens=max_tokens, observation_chars=observation_chars)
        if progress is not None:
            progress.update(1)
        return result

    results = await asyncio.gather(*(reflected(i) for i in drawn))
    rows = [row for row, _ in results if row is not None]
    return rows, [r for _, rejected in results for r in rejected]


def reflection_sft_row(row: ReflectionRow, render: Renderer, observation_chars: int | None = None) -> list[tuple[str, bool]]:
    """The row's SFT segments: the meta-policy's prompt (not trained), then the reflection (trained). ``attempt``
    is stored whole; ``observation_chars`` cuts its tool outputs as training will (``reflection_messages``)."""
    return reply_row(reflection_messages(row.question, row.attempt, observation_chars=observation_chars),
                     row.reflection, render)
