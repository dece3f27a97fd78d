"""The RaR-style baseline's two LLM calls (ARBOR paper 4.4 and C.3, after Rubrics-as-Rewards): a static
checklist written for one question from the question and its reference answer only (no trajectory seen),
and a holistic 1-10 rating of one trajectory against that checklist, mapped to [0, 1] as (rating - 1) / 9.

Parsing is strict: ``{"items": ["...", ...]}`` with non-empty strings (items beyond the maximum dropped), and
``{"rating": <integer 1..10>}``. Both are judgment calls (:mod:`components.judges.call`): a failed or
unreadable call gives ``None`` and is counted by kind in the caller's tally.

    items = await write_checklist(writer, question, min_items=5, max_items=10, tally=tally)
    score = await rate(judge, question.question, trajectory_text(t), items, tally=tally)   # 0..1 or None
"""

from __future__ import annotations

from typing import Any

from components.judges.call import JudgeCall, Tally, ask
from components.judges.render import untrusted
from components.llm.base import ChatModel, Message, Sampling, system, user
from components.llm.json_reply import outer_json
from components.schemas import Question

__all__ = ["checklist_messages", "parse_items", "parse_rating", "rate", "rating_messages", "write_checklist"]

CHECKLIST_SYSTEM = (
    "You write grading checklists for a research assistant that answers questions by searching a document "
    "collection. Given a question and its reference answer, list the concrete things a good attempt does: "
    "the intermediate facts it has to establish, the entities it has to look up and in what order, the "
    "evidence its final answer should rest on, and the form the final answer should take. Each item is one "
    "short, checkable sentence. "
    'Reply with JSON only: {"items": ["<item>", ...]}.'
)
RATING_SYSTEM = (
    "You grade one attempt by a research assistant against a checklist written for its question. Read the "
    "attempt's searches, the evidence it found and its final answer, decide how much of the checklist it "
    "meets, and give one overall rating from 1 (meets none of it) to 10 (meets all of it). "
    'Reply with JSON only: {"rating": <integer from 1 to 10>}.'
)
RATING_SCHEMA = {"type": "object", "properties": {"rating": {"type": "integer", "minimum": 1, "maximum": 10}},
                 "required": ["rating"], "additionalProperties": False}


def _json(text: str) -> Any:
    try:
        return outer_json(text)
    except ValueError:
        return None


def parse_items(text: str, max_items: int) -> list[str] | None:
    value = _json(text)
    items = value.get("items") if isinstance(value, dict) else None
    if not isinstance(items, list) or not items or not all(isinstance(i, str) and i.strip() for i in items):
        return None
    return [i.strip() for i in items][:max_items]


def parse_rating(text: str) -> int | None:
    value = _json(text)
    rating = value.get("rating") if isinstance(value, dict) else None
    if isinstance(rating, bool) or not isinstance(rating, (int, float)) or rating != int(rating):
        return None
    return int(rating) if 1 <= rating <= 10 else None


def checklist_messages(question: Question, min_items: int, max_items: int) -> list[Message]:
    return [system(CHECKLIST_SYSTEM), user(
        f"Question: {question.question}\nReference answer: {' | '.join(question.answers)}\n\n"
        f"Write between {min_items} and {max_items} checklist items.")]


def rating_messages(question: str, text: str, items: list[str]) -> list[Message]:
    checklist = "\n".join(f"{n}. {untrusted(item)}" for n, item in enumerate(items, 1))
    return [system(RATING_SYSTEM), user(f"Question: {question}\n\nChecklist:\n{checklist}\n\nAttempt:\n{text}")]


async def write_checklist(model: ChatModel, question: Question, min_items: int, max_items: int, tally: Tally,
                          max_tokens: int = 768) -> list[str] | None:
    schema = {"type": "object", "properties": {"items": {"type": "array", "items": {"type": "string"},
                                                         "minItems": min_items, "maxItems": max_items}},
              "required": ["items"], "additionalProperties": False}
    call = JudgeCall(checklist_messages(question, min_items, max_items), lambda text: parse_items(text, max_items),
                     Sampling(temperature=0.0, max_tokens=max_tokens), schema=schema)
    result = await ask(model, call, tally)
    return result.value if result.ok else None


async def rate(model: ChatModel, question: str, text: str, items: list[str], tally: Tally,
               max_tokens: int = 32) -> float | None:
    call = JudgeCall(rating_messages(question, text, items), parse_rating,
                     Sampling(temperature=0.0, max_tokens=max_tokens), schema=RATING_SCHEMA)
    result = await ask(model, call, tally)
    return (result.value - 1) / 9 if result.ok else None
