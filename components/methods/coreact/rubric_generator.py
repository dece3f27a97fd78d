"""Co-ReAct's rubric generator (paper 3.2): a short list of weighted criteria for the agent's *next* step, written
from the question and the trajectory prefix; its prompt, its strict schema, the parser, and a role wrapper.

A rubric is one JSON object and nothing else (a fenced ```json block is allowed)::

    {"criteria": [{"criterion": "Looks up the director named in the last observation", "weight": 3},
                  {"criterion": "Does not repeat an earlier search", "weight": 1}]}

Parsing is strict: 1..max_criteria items, each with exactly a non-empty ``criterion`` string of at most
``max_chars`` characters (``rubric_generator.max_criterion_chars``, passed in by every caller) and a positive
numeric ``weight`` (at most 10); weights are normalised to sum to 1. The length limit is in the schema too, so a
backend with structured output cannot run a criterion on (the 0.5B copies whole observations into criteria and
is cut off at ``max_tokens``, leaving no JSON). A reply that does not meet it is a failure with a one-line reason,
counted by the caller; it never raises. :attr:`ParsedRubric.format_score` is the schema format term of the reward: 1
for the object alone, 0.5 when it parses but has other text around it, 0 otherwise; :attr:`ParsedRubric.raw_weights`
keeps the weights as written, which the released code's format term reads (``rubric_generator.format_reward:
count_weights``, whose prompt asks for :data:`COUNT_RANGE` criteria with weights summing to 1).

    generator = RubricGenerator(pool.role("rubric_generator"), max_criteria=4, max_chars=160)
    out = await generator.generate(question, steps, seed=7)
    out.rubric.criteria if out.ok else out.error
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from components.judges.render import render_prefix, untrusted
from components.llm.base import ChatModel, Message, Sampling, system, user
from components.schemas import Criterion, Rubric, Step

__all__ = ["COUNT_RANGE", "GeneratedRubric", "ParsedRubric", "RubricGenerator", "generator_messages", "parse_rubric",
           "render_rubric", "rubric_schema"]

MAX_WEIGHT = 10.0
COUNT_RANGE = (3, 5)
"""The number of criteria the released generator is asked for and its format term rewards
(ZBWpro/Co-ReAct@ff5540a6 rubric_rl/reward_fn.py:87, rubric_rl/rubric_prompt.py:17)."""

SYSTEM_PROMPT = """\
You coach a research agent that answers questions by looking facts up in an encyclopedia. The agent acts with \
search[words] (find paragraphs), browse[doc_id] (read one paragraph) and finish[answer] (give the answer).

You are shown the question and what the agent has done so far. Write the checklist that its NEXT action \
should meet: what that one action has to target for the agent to make progress. Rules for each criterion:
- it checks exactly one thing, which a reader can confirm from the proposed action and the history alone;
- it is specific to this question and this point of the search (name the entity or fact to look up next);
- it is one short sentence of at most {max_chars} characters: never copy the history or an observation into it;
- no criterion repeats another.
{weights} Write between {least} and {most} criteria.

Reply with one JSON object and nothing else:
{{"criteria": [{{"criterion": "<one check>", "weight": <{weight}>}}, ...]}}"""

_WEIGHTS = {  # the weight convention each format term rewards: (the instruction, the placeholder of the template)
    "schema": ("Give each criterion a weight: 3 = essential, 2 = important, 1 = helpful.", "1-3"),
    "count_weights": (("Give each criterion a positive weight, its share of the whole: the weights add up to 1 "
                       "(for example 0.5, 0.3 and 0.2)."), "share"),
}

_FENCE = re.compile(r"^\s*```(?:json|JSON)?\s*(.*?)\s*```\s*$", re.DOTALL)


def rubric_schema(max_criteria: int, *, max_chars: int) -> dict[str, Any]:
    """JSON schema of a rubric reply (structured output for backends that have it)."""
    return {
        "type": "object",
        "properties": {
            "criteria": {
                "type": "array", "minItems": 1, "maxItems": max_criteria,
                "items": {
                    "type": "object",
                    "properties": {"criterion": {"type": "string", "minLength": 1, "maxLength": max_chars},
                                   "weight": {"type": "number", "exclusiveMinimum": 0, "maximum": MAX_WEIGHT}},
                    "required": ["criterion", "weight"],
                    "additionalProperties": False,
                },
            },
        },
        "required": ["criteria"],
        "additionalProperties": False,
    }


def generator_messages(question: str, steps: Sequence[Step], max_criteria: int,
                       observation_chars: int = 400, *, max_chars: int,
                       format_reward: str = "schema") -> list[Message]:
    """The generator's prompt for the next step after ``steps`` (the history as the council saw it); its weight
    convention and number of criteria are the ones ``format_reward`` (``rubric_generator.format_reward``) rewards."""
    history = render_prefix(steps, observation_chars).strip() or "(nothing yet: the next action is the first one)"
    weights, weight = _WEIGHTS[format_reward]
    least = 1 if format_reward == "schema" else min(COUNT_RANGE[0], max_criteria)
    most = max_criteria if format_reward == "schema" else max(least, min(COUNT_RANGE[1], max_criteria))
    return [system(SYSTEM_PROMPT.format(max_chars=max_chars, weights=weights, weight=weight, least=least, most=most)),
            user(f"Question:\n{question}\n\nWhat the agent has done so far:\n{history}\n\n"
                 "Write the checklist for the agent's next action.")]


@dataclass(frozen=True)
class ParsedRubric:
    """The outcome of :func:`parse_rubric`: a rubric or the reason there is none."""

    rubric: Rubric | None
    error: str | None = None
    exact: bool = False  # the reply was the JSON object alone (fence allowed)
    raw_weights: tuple[float, ...] = ()  # the weights as written, before they are normalised to sum to 1

    @property
    def ok(self) -> bool:
        return self.rubric is not None

    @property
    def format_score(self) -> float:
        return 0.0 if self.rubric is None else 1.0 if self.exact else 0.5


def _objects(text: str) -> list[tuple[dict, bool]]:
    """JSON objects in ``text`` with whether each one is the whole reply."""
    fenced = _FENCE.match(text)
    body = fenced.group(1) if fenced else text
    decoder, found = json.JSONDecoder(), []
    for start in (i for i, ch in enumerate(body) if ch == "{"):
        try:
            obj, end = decoder.raw_decode(body, start)
        except json.JSONDecodeError:
            continue
        if isinstance(obj, dict):
            found.append((obj, not body[:start].strip() and not body[end:].strip()))
    return found


def _criteria(obj: dict, max_criteria: int, max_chars: int) -> list[Criterion] | str:
    extra = set(obj) - {"criteria"}
    if extra:
        return f"unexpected key {min(extra)!r} (only 'criteria' is allowed)"
    items = obj.get("criteria")
    if not isinstance(items, list):
        return "'criteria' must be a list"
    if not 1 <= len(items) <= max_criteria:
        return f"{len(items)} criteria (expected 1 to {max_criteria})"
    out = []
    for i, item in enumerate(items):
        if not isinstance(item, dict) or set(item) != {"criterion", "weight"}:
            return f"criterion {i + 1}: expected exactly the keys 'criterion' and 'weight'"
        text, weight = item["criterion"], item["weight"]
        if not isinstance(text, str) or not text.strip():
            return f"criterion {i + 1}: 'criterion' must be a non-empty string"
        if len(text) > max_chars:
            return f"criterion {i + 1}: {len(text)} characters (at most {max_chars})"
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not 0 < weight <= MAX_WEIGHT:
            return f"criterion {i + 1}: 'weight' must be a number in (0, {MAX_WEIGHT:g}], got {weight!r}"
        out.append(Criterion(text=" ".join(text.split()), weight=float(weight)))
    return out


def _normalised(criteria: list[Criterion]) -> list[Criterion]:
    total = sum(c.weight for c in criteria)
    return [c.model_copy(update={"weight": c.weight / total}) for c in criteria]


def parse_rubric(text: str, max_criteria: int, source: str = "", *, max_chars: int) -> ParsedRubric:
    """The first JSON object of ``text`` that holds ``criteria`` is the rubric; it must validate strictly."""
    if not text or not text.strip():
        return ParsedRubric(None, "empty reply")
    candidates = [(obj, whole) for obj, whole in _objects(text) if "criteria" in obj]
    if not candidates:
        return ParsedRubric(None, "no JSON object with 'criteria' in the reply")
    obj, whole = candidates[0]
    criteria = _criteria(obj, max_criteria, max_chars)
    if isinstance(criteria, str):
        return ParsedRubric(None, criteria)
    return ParsedRubric(Rubric(criteria=_normalised(criteria), source=source, raw=text), exact=whole,
                        raw_weights=tuple(c.weight for c in criteria))


def render_rubric(rubric: Rubric) -> str:
    """Numbered criteria with their weights, as agents, evaluators and verifiers are shown them (the criteria
    are the generator's words: :func:`~components.judges.render.untrusted`)."""
    return "\n".join(f"{i}. (weight {c.weight:.2f}) {untrusted(c.text)}"
                     for i, c in enumerate(rubric.criteria, start=1))


@dataclass
class GeneratedRubric:
    """One generator call: the rubric, or why there is none (a failed call or an unparseable reply)."""

    rubric: Rubric | None
    raw: str = ""
    error: str | None = None
    call_failed: bool = False
    prompt_tokens: int = 0
    completion_tokens: int = 0

    @property
    def ok(self) -> bool:
        return self.rubric is not None


class RubricGenerator:
    """The ``rubric_generator`` role behind the strict format; counts its calls, failed calls and bad replies."""

    def __init__(self, model: ChatModel, *, max_criteria: int = 4, temperature: float = 0.7, top_p: float = 0.95,
                 max_tokens: int = 256, observation_chars: int = 400, max_chars: int, format_reward: str = "schema"):
        self.model, self.max_criteria, self.max_chars = model, max_criteria, max_chars
        self.format_reward = format_reward  # the prompt asks for what the generator's format term rewarded
        self.temperature, self.top_p, self.max_tokens = temperature, top_p, max_tokens
        self.observation_chars = observation_chars
        self.calls = self.failed_calls = self.unparsed = 0

    def sampling(self, seed: int | None = None) -> Sampling:
        return Sampling(temperature=self.temperature, top_p=self.top_p, max_tokens=self.max_tokens, seed=seed,
                        json_schema=rubric_schema(self.max_criteria, max_chars=self.max_chars))

    async def generate(self, question: str, steps: Sequence[Step], seed: int | None = None) -> GeneratedRubric:
        self.calls += 1
        messages = generator_messages(question, steps, self.max_criteria, self.observation_chars,
                                      max_chars=self.max_chars, format_reward=self.format_reward)
        out = await self.model.chat(messages, self.sampling(seed))
        if not out.ok:
            self.failed_calls += 1
            return GeneratedRubric(None, error=f"generator call failed: {out.error_type}: {out.message}",
                                   call_failed=True)
        parsed = parse_rubric(out.text, self.max_criteria, source=getattr(self.model, "role", self.model.name),
                              max_chars=self.max_chars)
        if not parsed.ok:
            self.unparsed += 1
        return GeneratedRubric(parsed.rubric, out.text, parsed.error, prompt_tokens=out.prompt_tokens,
                               completion_tokens=out.completion_tokens)
