"""The pairwise judge over a group's graph: seeded A/B order per call mapped back correctly, concurrent
calls, failed and unreadable calls removing their edge (counted), never a 0."""

import asyncio
import json

import pytest

from components.methods.arbor.pairwise_judge import parse_winner, score_group
from components.llm.base import ChatModel, Completion
from components.methods.arbor.memory import RubricText
from components.methods.arbor.pairwise_graph import sparse_graph
from tests.arbor.helpers import COMMON, QualityJudge, qualities

RUBRIC = RubricText(**COMMON)
TEXTS = [f"Turn 1\nThought: quality={q}" for q in range(8)]
EDGES = sparse_graph([0.0] * 8)  # order 0..7: neighbours (i, i+1), diameters (i, i+4)


def run(judge, key="1234:1:0:c1", texts=TEXTS, edges=EDGES):
    return asyncio.run(score_group(judge, "Q?", texts, edges, RUBRIC, key))


def test_order_is_randomised_per_call_reproducibly_and_mapped_back():
    judge = QualityJudge()
    result = run(judge)
    shown_first = [qa for qa, _ in judge.seen]
    assert 0 < sum(qa > qb for qa, qb in judge.seen) < len(EDGES)  # both orders occur
    # whatever order the judge saw, the higher quality wins its edge: scores by hand
    assert result.scores == pytest.approx([0, 1 / 3, 1 / 3, 1 / 3, 2 / 3, 2 / 3, 2 / 3, 1])
    again = QualityJudge()
    run(again)
    assert [qa for qa, _ in again.seen] == shown_first
    other = QualityJudge()
    run(other, key="1234:2:0:c1")
    assert [qa for qa, _ in other.seen] != shown_first
    assert result.tally.calls == 11 and result.tally.failures == 0 and result.removed_edges == 0


def test_failed_and_unreadable_calls_remove_their_edges_and_are_counted():
    def fail(qa, qb):
        if 7 in (qa, qb) or {qa, qb} == {0, 1}:
            return "error"
        return "junk" if {qa, qb} == {2, 3} else None

    result = run(QualityJudge(fail))
    assert result.tally.calls == 11 and result.tally.failures == 3 and result.tally.unparsed == 1
    assert result.removed_edges == 4
    assert result.outcomes[(6, 7)] is None and result.outcomes[(2, 3)] is None
    # trajectory 7 lost both its edges: no score at all, not 0
    assert result.scores == pytest.approx([0, 0, 0.5, 0, 2 / 3, 2 / 3, 1, None])
    assert result.scores[7] is None


def test_calls_of_a_group_run_concurrently():
    class Slow(ChatModel):
        name = "slow"

        def __init__(self):
            self.now = self.peak = 0

        async def _complete(self, messages, sampling):
            self.now += 1
            self.peak = max(self.peak, self.now)
            await asyncio.sleep(0.01)
            self.now -= 1
            qa, qb = qualities(messages[-1].content)
            return Completion(texts=[json.dumps({"winner": "A" if qa > qb else "B"})], model="slow")

    judge = Slow()
    result = run(judge)
    assert judge.peak == len(EDGES) and result.scores[7] == 1.0


@pytest.mark.parametrize("text,winner", [
    ('{"winner": "A"}', "A"), ('Sure: {"winner": "tie"}', "TIE"), ("B", "B"), ('"TIE".', "TIE"),
    ('{"winner": "C"}', None), ("A is better", None), ('{"verdict": "A"}', None), ("{broken", None),
])
def test_verdict_parsing_is_strict(text, winner):
    assert parse_winner(text) == winner
