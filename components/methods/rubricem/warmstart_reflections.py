"""Reflection rows of a warm start: the teacher reflects on warm-start attempts in the meta-policy's format
(``components.methods.rubricem.reflection``), and rejection sampling keeps the valid reflections.

RubricEM's reflection meta-policy is the policy itself writing ``<reflection_rubrics>`` and
``<reflection_takeaways>`` about one of its attempts. The paper's Qwen3-8B follows that format from the prompt
alone. The embedded 0.5B, after scaffold SFT, does not: it goes on writing the scaffold. Then every candidate
is invalid, the group is flat, the bank stays empty and the meta-policy never gets an update. So the embedded
profile adds ``sft.reflection_rows`` reflection rows to a warm start's SFT data, and the paper profile adds
none.

The attempts are the warm start's own episodes, oracle and teacher alike, kept or rejected (a failed attempt
is what a reflection is most useful for), drawn with the run's seed. Each is shown to the teacher exactly as
the meta-policy is shown an attempt during training (``reflection_messages`` over ``scaffold_text``), but
without the prompt's worked example and with one sentence more: the teacher replies under structured output, as
a ``ReflectionDraft`` JSON object that is rendered into the two blocks (``render_draft``). Asked for the tagged
blocks, the 1.5B teacher copied the format's placeholders in 20 of 20 replies; shown a worked example instead,
it dropped the tags in 5 of 6; under JSON with the example, it copied the example's lines in 5 of 6. The SFT
row's prompt is the meta-policy's own, example included. Sample 0 is greedy and samples 1.. are drawn at
``temperature``. The first rendered reflection that ``parse_reflection`` accepts is kept: both blocks, no
placeholder or line of the prompt's example, and neither the gold answer nor the attempt's own answer named.
Every rejected sample is recorded with its reason (a reply that is not a valid draft is ``format``).

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
from components.training.trajectory_sft import Renderer, reply_row

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
    bounds how many calls run at once; ``progress`` (a tqdm bar) advances by one per attempt reflected on."""
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
