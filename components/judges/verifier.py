"""Co-ReAct's independent verifier (paper 3.3, "Verify"): before a proposed action runs, the ``verifier`` role
checks it against the step's rubric and returns a verdict and a short reason per criterion::

    {"verdicts": [{"satisfied": true, "reason": "looks up the director"},
                  {"satisfied": false, "reason": "repeats the search of step 1"}]}

The step is accepted when the weighted fraction of satisfied criteria exceeds ``tau``; otherwise the failed
criteria and their reasons become the feedback of the retry. A failed call or an unparseable reply is a
failed verification (``Verification.failed``), which the agent records and does not turn into a rejection.

    v = await verify_action(pool.role("verifier"), question, prefix_text, thought, action, rubric, tau=0.5)
    v.accepted, v.fraction, v.feedback()
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from components.coreact.rubric_generator import render_rubric
from components.judges.rubric_eval import weighted_fraction
from components.llm.base import ChatModel, Message, Sampling, system, user
from components.llm.json_reply import NoJSONObject, outer_json
from components.schemas import Rubric

__all__ = ["Verification", "parse_verdicts", "verdicts_schema", "verifier_messages", "verify_action"]

SYSTEM_PROMPT = (
    "You review a research agent's proposed next action before it is carried out. The agent answers questions "
    "by searching an encyclopedia (search[words]), reading paragraphs (browse[doc_id]) and answering "
    "(finish[answer]). You are given the question, the history, the agent's reasoning and proposed action, "
    "and a numbered checklist the action should meet. For every criterion, in order, say whether the "
    "proposed action satisfies it and give a reason of at most one sentence (for an unmet criterion, say "
    "what the action should do instead). Reply with one JSON object and nothing else: "
    '{"verdicts": [{"satisfied": true or false, "reason": "..."}, ...]}'
)


def verdicts_schema(n: int) -> dict:
    item = {"type": "object", "properties": {"satisfied": {"type": "boolean"}, "reason": {"type": "string"}},
            "required": ["satisfied", "reason"], "additionalProperties": False}
    return {"type": "object",
            "properties": {"verdicts": {"type": "array", "minItems": n, "maxItems": n, "items": item}},
            "required": ["verdicts"], "additionalProperties": False}


def verifier_messages(question: str, prefix_text: str, thought: str, action: str, rubric: Rubric) -> list[Message]:
    history = prefix_text.strip() or "(nothing yet: this is the first action)"
    reasoning = " ".join(thought.split()) or "(none given)"
    return [system(SYSTEM_PROMPT), user(
        f"Question:\n{question}\n\nWhat the agent has done so far:\n{history}\n\n"
        f"Agent's reasoning: {reasoning}\nProposed action: {' '.join(action.split())}\n\n"
        f"Checklist ({len(rubric.criteria)} criteria):\n{render_rubric(rubric)}"
    )]


def parse_verdicts(text: str, n: int) -> tuple[list[bool], list[str]] | str:
    """(satisfied flags, reasons), one per criterion, or a one-line reason the reply is unusable."""
    try:
        obj = outer_json(text)
    except NoJSONObject as exc:
        return str(exc)
    except json.JSONDecodeError as exc:
        return f"invalid JSON: {exc.msg}"
    items = obj.get("verdicts") if isinstance(obj, dict) else None
    if not isinstance(items, list):
        return "'verdicts' must be a list"
    if len(items) != n:
        return f"{len(items)} verdicts for {n} criteria"
    flags, reasons = [], []
    for i, item in enumerate(items):
        if not isinstance(item, dict) or not isinstance(item.get("satisfied"), bool):
            return f"verdict {i + 1}: 'satisfied' must be true or false"
        reason = item.get("reason", "")
        flags.append(item["satisfied"])
        reasons.append(" ".join(reason.split()) if isinstance(reason, str) else "")
    return flags, reasons


@dataclass
class Verification:
    """One verification: per-criterion verdicts, their weighted fraction and the decision; ``error`` set (and
    no verdicts) when the verifier failed."""

    rubric: Rubric
    satisfied: list[bool] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)
    fraction: float | None = None
    accepted: bool | None = None
    error: str | None = None
    call_failed: bool = False
    prompt_tokens: int = 0
    completion_tokens: int = 0

    @property
    def failed(self) -> bool:
        return self.error is not None

    def feedback(self) -> str:
        """The unmet criteria with the verifier's reasons, as the retry is shown them."""
        lines = []
        for i, (c, ok, why) in enumerate(zip(self.rubric.criteria, self.satisfied, self.reasons), start=1):
            if not ok:
                lines.append(f"- criterion {i} ({c.text}) not met" + (f": {why}" if why else ""))
        return "\n".join(lines)

    def record(self) -> dict:
        """What the trajectory keeps of it."""
        return {"satisfied": self.satisfied, "reasons": self.reasons, "fraction": self.fraction,
                "accepted": self.accepted, "error": self.error}


async def verify_action(verifier: ChatModel, question: str, prefix_text: str, thought: str, action: str,
                        rubric: Rubric, *, tau: float, max_tokens: int = 256) -> Verification:
    n = len(rubric.criteria)
    sampling = Sampling(temperature=0.0, max_tokens=max_tokens, json_schema=verdicts_schema(n))
    outcome = await verifier.chat(verifier_messages(question, prefix_text, thought, action, rubric), sampling)
    if not outcome.ok:
        return Verification(rubric, error=f"verifier call failed: {outcome.error_type}: {outcome.message}",
                            call_failed=True)
    parsed = parse_verdicts(outcome.text, n)
    if isinstance(parsed, str):
        return Verification(rubric, error=parsed, prompt_tokens=outcome.prompt_tokens,
                            completion_tokens=outcome.completion_tokens)
    flags, reasons = parsed
    fraction = weighted_fraction(rubric, flags)
    return Verification(rubric, flags, reasons, fraction, fraction > tau, prompt_tokens=outcome.prompt_tokens,
                        completion_tokens=outcome.completion_tokens)
