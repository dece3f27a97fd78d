"""ARBOR's pairwise judge in its verdicts form (a yes/no per attempt, both in view): the parser, the prompts (the
two calls of an edge differ in their last line; the reference only when given), the winner and the outcome
read from the two verdicts, from text and from probabilities, and failures that remove the edge."""

from __future__ import annotations

import asyncio
import math

import pytest

from components.judges.call import Tally, Unparsed
from components.llm.backends.scripted import ScriptedChatModel, WithLogprobs
from components.llm.base import Sampling, TokenLogprob
from components.methods.arbor.memory import RubricText
from components.methods.arbor.pairwise_judge import (
    ask_edge,
    parse_meets,
    reference_facts,
    score_group,
    single_messages,
    verdict_messages,
)
from components.schemas import Question, SubQuestion

RUBRIC = RubricText(title="Finds each hop", description="Looks up each entity.", counter_description="Skips one.")
SAMPLING = Sampling(temperature=0.0, max_tokens=8)


@pytest.mark.parametrize(("reply", "value"), [("yes", True), ("No.", False), ("**Yes**, it does", True),
                                              ('"no"', False), ("YES\n", True)])
def test_parse_meets_reads_the_first_word(reply, value):
    assert parse_meets(reply) is value


@pytest.mark.parametrize("reply", ["", "maybe", "I think yes", '{"winner": "A"}'])
def test_parse_meets_refuses_anything_else_with_a_reason(reply):
    with pytest.raises(Unparsed, match="does not start with yes or no"):
        parse_meets(reply)


def test_the_two_calls_of_an_edge_share_the_prompt_but_its_last_line():
    a = verdict_messages("Q?", "first attempt", "second attempt", RUBRIC, "A")
    b = verdict_messages("Q?", "first attempt", "second attempt", RUBRIC, "B")
    assert a[0].content == b[0].content and "yes or no" in a[0].content
    head_a, last_a = a[1].content.rsplit("\n", 1)
    head_b, last_b = b[1].content.rsplit("\n", 1)
    assert head_a == head_b and "attempt A" in last_a and "attempt B" in last_b
    assert "Reference notes" not in a[1].content
    with pytest.raises(ValueError, match="attempt A or B"):
        verdict_messages("Q?", "x", "y", RUBRIC, "C")


def test_reference_facts_hold_the_answer_and_each_hop():
    q = Question(id="q", question="Who is the mother's father of X?", answers=["Selath"], source="world",
                 gold_chain=[SubQuestion(question="Who is the mother of X?", answer="Alia", doc_id="d1"),
                             SubQuestion(question="Who is the father of Alia?", answer="Selath", doc_id="d2")])
    text = reference_facts(q)
    assert text.splitlines() == ["Correct answer: Selath", "Fact 1: Who is the mother of X? Alia",
                                 "Fact 2: Who is the father of Alia? Selath"]
    shown = verdict_messages("Q?", "x", "y", RUBRIC, "B", text)[1].content
    assert "Reference notes" in shown and shown.index("Attempt B:") < shown.index("Fact 2")


def _judge(meets_a: str, meets_b: str) -> ScriptedChatModel:
    return ScriptedChatModel(lambda m, s: meets_a if m[1].content.endswith(
        "Does attempt A meet the criterion? Answer yes or no.") else meets_b)


@pytest.mark.parametrize(("a", "b", "winner", "expected"), [("yes", "no", "A", 1.0), ("no", "yes", "B", 0.0),
                                                             ("yes", "yes", "TIE", 0.5), ("no", "no", "TIE", 0.5)])
def test_the_winner_is_the_attempt_that_alone_meets_the_criterion(a, b, winner, expected):
    tally = Tally()
    v = asyncio.run(ask_edge(_judge(a, b), "Q?", "x", "y", RUBRIC, SAMPLING, tally, form="verdicts"))
    assert (v.winner, v.expected, v.meets) == (winner, expected, (a == "yes", b == "yes"))
    assert tally.calls == 2 and v.failure is None


def test_an_unreadable_verdict_removes_the_edge():
    tally = Tally()
    v = asyncio.run(ask_edge(_judge("yes", "perhaps"), "Q?", "x", "y", RUBRIC, SAMPLING, tally, form="verdicts"))
    assert v.winner is None and v.expected is None and v.failure == "unparsed" and tally.unparsed == 1
    result = asyncio.run(score_group(_judge("maybe", "no"), "Q?", ["x", "y"], [(0, 1)], RUBRIC, key="k",
                                     form="verdicts"))
    assert result.scores == [None, None] and result.removed_edges == 1
    with pytest.raises(ValueError, match="unknown pairwise judge form"):
        asyncio.run(score_group(_judge("yes", "no"), "Q?", ["x", "y"], [(0, 1)], RUBRIC, key="k", form="vote"))


def test_score_group_in_the_verdicts_form_credits_the_attempt_that_meets_it():
    # trajectory 0's text is "good": the judge says yes about whichever position shows it
    def reply(messages, sampling):
        content = messages[1].content
        about = content.rsplit("Does attempt ", 1)[1][0]
        shown = content.split(f"Attempt {about}:\n", 1)[1].split("\n", 1)[0]
        return "yes" if shown == "good" else "no"

    result = asyncio.run(score_group(ScriptedChatModel(reply), "Q?", ["good", "bad", "bad"], [(0, 1), (0, 2)],
                                     RUBRIC, key="k", form="verdicts"))
    assert result.scores == [1.0, 0.0, 0.0] and result.tally.calls == 4


def test_probability_scoring_gives_the_difference_of_the_yes_probabilities():
    def tokens(p_yes):
        return WithLogprobs("yes", [TokenLogprob(token="yes", logprob=math.log(p_yes), top=(("yes", math.log(p_yes)),
                                                                           ("no", math.log(1 - p_yes))))])

    judge = ScriptedChatModel(lambda m, s: tokens(0.9) if m[1].content.endswith(
        "Does attempt A meet the criterion? Answer yes or no.") else tokens(0.6))
    judge.scoring = "probability"
    v = asyncio.run(ask_edge(judge, "Q?", "x", "y", RUBRIC, SAMPLING, Tally(), form="verdicts"))
    assert v.winner == "TIE" and v.expected == pytest.approx((1 + 0.9 - 0.6) / 2)


def test_the_single_form_shows_one_attempt_and_asks_each_once():
    def reply(messages, sampling):
        assert "Attempt A" not in messages[1].content and "Attempt:\n" in messages[1].content
        return "yes" if "Attempt:\ngood\n" in messages[1].content else "no"

    judge = ScriptedChatModel(reply)
    result = asyncio.run(score_group(judge, "Q?", ["good", "bad", "bad2"], [(0, 1), (0, 2), (1, 2)], RUBRIC,
                                     key="k", form="single"))
    assert result.scores == [1.0, 0.25, 0.25] and result.tally.calls == 3    # one call per attempt, not per edge
    memo: dict = {}
    tally = Tally()
    for a, b in (("good", "bad"), ("bad", "good")):
        v = asyncio.run(ask_edge(judge, "Q?", a, b, RUBRIC, SAMPLING, tally, form="single", memo=memo))
        assert v.winner == ("A" if a == "good" else "B")
    assert tally.calls == 2                                                   # the second edge reads the memo
    shown = single_messages("Q?", "good", RUBRIC, "Correct answer: X")[1].content
    assert shown.index("Attempt:") < shown.index("Reference notes") < shown.index("Criterion:")
