"""Co-ReAct's independent verifier (paper 3.3, "Verify"): before a proposed action runs, the ``verifier`` role
checks it against the step's rubric, ``{"verdicts": [{"satisfied": true, "reason": "..."}, ...]}`` (or, with
``coreact.verifier_mode: criterion``, one yes/no question per criterion, the rubric evaluator's criterion mode:
why it is the embedded default, docs/methods/coreact.md). The step is accepted when the weighted fraction of
satisfied criteria (from probabilities with ``llm.scoring: {verifier: probability}``: the weighted mean
probability of yes) exceeds ``tau``; otherwise the failed criteria and their reasons become the retry's feedback. A
failed call or an unparseable reply is a failed verification (``Verification.failed``), which the agent records and
never turns into a rejection.

    v = await verify_action(pool.role("verifier"), question, prefix_text, thought, action, rubric, tau=0.5)
    v.accepted, v.fraction, v.feedback()
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from components.judges.call import JudgeCall, Tally, ask, reasons
from components.judges.render import untrusted
from components.llm.base import ChatModel, Message, Sampling, system, user
from components.llm.json_reply import NoJSONObject, outer_json
from components.methods.coreact.params import VerifierMode
from components.methods.coreact.rubric_eval import evaluate_criteria, weighted_fraction
from components.methods.coreact.rubric_generator import render_rubric
from components.schemas import Rubric

__all__ = ["Verification", "VerifierMode", "parse_verdicts", "verdicts_schema", "verifier_messages", "verify_action"]

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
    reasoning = untrusted(" ".join(thought.split())) or "(none given)"
    return [system(SYSTEM_PROMPT), user(
        f"Question:\n{question}\n\nWhat the agent has done so far:\n{history}\n\n"
        f"Agent's reasoning: {reasoning}\nProposed action: {untrusted(' '.join(action.split()))}\n\n"
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
    no verdicts) when the verifier failed. ``calls`` and ``failed_calls`` count its LLM calls (one per criterion
    in criterion mode), ``unparsed`` its replies that were no verdict: a failed verification records each of its
    failed calls by kind, not only the first one's reason (``error``)."""

    rubric: Rubric
    satisfied: list[bool] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)
    fraction: float | None = None
    accepted: bool | None = None
    error: str | None = None
    calls: int = 1
    failed_calls: int = 0
    unparsed: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0

    @property
    def failed(self) -> bool:
        return self.error is not None

    @property
    def call_failed(self) -> bool:
        """A call failed after the middleware's retries (not merely an unusable reply)."""
        return self.failed_calls > 0

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
                        rubric: Rubric, *, tau: float, max_tokens: int = 256,
                        mode: VerifierMode = "checklist", tally_out: Tally | None = None) -> Verification:
    """``tally_out``, when given, also counts the verification's calls (the judge bench's per-judgment count)."""
    if mode == "criterion":
        return await _verify_by_criterion(verifier, question, prefix_text, action, rubric, tau=tau,
                                          tally_out=tally_out)
    n = len(rubric.criteria)
    call = JudgeCall(verifier_messages(question, prefix_text, thought, action, rubric),
                     reasons(lambda text: parse_verdicts(text, n)), Sampling(temperature=0.0, max_tokens=max_tokens),
                     schema=verdicts_schema(n))
    tally = Tally()
    result = await ask(verifier, call, tally)
    if tally_out is not None:
        tally_out.merge(tally)
    if not result.ok:
        error = f"verifier call failed: {result.describe()}" if result.kind == "call_failed" else result.reason
        return Verification(rubric, error=error, **_counts(tally))
    flags, why = result.value
    fraction = weighted_fraction(rubric, flags)
    return Verification(rubric, flags, why, fraction, fraction > tau, **_counts(tally))


def _counts(tally: Tally) -> dict[str, int]:
    return {"calls": tally.calls, "failed_calls": tally.failures, "unparsed": tally.unparsed,
            "prompt_tokens": tally.prompt_tokens, "completion_tokens": tally.completion_tokens}


async def _verify_by_criterion(verifier: ChatModel, question: str, prefix_text: str, action: str, rubric: Rubric,
                               *, tau: float, tally_out: Tally | None = None) -> Verification:
    """One yes/no call per criterion; the reasoning is not shown (the evaluator judges the action itself)."""
    tally = Tally()
    [score] = await evaluate_criteria(verifier, question, prefix_text, [action], rubric, tally=tally)
    if tally_out is not None:
        tally_out.merge(tally)
    counts = _counts(tally)
    if score.score is None:
        return Verification(rubric, error=score.error, **counts)
    flags = list(score.satisfied)
    return Verification(rubric, flags, [""] * len(flags), score.score, score.score > tau, **counts)
