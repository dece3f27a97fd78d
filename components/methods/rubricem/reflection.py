"""RubricEM's reflection branch (paper 3.4, D.4, D.6.1-2): what the shared backbone is asked for a reflection,
how a candidate is parsed, and the privileged judge that scores the candidates.

A reflection is exactly two blocks, ``<reflection_rubrics>`` (what mattered: critical requirements, approach,
pitfalls) and ``<reflection_takeaways>`` (1-4 portable lessons). The judge sees the question, the trajectory,
its stage scores and the evaluator's justifications, and every valid candidate; for each it rates diagnostic
accuracy, specificity and scope & balance in [0, 1], once for a retry of this question (within-episode) and
once for similar questions (cross-episode). ``u = (u_within + u_cross) / 2`` with each ``u`` the weighted sum
(0.4 / 0.3 / 0.3). A candidate that does not parse scores 0 (a policy format failure, not a judge failure);
the judge's call is a judgment call (:mod:`components.judges.call`), and one that fails or does not score every
valid candidate leaves all of them unscored (None) with the reason, which the caller counts.

    messages = reflection_messages(question, scaffold_text(trajectory))          # for the policy
    parsed = [parse_reflection(text) for text in candidate_texts]
    u, error = asyncio.run(ReflectionJudge(pool.role("reflection_judge")).score(question, text, feedback, parsed))
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, Field

from components.clipping import clip_middle
from components.evaluation.metrics import normalize_answer
from components.judges.call import JudgeCall, Unparsed, ask, model_parser
from components.judges.render import clip_tool_outputs, untrusted
from components.llm.base import ChatModel, Message, Sampling
from components.llm.json_schema import json_schema_of, one_item_per_key
from components.methods.rubricem.stagewise_judge import failure_reason
from components.schemas import Question

__all__ = ["DIMENSIONS", "Reflection", "ReflectionDraft", "ReflectionJudge", "parse_reflection",
           "reflection_messages", "render_draft"]

DIMENSIONS = ("diagnostic_accuracy", "specificity", "scope")
DEFAULT_WEIGHTS = {"diagnostic_accuracy": 0.4, "specificity": 0.3, "scope": 0.3}

EXAMPLE_QUESTION = "Which river flows through the birthplace of the architect of the Tollan Bridge?"
EXAMPLE_RUBRICS = """\
Critical requirements: the architect of the Tollan Bridge, that architect's birthplace, the river through it.
Approach: search the bridge, browse its page for the architect, then search the architect for the birthplace.
Pitfalls: the attempt answered with the town, not the river; it never opened the town's page."""
EXAMPLE_TAKEAWAYS = """\
1. In a chain of three hops, name each intermediate entity before searching for the next one.
2. Before finishing, check that the answer is the kind of thing asked for (a river, not a town)."""

INSTRUCTIONS = """\
You review a finished attempt by a research agent and write guidance for later attempts. You do not answer \
the question again and do not rewrite the answer.

Read the final <answer> first: is it right and well supported? Then find the two to four strengths or \
weaknesses that mattered most, trace each to what the agent visibly did, and turn them into guidance that \
fits this question and carries over to similar ones. Stay with what the attempt shows: no invented flaws, \
no guesses about hidden reasoning, no generic advice such as "be careful".

Reply with exactly two blocks and nothing else. <reflection_rubrics> has three lines: "Critical requirements:" \
(the facts the answer depends on), "Approach:" (the searches and pages that lead to them) and "Pitfalls:" (what \
went wrong or could have). <reflection_takeaways> has one to four numbered lessons."""

# the policy's prompt shows a worked example (a format to follow); the warm start's teacher, under structured
# output, is shown the instructions alone: with the example it copied its lines into 5 of 6 replies
POLICY_SYSTEM = f"""{INSTRUCTIONS} Write your own sentences about THIS attempt; never copy the example.

Example, for another question ("{EXAMPLE_QUESTION}"):
<reflection_rubrics>
{EXAMPLE_RUBRICS}
</reflection_rubrics>
<reflection_takeaways>
{EXAMPLE_TAKEAWAYS}
</reflection_takeaways>"""

_LABEL = re.compile(r"^\s*(?:\d+[.)]|[-*]|[A-Za-z][A-Za-z ]{0,40}:)\s*")


def _content(line: str) -> str:
    """A line without its label ("Approach:", "1.") and normalised (case, punctuation, articles, spaces)."""
    return normalize_answer(_LABEL.sub("", line, count=1))


_EXAMPLE_LINES = tuple(_content(line) for line in f"{EXAMPLE_RUBRICS}\n{EXAMPLE_TAKEAWAYS}".splitlines())


def copies_example(block: str) -> bool:
    """Whether a line of ``block`` holds a line of the prompt's example (the 1.5B teacher copied them whole,
    dropping a full stop or renumbering; a lesson reworded for this question is its own)."""
    return any(example in _content(line) for line in block.splitlines() for example in _EXAMPLE_LINES)


class ReflectionDraft(BaseModel):
    """A reflection as JSON fields, for a writer under structured output (the warm start's teacher); rendered
    into the two blocks by :func:`render_draft`."""

    critical_requirements: str = Field(min_length=1, max_length=300)
    approach: str = Field(min_length=1, max_length=300)
    pitfalls: str = Field(min_length=1, max_length=300)
    takeaways: list[str] = Field(min_length=1, max_length=4)


DRAFT_REQUEST = ("Reply as one JSON object instead: critical_requirements, approach and pitfalls (one sentence "
                 "each, the three lines of <reflection_rubrics>) and takeaways (a list of one to four lessons).")


def render_draft(draft: ReflectionDraft) -> str:
    """The draft in the policy's format: the two blocks, the takeaways numbered."""
    def one(text: str) -> str:
        return " ".join(text.split())

    lessons = "\n".join(f"{i}. {one(t)}" for i, t in enumerate(draft.takeaways, start=1))
    return (f"<reflection_rubrics>\nCritical requirements: {one(draft.critical_requirements)}\n"
            f"Approach: {one(draft.approach)}\nPitfalls: {one(draft.pitfalls)}\n</reflection_rubrics>\n"
            f"<reflection_takeaways>\n{lessons}\n</reflection_takeaways>")


def reflection_messages(question: Question, trajectory: str, *, example: bool = True,
                        observation_chars: int | None = None) -> list[Message]:
    """The prompt the shared backbone answers with a reflection candidate (``example=False``: the instructions
    without the worked example). ``observation_chars`` cuts each tool output of the attempt (None: whole), so
    that the prompt and its reflection fit the meta-policy's context and SFT rows."""
    attempt = clip_tool_outputs(trajectory, observation_chars).strip()
    return [Message(role="system", content=POLICY_SYSTEM if example else INSTRUCTIONS),
            Message(role="user", content=f"Question: {question.question}\n\nThe attempt:\n{attempt}\n\n"
                                         "Write the two blocks.")]


_BLOCK = {name: re.compile(rf"<{name}>(.*?)</{name}>", re.DOTALL) for name in ("reflection_rubrics", "reflection_takeaways")}


InvalidReason = Literal["format", "names_answer"]
"""Why a candidate is invalid: its blocks (missing, out of order, placeholders, the example's lines), or an answer
named in it."""


@dataclass
class Reflection:
    """A parsed candidate: both blocks, or the reason it is invalid."""

    rubrics: str = ""
    takeaways: str = ""
    error: str | None = None
    reason: InvalidReason | None = None

    @property
    def valid(self) -> bool:
        return self.error is None


YES_NO = frozenset({"yes", "no"})


def named_answer(text: str, answers: Sequence[str]) -> str | None:
    """The first of ``answers`` that ``text`` names (SQuAD-normalised, on word boundaries); yes/no answers are
    too common as words to count."""
    norm = f" {normalize_answer(text)} "
    for answer in answers:
        a = normalize_answer(answer or "")
        if a and a not in YES_NO and f" {a} " in norm:
            return answer
    return None


_PLACEHOLDER_LINE = re.compile(r"^\s*(?:\d+[.)]|[-*])?\s*(?:[A-Za-z][A-Za-z ]{0,40}:)?\s*(?:\.\.\.|…)?\s*(?:\([^)]*\))?\s*$")


def placeholder_only(block: str) -> bool:
    """Whether every line of ``block`` is at most a label, ``...`` and a parenthesis, as the format shows them
    ("Approach: ...", "1. ... (one to four short lessons)"): a copied template, not a reflection."""
    return all(_PLACEHOLDER_LINE.match(line) for line in block.splitlines())


def parse_reflection(text: str, withheld: Sequence[str] = ()) -> Reflection:
    """Exactly one non-empty rubrics block followed by one non-empty takeaways block, neither of them only the
    format's placeholders nor with a line of the prompt's example, nothing else of substance, and none of the
    ``withheld`` answers (the question's gold, the reflected trajectory's own): a reflection carries lessons, and
    an answer in the bank reaches other questions through cross-episode retrieval."""
    found = {name: pattern.findall(text) for name, pattern in _BLOCK.items()}
    for name, blocks in found.items():
        if len(blocks) != 1 or not blocks[0].strip():
            return Reflection(error=f"expected one non-empty <{name}> block, found {len(blocks)}", reason="format")
    if text.find("<reflection_rubrics>") > text.find("<reflection_takeaways>"):
        return Reflection(error="<reflection_takeaways> comes before <reflection_rubrics>", reason="format")
    rest = text
    for pattern in _BLOCK.values():
        rest = pattern.sub("", rest)
    if rest.strip():
        return Reflection(error=f"text outside the two blocks: {rest.strip()[:60]!r}", reason="format")
    rubrics, takeaways = found["reflection_rubrics"][0].strip(), found["reflection_takeaways"][0].strip()
    for name, block in (("reflection_rubrics", rubrics), ("reflection_takeaways", takeaways)):
        if placeholder_only(block):
            return Reflection(error=f"<{name}> only repeats the format's placeholders", reason="format")
        if copies_example(block):
            return Reflection(error=f"<{name}> copies a line of the prompt's example", reason="format")
    leaked = named_answer(f"{rubrics}\n{takeaways}", withheld)
    if leaked is not None:
        return Reflection(error=f"names an answer ({leaked!r}): a reflection carries lessons, not answers",
                          reason="names_answer")
    return Reflection(rubrics, takeaways)


class Ratings(BaseModel):
    diagnostic_accuracy: float = Field(ge=0, le=1)
    specificity: float = Field(ge=0, le=1)
    scope: float = Field(ge=0, le=1)


class CandidateRating(BaseModel):
    index: int = Field(ge=1)
    within: Ratings
    cross: Ratings


class RatingSheet(BaseModel):
    candidates: list[CandidateRating]


JUDGE_SYSTEM = """\
You judge reflections a research agent wrote about one of its own attempts. You know how the attempt was \
graded. Rate each reflection as guidance for the future, not the attempt itself: a reflection on a perfect \
attempt can be poor if it is generic, and one on a failed attempt can be excellent if it names the real cause.

Rate each from 0.0 to 1.0 on:
- diagnostic_accuracy: does it name the main strengths and weaknesses, in line with the grader's \
justifications and the visible attempt? Penalise missing a failure the grader flagged, invented problems and \
wrong root causes.
- specificity: is it concrete and actionable for this question? Penalise generic advice, checklists that fit \
any task, and mere repetition of the grader's words.
- scope: does it also help on other questions, with takeaways that complement each other? Penalise a missing \
important aspect and the same point made twice.
Give one set of ratings for a retry of this same question ("within") and one for similar new questions \
("cross")."""


class ReflectionJudge:
    """Scores reflection candidates: ``u = mean(u_within, u_cross)``, ``u_x = sum_d weight_d * rating_d``."""

    def __init__(self, judge: ChatModel, weights: Mapping[str, float] | None = None, max_tokens: int = 1024,
                 trajectory_chars: int = 4000):
        self.judge, self.max_tokens, self.trajectory_chars = judge, max_tokens, trajectory_chars
        self.weights = dict(weights or DEFAULT_WEIGHTS)
        if set(self.weights) != set(DIMENSIONS):
            raise ValueError(f"reflection weights must name exactly {DIMENSIONS}, got {sorted(self.weights)}")

    def messages(self, question: Question, trajectory: str, feedback: str,
                 candidates: Sequence[tuple[int, Reflection]]) -> list[Message]:
        """The judge's prompt: ``trajectory`` as :func:`~components.judges.render.scaffold_text` renders it,
        the grader's ``feedback`` and the candidates' blocks :func:`~components.judges.render.untrusted`."""
        text = clip_middle(trajectory.strip(), self.trajectory_chars)
        shown = "\n\n".join(f"--- Reflection {i} ---\n<reflection_rubrics>\n{untrusted(c.rubrics)}\n"
                            f"</reflection_rubrics>\n<reflection_takeaways>\n{untrusted(c.takeaways)}\n"
                            "</reflection_takeaways>" for i, c in candidates)
        answers = f"Reference answer: {' / '.join(question.answers)}\n" if question.answers else ""
        user = (f"Question: {question.question}\n{answers}\nThe attempt:\n{text}\n\n"
                f"How it was graded:\n{untrusted(feedback)}\n\n"
                f"Reflections:\n{shown}\n\n"
                'Reply with one JSON object: {"candidates": [{"index": 1, "within": {"diagnostic_accuracy": r, '
                '"specificity": r, "scope": r}, "cross": {...}}, ...]} rating every reflection number '
                f"({', '.join(str(i) for i, _ in candidates)}) exactly once, each r your own rating from 0.0 to 1.0. "
                "Compare the reflections with each other: a better one gets higher ratings than a worse one.")
        return [Message(role="system", content=JUDGE_SYSTEM), Message(role="user", content=user)]

    def utility(self, ratings: Ratings) -> float:
        return sum(self.weights[d] * getattr(ratings, d) for d in DIMENSIONS)

    async def score(self, question: Question, trajectory: str, feedback: str,
                    candidates: Sequence[Reflection]) -> tuple[list[float | None], str | None]:
        """One score per candidate (0 for an invalid one), or all None with the reason when the judge fails.
        The judge sees the valid candidates numbered 1..n without gaps (a small model renumbers a gapped list)."""
        positions = [i for i, c in enumerate(candidates) if c.valid]
        scores: list[float | None] = [0.0] * len(candidates)
        if not positions:
            return scores, None
        shown = [(n + 1, candidates[i]) for n, i in enumerate(positions)]
        numbers = [n for n, _ in shown]
        schema = one_item_per_key(json_schema_of(RatingSheet), "candidates", "index", numbers)
        call = JudgeCall(self.messages(question, trajectory, feedback, shown), _covering_sheet(numbers),
                         Sampling(temperature=0.0, max_tokens=self.max_tokens), schema=schema)
        result = await ask(self.judge, call)
        if not result.ok:
            return [None] * len(candidates), failure_reason(result)
        for rating in result.value.candidates:
            scores[positions[rating.index - 1]] = (self.utility(rating.within) + self.utility(rating.cross)) / 2
        return scores, None


def _covering_sheet(numbers: list[int]) -> Callable[[str], RatingSheet]:
    """Parse a :class:`RatingSheet` that rates each of ``numbers`` exactly once."""
    read = model_parser(RatingSheet)

    def parse(text: str) -> RatingSheet:
        sheet = read(text)
        got = sorted(c.index for c in sheet.candidates)
        if got != numbers:
            raise Unparsed(f"rated reflections {got}, expected {numbers}")
        return sheet

    return parse
