"""The LLM calls that write ARBOR's rubrics: contrastive induction of query-local drafts from a group's
anchor pairs (paper 3.2, A.1) and consolidation of the candidate pool into cross-query common rubrics
(paper 3.3). Both ask for ``{"rubrics": [{"title", "description", "counter_description"}, ...]}``, parsed
strictly: each item needs the three non-empty strings, anything else makes the reply unreadable. An empty
list is a valid answer (nothing new to add); items beyond the number asked for are dropped. Both are judgment
calls (:mod:`components.judges.call`): a failed or unreadable call returns ``None`` and is counted by kind in
the caller's :class:`~components.judges.call.Tally`.

    plan = plan_induction(f1, lengths, valid)                       # components.methods.arbor.contrast
    drafts = await induce(inducer, question, texts, f1, plan, existing=[...], max_rubrics=3, tally=tally)
    new = await consolidate(consolidator, memory.drafts, [r.rubric for r in memory.common], max_rubrics=2)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pydantic import ValidationError

from components.judges.call import JudgeCall, Tally, ask
from components.judges.render import untrusted
from components.llm.base import ChatModel, Message, Sampling, system, user
from components.llm.json_reply import outer_json
from components.methods.arbor.contrast import InductionPlan
from components.methods.arbor.memory import Draft, RubricText

__all__ = ["consolidate", "consolidation_messages", "induce", "induction_messages", "parse_rubrics", "rubrics_schema",
           "writing_call"]

INDUCTION_SYSTEM = """\
You study how a search agent works. The agent answers a question by thinking, calling a search or browse \
tool, reading what comes back, and finally giving an answer. The answers have already been graded by \
token overlap with the reference answer, so do not write criteria about whether the answer is right.

Your job is to name the behaviours in the search process that explain why one attempt did better than \
another: how queries were phrased (one precise entity at a time, or vague and compound), whether each \
new query used what the last observation revealed, whether the agent repeated searches or went in \
circles, whether it read and used the evidence it got, when it decided it knew enough to stop (too early \
with open questions, or too late after the answer was already in hand), and whether it finished cleanly \
with one well-formed answer. An attempt with unreadable output or no final answer is never the better \
example, even if some text in it looks right.

Rules:
- Each rubric must separate the attempts you are shown: if both sides behave the same way on it, leave it out.
- Ground every rubric in something you can see in these attempts, but word it so it would apply to other \
questions too: no entity names, dates or facts from this question.
- Describe both ends: what a high-scoring attempt does, and what a low-scoring attempt does instead.
- Checking more is not automatically better: once the evidence settles the question, more searching is \
the weak behaviour; answering while the key fact is still missing is weak too.
- Do not repeat a rubric from the list of existing rubrics, even in other words. If they already cover \
the difference, return an empty list.

Reply with JSON only, in this form:
{"rubrics": [{"title": "<a few words>", "description": "<what a high-scoring attempt does>", \
"counter_description": "<what a low-scoring attempt does>"}]}"""

CONSOLIDATION_SYSTEM = """\
You maintain a small set of general standards for grading how a search agent searches. You are given \
candidate rubrics, each written for one specific question, and the standards already in use. Find the \
process patterns that recur across candidates from different questions and merge each pattern into one \
general standard that would grade an attempt at any question.

Rules:
- A good standard separates strong attempts from weak ones: avoid standards nearly every attempt meets or \
nearly every attempt fails.
- Keep to what makes the reasoning and the search sound: targeted queries, use of retrieved evidence, \
stopping once the key uncertainty is resolved but not before, a clean single final answer. Do not grade \
style or trivia.
- Describe both ends: what a strong attempt does and what a weak attempt does.
- Replace question-specific names, dates and facts with general wording; an example in parentheses is fine.
- Do not produce a standard that overlaps in meaning with one already in use, even if worded differently. \
If the candidates add nothing new, return an empty list.

Reply with JSON only, in this form:
{"rubrics": [{"title": "<a few words>", "description": "<what a strong attempt does>", \
"counter_description": "<what a weak attempt does>"}]}"""


def rubrics_schema(max_rubrics: int) -> dict[str, Any]:
    item = {
        "type": "object",
        "properties": {"title": {"type": "string"}, "description": {"type": "string"},
                       "counter_description": {"type": "string"}},
        "required": ["title", "description", "counter_description"],
        "additionalProperties": False,
    }
    return {"type": "object", "properties": {"rubrics": {"type": "array", "items": item, "maxItems": max_rubrics}},
            "required": ["rubrics"], "additionalProperties": False}


def parse_rubrics(text: str, max_rubrics: int) -> list[RubricText] | None:
    """The rubrics of a reply, or None when it is not ``{"rubrics": [...]}`` with complete items."""
    try:
        value = outer_json(text)
    except ValueError:
        return None
    items = value.get("rubrics") if isinstance(value, dict) else None
    if not isinstance(items, list):
        return None
    if not all(isinstance(item, dict) and all(isinstance(v, str) for v in item.values()) for item in items):
        return None
    try:
        rubrics = [RubricText.model_validate({k: v.strip() for k, v in item.items()}) for item in items]
    except ValidationError:
        return None
    return rubrics[:max_rubrics]


def _existing_block(existing: Sequence[RubricText]) -> str:
    if not existing:
        return "(none yet)"
    return "\n".join(_rubric_lines(r) for r in existing)


def _rubric_lines(r: RubricText) -> str:
    """One rubric as the writers are shown it, its text :func:`~components.judges.render.untrusted` (a model
    wrote it from trajectories)."""
    return (f"- {untrusted(r.title)}\n  Strong: {untrusted(r.description)}\n"
            f"  Weak: {untrusted(r.counter_description)}")


def induction_messages(question: str, answers: Sequence[str] | None, texts: Sequence[str], f1: Sequence[float],
                       plan: InductionPlan, existing: Sequence[RubricText], max_rubrics: int) -> list[Message]:
    """The induction prompt for a plan of kind ``pairs`` or ``unlabelled``."""
    parts = [f"Question: {question}"]
    if answers:
        parts.append(f"Reference answer: {' | '.join(answers)} (use it to see which searches found what was "
                     "needed; do not grade the answer itself)")
    if plan.kind == "pairs":
        for n, (hi, lo) in enumerate(plan.pairs, 1):
            parts.append(f"=== Contrast {n}: the first attempt scored higher ({f1[hi]:.2f}) than the second "
                         f"({f1[lo]:.2f}) ===\n--- Higher-scoring attempt ---\n{texts[hi]}\n"
                         f"--- Lower-scoring attempt ---\n{texts[lo]}")
    elif plan.kind == "unlabelled":
        parts.append("These attempts all reached the same partial score, so no side is marked better; find "
                     "the process differences between them yourself.")
        parts.extend(f"--- Attempt {n} ---\n{texts[i]}" for n, i in enumerate(plan.members, 1))
    else:
        raise ValueError(f"induction_messages: plan of kind {plan.kind!r} ({plan.reason}) induces nothing")
    parts.append(f"Existing rubrics (do not repeat):\n{_existing_block(existing)}")
    parts.append(f"Write between 1 and {max_rubrics} rubrics; fewer, sharper rubrics are better.")
    return [system(INDUCTION_SYSTEM), user("\n\n".join(parts))]


def consolidation_messages(drafts: Sequence[Draft], common: Sequence[RubricText], max_rubrics: int) -> list[Message]:
    by_question: dict[str, list[Draft]] = {}
    for d in drafts:
        by_question.setdefault(d.question, []).append(d)
    blocks = []
    for n, (question, items) in enumerate(by_question.items(), 1):
        lines = [f"Question {n}: {question}"]
        lines += [_rubric_lines(d.rubric) for d in items]
        blocks.append("\n".join(lines))
    body = (f"Standards already in use (do not duplicate):\n{_existing_block(common)}\n\n"
            "Candidate rubrics from recent questions:\n" + "\n\n".join(blocks) +
            f"\n\nWrite between 1 and {max_rubrics} new general standards, or an empty list.")
    return [system(CONSOLIDATION_SYSTEM), user(body)]


def writing_call(messages: list[Message], max_rubrics: int, max_tokens: int) -> JudgeCall[list[RubricText]]:
    """A greedy call for at most ``max_rubrics`` rubrics, under :func:`rubrics_schema`."""
    return JudgeCall(messages, lambda text: parse_rubrics(text, max_rubrics),
                     Sampling(temperature=0.0, max_tokens=max_tokens), schema=rubrics_schema(max_rubrics))


async def induce(model: ChatModel, question: str, texts: Sequence[str], f1: Sequence[float], plan: InductionPlan,
                 existing: Sequence[RubricText], max_rubrics: int, tally: Tally, answers: Sequence[str] | None = None,
                 max_tokens: int = 768) -> list[RubricText] | None:
    """Drafts for one group (``[]`` when the plan skips it, None when the call failed)."""
    if plan.kind == "skip":
        return []
    messages = induction_messages(question, answers, texts, f1, plan, existing, max_rubrics)
    result = await ask(model, writing_call(messages, max_rubrics, max_tokens), tally)
    return result.value if result.ok else None


async def consolidate(model: ChatModel, drafts: Sequence[Draft], common: Sequence[RubricText], max_rubrics: int,
                      tally: Tally, max_tokens: int = 768) -> list[RubricText] | None:
    """New common rubrics abstracted from the candidate pool (None when the call failed)."""
    call = writing_call(consolidation_messages(drafts, common, max_rubrics), max_rubrics, max_tokens)
    result = await ask(model, call, tally)
    return result.value if result.ok else None
