"""ARBOR's pairwise process judge (paper 3.4): which of two trajectories better meets one rubric, as
win / tie / loss, over the edges of the sparse graph of :mod:`components.methods.arbor.pairwise_graph`.

Each call shows the pair in an order drawn from a seeded generator keyed on (seed, step, group, rubric,
edge), so the judge's position bias averages out and a rerun asks the same questions. All edges of a group
run concurrently (the middleware bounds the concurrency). Each is a judgment call
(:mod:`components.judges.call`): one that fails after the middleware's retries, or whose reply does not parse,
removes its edge and is counted by kind in the group's tally; the trajectory scores come from the judged edges
only (:func:`components.methods.arbor.pairwise_graph.edge_scores`). The winner is a declared choice
(:data:`WINNER`): with ``llm.scoring`` set to ``probability`` for the judge's role, an edge's outcome is the
expectation over A / B / TIE (1, 0, 0.5) read from the label token's probabilities instead of the sampled
label's value, so a hesitant A counts less than a sure one.

    result = await score_group(judge, question, texts, edges, rubric, key="1234:3:0:c7")
    result.scores         # per trajectory: mean over judged edges, or None
    result.tally.calls    # judge calls, failures, unparsed replies, tokens
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Sequence
from dataclasses import dataclass, field

from components.judges.call import Choice, JudgeCall, Tally, ask
from components.judges.render import untrusted
from components.llm.base import ChatModel, Message, Sampling, system, user
from components.llm.json_reply import NoJSONObject, outer_json
from components.methods.arbor.memory import RubricText
from components.methods.arbor.pairwise_graph import Edge, edge_scores
from components.schemas import Question

__all__ = ["WINNER", "GroupScores", "judge_messages", "parse_winner", "reference_facts", "score_group"]

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


async def _judge_edge(judge: ChatModel, question: str, texts: Sequence[str], edge: Edge, rubric: RubricText,
                      swap: bool, sampling: Sampling, tally: Tally) -> float | None:
    i, j = edge
    first, second = (j, i) if swap else (i, j)
    call = JudgeCall(judge_messages(question, texts[first], texts[second], rubric), parse_winner, sampling,
                     schema=WINNER_SCHEMA, choice=WINNER)
    result = await ask(judge, call, tally)
    if not result.ok:
        return None
    value = result.expected  # result of the trajectory shown as A (the sampled label's value, scored from text)
    return 1.0 - value if swap else value


async def score_group(judge: ChatModel, question: str, texts: Sequence[str], edges: Sequence[Edge],
                      rubric: RubricText, key: str, max_tokens: int = 32) -> GroupScores:
    """Judge every edge concurrently; A/B order per edge from ``random.Random(f"{key}:{i}:{j}")``."""
    sampling = Sampling(temperature=0.0, max_tokens=max_tokens)
    tally = Tally()
    swaps = [random.Random(f"{key}:{i}:{j}").random() < 0.5 for i, j in edges]
    values = await asyncio.gather(*(_judge_edge(judge, question, texts, e, rubric, s, sampling, tally)
                                    for e, s in zip(edges, swaps, strict=True)))
    outcomes = dict(zip(edges, values, strict=True))
    return GroupScores(edge_scores(len(texts), outcomes), outcomes, tally)
