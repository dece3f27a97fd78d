"""ARBOR's pairwise process judge (paper 3.4): which of two trajectories better meets one rubric, as win / tie /
loss, over the edges of the sparse graph of :mod:`components.methods.arbor.pairwise_graph`. Each edge shows the pair
in an order drawn from a seeded generator keyed on (seed, step, group, rubric, edge), so position bias averages out
and a rerun asks the same questions; all edges of a group run concurrently. Each is a judgment call
(:mod:`components.judges.call`): one that fails or does not parse removes its edge and is counted, and the
trajectory scores come from the judged edges only. With ``llm.scoring: probability`` an edge's outcome is the
expectation over A / B / TIE read from the label's probabilities. Three forms of an edge (:func:`score_group`;
why the embedded default is not the paper's: docs/methods/arbor.md), each optionally shown
:func:`reference_facts` (training rollouts only, never a test-time answer).

    result = await score_group(judge, question, texts, edges, rubric, key="1234:3:0:c7")
    result.scores         # per trajectory: mean over judged edges, or None
    result.tally.calls    # judge calls, failures, unparsed replies, tokens
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Sequence
from dataclasses import dataclass, field

from components.judges.call import Choice, JudgeCall, Tally, Unparsed, ask
from components.judges.render import untrusted
from components.llm.base import ChatModel, Message, Sampling, system, user
from components.llm.json_reply import NoJSONObject, outer_json
from components.methods.arbor.memory import RubricText
from components.methods.arbor.pairwise_graph import Edge, edge_scores
from components.schemas import Question

__all__ = ["FORMS", "MEETS", "WINNER", "EdgeVerdict", "GroupScores", "ask_edge", "ask_single", "judge_messages",
           "parse_meets", "parse_winner", "reference_facts", "score_group", "single_messages", "verdict_messages"]

FORMS = ("winner", "verdicts", "single")

JUDGE_SYSTEM = (
    "You compare two attempts by a search agent at the same question. Each attempt lists its turns: what "
    "it thought, the search or browse action it took, what came back, and how it ended. Judge them on the "
    "one criterion you are given and on nothing else; the correctness of the final answer is scored "
    "elsewhere. An attempt whose output could not be read, that stopped without an answer, or that broke "
    "the action format counts against itself whenever the criterion concerns how the search was carried "
    "out or concluded.\n"
    'Reply with JSON only: {"winner": "A"} when attempt A clearly meets the criterion better, '
    '{"winner": "B"} when attempt B does, and {"winner": "TIE"} when both meet it fully, both miss it, '
    "or you cannot tell them apart on it."
)
WINNER_SCHEMA = {
    "type": "object",
    "properties": {"winner": {"type": "string", "enum": ["A", "B", "TIE"]}},
    "required": ["winner"],
    "additionalProperties": False,
}
_OUTCOME = {"A": 1.0, "B": 0.0, "TIE": 0.5}
WINNER = Choice(_OUTCOME, field="winner")
"""The verdict's label (the ``winner`` field, or a bare label) and the result it means for attempt A."""

VERDICT_SYSTEM = (
    "You check attempts by a search agent at the same question against one criterion. Each attempt lists its "
    "turns: what it thought, the search or browse action it took, what came back, and how it ended. Two "
    "attempts are shown so that you can see how they differ; you will be asked about one of them. Read that "
    "attempt turn by turn and decide whether it meets the criterion as the strong attempt does, or falls into "
    "the weak attempt's description. An attempt that stopped without an answer, or that answered something its "
    "turns do not support, does not meet a criterion about reaching the answer.\n"
    "Reply with the single word yes or no."
)
SINGLE_SYSTEM = (
    "You check one attempt by a search agent at a question against one criterion. The attempt lists its turns: "
    "what it thought, the search or browse action it took, what came back, and how it ended. Read it turn by "
    "turn and decide whether it meets the criterion as the strong attempt does, or falls into the weak "
    "attempt's description. An attempt that stopped without an answer, or that answered something its turns "
    "do not support, does not meet a criterion about reaching the answer.\n"
    "Reply with the single word yes or no."
)
MEETS = Choice({"yes": 1.0, "no": 0.0}, label=lambda meets: "yes" if meets else "no")
"""The verdicts form's answer: the reply's first word, yes (the attempt meets the criterion) or no."""


@dataclass
class GroupScores:
    scores: list[float | None]
    outcomes: dict[Edge, float | None] = field(default_factory=dict)  # first end's result; None: removed edge
    tally: Tally = field(default_factory=Tally)

    @property
    def removed_edges(self) -> int:
        return sum(v is None for v in self.outcomes.values())


def reference_facts(question: Question) -> str:
    """The question's gold answer and the facts of its chain, one per line, as a reference-guided judge is shown
    them (the policy never is)."""
    lines = [f"Correct answer: {' / '.join(question.answers)}"]
    lines += [f"Fact {n}: {hop.question} {hop.answer}" for n, hop in enumerate(question.gold_chain, 1)]
    return "\n".join(lines)


def judge_messages(question: str, text_a: str, text_b: str, rubric: RubricText,
                   reference: str | None = None) -> list[Message]:
    """The pair (each a :func:`~components.judges.render.trajectory_text`) and the rubric, its text
    :func:`~components.judges.render.untrusted` (an inducer wrote it from trajectories). ``reference``
    (:func:`reference_facts`) adds the gold answer and facts, for a judge of training rollouts only."""
    notes = (f"Reference notes, for you only (the attempts never saw them):\n{reference.strip()}\n\n"
             if reference else "")  # after the attempts: a server's prompt cache keeps them when only notes differ
    return [system(JUDGE_SYSTEM), user(
        f"Question:\n{question}\n\n"
        f"Attempt A:\n{text_a}\n\n"
        f"Attempt B:\n{text_b}\n\n{notes}"
        f"Criterion: {untrusted(rubric.title)}\n"
        f"A strong attempt: {untrusted(rubric.description)}\n"
        f"A weak attempt: {untrusted(rubric.counter_description)}"
    )]


def verdict_messages(question: str, text_a: str, text_b: str, rubric: RubricText, about: str,
                     reference: str | None = None) -> list[Message]:
    """The verdicts form's prompt: :func:`judge_messages`' content under :data:`VERDICT_SYSTEM`, ending with the
    question about attempt ``about`` ("A" or "B"), so the two calls of an edge differ in their last line only."""
    if about not in ("A", "B"):
        raise ValueError(f"a verdict is about attempt A or B, not {about!r}")
    content = judge_messages(question, text_a, text_b, rubric, reference)[1].content
    return [system(VERDICT_SYSTEM), user(f"{content}\n\nDoes attempt {about} meet the criterion? Answer yes or no.")]


def single_messages(question: str, text: str, rubric: RubricText, reference: str | None = None) -> list[Message]:
    """The single form's prompt: one attempt, the criterion (and ``reference`` when given), then the question."""
    notes = (f"Reference notes, for you only (the attempt never saw them):\n{reference.strip()}\n\n"
             if reference else "")
    return [system(SINGLE_SYSTEM), user(
        f"Question:\n{question}\n\nAttempt:\n{text}\n\n{notes}"
        f"Criterion: {untrusted(rubric.title)}\n"
        f"A strong attempt: {untrusted(rubric.description)}\n"
        f"A weak attempt: {untrusted(rubric.counter_description)}\n\n"
        "Does the attempt meet the criterion? Answer yes or no.")]


def parse_meets(text: str) -> bool:
    """The reply's first word as a verdict, yes or no (case, quotes and punctuation ignored); :class:`Unparsed`
    with the reply's start otherwise."""
    words = (text or "").split()
    first = words[0].strip("\"'`*.,:;!()[]{}").casefold() if words else ""
    if first not in ("yes", "no"):
        raise Unparsed(f"reply does not start with yes or no: {(text or '').strip()[:40]!r}")
    return first == "yes"


def parse_winner(text: str) -> str | None:
    """'A', 'B' or 'TIE' from a JSON reply (or a reply that is only the label); None otherwise."""
    try:
        value = outer_json(text)
    except NoJSONObject:
        bare = text.strip().strip("\"'`.").upper()
        return bare if bare in _OUTCOME else None
    except ValueError:
        return None
    winner = value.get("winner") if isinstance(value, dict) else None
    return winner.strip().upper() if isinstance(winner, str) and winner.strip().upper() in _OUTCOME else None


@dataclass(frozen=True)
class EdgeVerdict:
    """One edge's judgment, in the shown order: ``winner`` ("A", "B", "TIE"), ``expected`` (the result for the
    attempt shown as A), and in the verdicts form whether each attempt meets the criterion; or, when a call
    failed or its reply did not parse, ``failure`` (its kind) and the rest None. ``replies``: the judge's texts."""

    winner: str | None
    expected: float | None
    meets: tuple[bool, bool] | None = None
    failure: str | None = None
    replies: tuple[str, ...] = ()
    label_probs: dict[str, float] | None = None


def _winner_of(meets_a: bool, meets_b: bool) -> str:
    return "A" if meets_a and not meets_b else ("B" if meets_b and not meets_a else "TIE")


async def ask_single(judge: ChatModel, question: str, text: str, rubric: RubricText, sampling: Sampling,
                     tally: Tally, reference: str | None = None, memo: dict | None = None):
    """The single form's verdict on one attempt (a :class:`~components.judges.call.Verdict` of a bool, or a
    :class:`~components.judges.call.Failure`); ``memo``, when given, keeps each attempt's judgment (keyed on
    its text and the reference), so an attempt in several edges is asked once."""
    key = (text, reference)
    if memo is not None and key in memo:
        return memo[key]
    call = JudgeCall(single_messages(question, text, rubric, reference), parse_meets, sampling, choice=MEETS)
    result = await ask(judge, call, tally)
    if memo is not None:
        memo[key] = result
    return result


async def ask_edge(judge: ChatModel, question: str, text_a: str, text_b: str, rubric: RubricText,
                   sampling: Sampling, tally: Tally, form: str = "winner",
                   reference: str | None = None, memo: dict | None = None) -> EdgeVerdict:
    """One edge in the shown order, in ``form`` (:func:`score_group`); calls are counted in ``tally``; ``memo`` keeps
    the single form's per-attempt judgments across edges."""
    if form == "winner":
        call = JudgeCall(judge_messages(question, text_a, text_b, rubric, reference), parse_winner, sampling,
                         schema=WINNER_SCHEMA, choice=WINNER)
        result = await ask(judge, call, tally)
        if not result.ok:
            return EdgeVerdict(None, None, failure=result.kind, replies=tuple(filter(None, [result.reply])))
        return EdgeVerdict(result.value, result.expected, replies=(result.text,),
                           label_probs=dict(result.label_probs) if result.label_probs else None)
    if form not in FORMS:
        raise ValueError(f"unknown pairwise judge form {form!r}; known: {', '.join(FORMS)}")
    results = []
    for about, text in (("A", text_a), ("B", text_b)):  # in turn: the second reuses the first's prompt cache
        if form == "single":
            result = await ask_single(judge, question, text, rubric, sampling, tally, reference, memo)
        else:
            call = JudgeCall(verdict_messages(question, text_a, text_b, rubric, about, reference), parse_meets,
                             sampling, choice=MEETS)
            result = await ask(judge, call, tally)
        if not result.ok:
            return EdgeVerdict(None, None, failure=result.kind,
                               replies=tuple(r.text for r in results) + tuple(filter(None, [result.reply])))
        results.append(result)
    a, b = results
    return EdgeVerdict(_winner_of(a.value, b.value), (1.0 + a.expected - b.expected) / 2, (a.value, b.value),
                       replies=(a.text, b.text))


async def _judge_edge(judge: ChatModel, question: str, texts: Sequence[str], edge: Edge, rubric: RubricText,
                      swap: bool, sampling: Sampling, tally: Tally, form: str,
                      reference: str | None, memo: dict | None) -> float | None:
    i, j = edge
    first, second = (j, i) if swap else (i, j)
    verdict = await ask_edge(judge, question, texts[first], texts[second], rubric, sampling, tally, form, reference,
                             memo)
    if verdict.expected is None:
        return None
    value = verdict.expected  # result of the trajectory shown as A
    return 1.0 - value if swap else value


async def score_group(judge: ChatModel, question: str, texts: Sequence[str], edges: Sequence[Edge],
                      rubric: RubricText, key: str, max_tokens: int = 32, form: str = "winner",
                      reference: str | None = None) -> GroupScores:
    """Judge every edge concurrently, in ``form``, with ``reference`` shown when given; A/B order per edge from
    ``random.Random(f"{key}:{i}:{j}")``. ``winner`` (the paper's): one call naming the winner or TIE. ``verdicts``:
    the same prompt, then one yes/no per attempt ("does attempt A meet the criterion?", :data:`MEETS`; two calls
    sharing the prompt up to the last line), the edge won by the attempt that meets it when the other does not,
    tied otherwise; from probabilities its outcome is ``(1 + P(A meets) - P(B meets)) / 2``. ``single``: the same
    yes/no with each attempt shown alone (:func:`single_messages`), asked once per attempt and read by every edge
    that holds it (K calls a group), so there is no position to follow."""
    if form not in FORMS:
        raise ValueError(f"unknown pairwise judge form {form!r}; known: {', '.join(FORMS)}")
    sampling = Sampling(temperature=0.0, max_tokens=max_tokens)
    tally = Tally()
    memo: dict | None = None
    if form == "single":  # one verdict per attempt, asked up front, then read by every edge that holds it
        memo = {}
        used = sorted({n for e in edges for n in e})
        await asyncio.gather(*(ask_single(judge, question, texts[n], rubric, sampling, tally, reference, memo)
                               for n in used))
    swaps = [random.Random(f"{key}:{i}:{j}").random() < 0.5 for i, j in edges]
    values = await asyncio.gather(*(_judge_edge(judge, question, texts, e, rubric, s, sampling, tally, form,
                                                reference, memo)
                                    for e, s in zip(edges, swaps, strict=True)))
    outcomes = dict(zip(edges, values, strict=True))
    return GroupScores(edge_scores(len(texts), outcomes), outcomes, tally)
